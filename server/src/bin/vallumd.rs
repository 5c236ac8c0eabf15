//! `vallumd`: parses the configuration, sets up logging and runs the server (see
//! `vallum_server::run`).
//!
//! Logging goes to stderr through `tracing`: one event per line with structured fields, in
//! the format of `--log-format` (`VALLUM_LOG_FORMAT`): `text` for people, `json` (one JSON
//! object a line: `timestamp`, `level`, `target`, `fields.message` and the event's other
//! fields) for log collectors in pods. `RUST_LOG` filters (tracing-subscriber's `EnvFilter`
//! directives, e.g. `info`, `vallum_server=debug`); the default is `info`. stdout is a small
//! machine interface and not a log: the lines `metrics on ADDR` and `listening on ADDR` at
//! start (scripts and tests read the bound ports from them) and the summary at exit.

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc, keeping freed memory 10 s (see
/// `vallum_server::allocator`).
#[global_allocator]
static ALLOCATOR: vallum_server::allocator::MiMalloc = vallum_server::allocator::MiMalloc;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// `TIMESTAMP LEVEL TARGET: MESSAGE key=value ...`.
    Text,
    /// One JSON object a line.
    Json,
}

/// vallumd's flags: the server's [`vallum_server::Config`] and the logging flag.
#[derive(Debug, Parser)]
#[command(name = "vallumd", version, about = "Vallum firewall-management daemon")]
struct Args {
    #[command(flatten)]
    config: vallum_server::Config,
    /// Log line format on stderr: `text`, or `json` (one object a line). `RUST_LOG` filters
    /// (default `info`).
    #[arg(long, env = "VALLUM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// Installs the global subscriber: stderr, `RUST_LOG` (default `info`), `format`.
fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(false).init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    vallum_server::allocator::keep_freed_memory();
    let args = Args::parse();
    init_logging(args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(vallum_server::run(args.config)) {
        Ok(summary) => {
            print!("{summary}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            // The error text ends with its reason code, e.g. `(TOKEN_FILE_EMPTY)`.
            tracing::error!(error = %e, "vallumd stopped");
            std::process::ExitCode::FAILURE
        }
    }
}
