//! `vallumd`: parses the configuration, sets up logging and runs the server (see
//! `vallum_server::run`).
//!
//! Logging goes to stderr through `tracing`: one event per line with structured fields, in
//! the format of `--log-format` (`VALLUM_LOG_FORMAT`): `text` for people, `json` (one JSON
//! object a line: `timestamp`, `level`, `target`, `fields.message` and the event's other
//! fields) for log collectors in pods. `RUST_LOG` filters (tracing-subscriber's `EnvFilter`
//! directives, e.g. `info`, `vallum_server=debug`); the default is `info`. stdout is a small
//! machine interface and not a log: the lines `metrics on ADDR` and `listening on ADDR` at
//! start (scripts and tests read the bound ports from them) and the summary at exit; a stdout
//! that cannot be written (`/dev/full`, a closed pipe) is a warning in the log, never a stop.
//!
//! With `--otlp-endpoint` (cargo feature `otlp`) the same subscriber also exports the spans
//! of every call and commit phase over OTLP (`vallum_server::telemetry::metrics::traces`), whatever
//! `RUST_LOG` filters out of the log lines.

use clap::Parser;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};
use vallum_server::telemetry::metrics::traces::Traces;

/// mimalloc instead of glibc's malloc, keeping freed memory 10 s (see
/// `vallum_server::host::allocator`).
#[global_allocator]
static ALLOCATOR: vallum_server::host::allocator::MiMalloc =
    vallum_server::host::allocator::MiMalloc;

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

/// Installs the global subscriber: log lines on stderr in `format`, filtered by `RUST_LOG`
/// (default `info`), and the span exporter of `traces` (its own filter).
fn init_logging(format: LogFormat, traces: &Traces) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines.with_ansi(false).with_filter(filter).boxed(),
        LogFormat::Json => lines.json().with_filter(filter).boxed(),
    };
    tracing_subscriber::registry()
        .with(lines)
        .with(traces.layer())
        .init();
}

fn main() -> std::process::ExitCode {
    vallum_server::host::allocator::keep_freed_memory();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vallumd: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // The exporter's gRPC channel lives on the runtime; a bad endpoint is reported once the
    // log is set up.
    let traces = {
        let _rt = runtime.enter();
        Traces::new(&args.config.metrics)
    };
    init_logging(args.log_format, traces.as_ref().unwrap_or(&Traces::none()));
    let traces = match traces {
        Ok(t) => t,
        Err(e) => {
            let e = vallum_server::error::Error::from(e);
            tracing::error!(error = %e, "vallumd stopped");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(vallum_server::run(args.config));
    // The last spans leave before the runtime (and the exporter's channel) ends.
    if let Err(e) = traces.shutdown() {
        tracing::warn!(error = %e, "trace export shutdown failed");
    }
    match result {
        Ok(summary) => {
            // A stdout that cannot be written is logged, and the exit stays 0.
            vallum_server::server::stdout_line(format_args!("{}", summary.to_string().trim_end()));
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            // The error text ends with its reason code, e.g. `(TOKEN_FILE_EMPTY)`.
            tracing::error!(error = %e, "vallumd stopped");
            std::process::ExitCode::FAILURE
        }
    }
}
