//! Writing results: `-o text|json` ([`Output`]), [`print()`] and [`write_stdout`].

use clap::ValueEnum;
use serde_json::Value;

use crate::error::{CliError, EXIT_OK};

/// `--output`: text for people, one JSON document for programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Text laid out like the tool the command mirrors (iptables, ipset, conntrack).
    Text,
    /// One JSON document (for `watch`, one per line).
    Json,
}

/// Prints `json` (pretty) or the text `text` makes, as `output` asks.
pub fn print(output: Output, json: Value, text: impl FnOnce() -> String) -> Result<(), CliError> {
    match output {
        Output::Json => {
            let s =
                serde_json::to_string_pretty(&json).map_err(|e| CliError::Output(e.to_string()))?;
            write_stdout(&format!("{s}\n"));
        }
        Output::Text => write_stdout(&text()),
    }
    Ok(())
}

/// Writes to stdout. A closed pipe (`vallumctl ... | head`) ends the program quietly with
/// status 0, as Unix tools do, instead of `print!`'s panic.
pub fn write_stdout(s: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(s.as_bytes()).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(i32::from(EXIT_OK));
        }
        eprintln!("vallumctl: cannot write to stdout: {e}");
    }
}
