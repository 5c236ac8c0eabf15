//! `vallumctl completions SHELL` and `vallumctl man [--dir DIR]`: shell completions
//! (clap_complete) and man pages (clap_mangen) generated from the same clap definitions the
//! parser uses, so they list exactly the subcommands and flags vallumctl accepts. Both run
//! locally (no server).

use std::path::{Path, PathBuf};

use clap_complete::Shell;
use serde_json::{Value, json};

use crate::error::CliError;

/// Flags of `completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for, e.g. `vallumctl completions bash >
    /// /etc/bash_completion.d/vallumctl`.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Flags of `man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write vallumctl.1 and one page per subcommand (vallumctl-apply.1, vallumctl-set-add.1,
    /// ...) into this directory instead of printing vallumctl.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The completion script of `shell` for `cmd`.
pub fn completions(mut cmd: clap::Command, shell: Shell) -> String {
    let mut buf = Vec::new();
    let name = cmd.get_name().to_owned();
    clap_complete::generate(shell, &mut cmd, name, &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The man page of `cmd` (roff), without pages of its subcommands.
pub fn man_page(cmd: clap::Command) -> Result<String, CliError> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut buf)
        .map_err(|e| CliError::Output(format!("man page: {e}")))?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Writes the page of `cmd` and of every subcommand into `dir` (created if missing); returns
/// the JSON and text of what was written.
pub fn man_pages(cmd: clap::Command, dir: &Path) -> Result<(Value, String), CliError> {
    let fail = |e: std::io::Error| CliError::Output(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    clap_mangen::generate_to(cmd, dir).map_err(fail)?;
    let mut pages: Vec<String> = std::fs::read_dir(dir)
        .map_err(fail)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("vallumctl") && n.ends_with(".1"))
        .collect();
    pages.sort();
    let text = format!("wrote {} man pages to {}\n", pages.len(), dir.display());
    Ok((
        json!({"dir": dir.display().to_string(), "pages": pages}),
        text,
    ))
}
