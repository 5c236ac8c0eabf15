//! vallumctl: the command-line client of Vallum's gRPC API.
//!
//! Every flag has a `VALLUM_*` environment twin; `--output json` prints one JSON document (or,
//! for `watch`, one per line), and errors as one JSON object on stderr (usage errors too).
//! Exit codes are in [`error`]: 0 ok, 1 rejected, 2 usage, 3 server unavailable.
//!
//! One module per subcommand family:
//!
//! | module | subcommands |
//! |---|---|
//! | [`rulesets`] | `validate`, `stage`, `commit`, `confirm`, `apply`, `rollback`, `revisions`, `diff`, `export`, `watch`, `rulesets`, `delete` |
//! | [`counters`] | `counters` |
//! | [`trace`] | `trace`, `replay`, `monitor` |
//! | [`shadow`] | `shadow RULESET/N --for D`, `shadow report`, `shadow end` |
//! | [`conntrack`] | `conntrack list/delete/flush/stats` |
//! | [`sets`] | `set ...` (ipset's words) |
//! | [`fleet`] | `fleet ...` |
//! | [`dataplane`] | `dataplane install/uninstall/status` (local: runs iptables) |
//! | [`docs`] | `completions SHELL`, `man` (local) |
//!
//! Beside them: [`connect`] (the connection flags and clients), [`args`] (shared argument
//! parsers), [`input`] (files and `-` for stdin), [`output`] (`-o text|json`), [`view`] (how
//! results print), [`error`] (errors, exit codes, error reports).

mod args;
mod connect;
mod conntrack;
mod counters;
mod dataplane;
mod docs;
mod error;
mod fleet;
mod input;
mod output;
mod pages;
mod rulesets;
mod sets;
mod shadow;
mod socket;
mod trace;
mod view;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use serde_json::json;
use vallum_proto::v1::GetStatusRequest;

use crate::error::{CliError, ClientReason, EXIT_OK};
use crate::output::{Output, print, write_stdout};

/// Command-line client of the Vallum firewall service.
#[derive(Debug, Parser)]
#[command(
    name = "vallumctl",
    version,
    about = "Command-line client of vallumd, the Vallum firewall service"
)]
struct Cli {
    #[command(flatten)]
    connection: connect::Connection,
    /// Output format.
    #[arg(long, short = 'o', global = true, env = "VALLUM_OUTPUT", value_enum, default_value_t = Output::Text)]
    output: Output,
    /// The largest file (or standard input) a command reads, in bytes: a larger one is refused
    /// by its size before it is read (exit 1).
    #[arg(long, global = true, env = "VALLUM_MAX_FILE_BYTES", value_name = "BYTES", default_value_t = input::DEFAULT_MAX_FILE_BYTES)]
    max_file_bytes: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Rulesets(rulesets::RulesetCommand),
    /// Per-rule counters, laid out like `iptables -L -v -x -n`.
    Counters(counters::CountersArgs),
    /// The verdict and rule path of one packet.
    Trace(trace::TraceArgs),
    /// Replay a pcap/pcapng file against the active rulesets (and a staged revision).
    Replay(trace::ReplayArgs),
    /// Stream packet events as they happen: `-j LOG` hits (text: the kernel's LOG line, as
    /// `dmesg` shows it, after the rule) and, with `--sample-drops N`, one in N dropped
    /// packets (the server raises N to at least 100 and caps samples at 100 a second), like
    /// `cilium monitor -t drop`. Ends on Ctrl-C.
    Monitor(trace::MonitorArgs),
    /// Shadow the active revision with a stored one on live traffic (`shadow web/7 --for
    /// 10m`), then `shadow report web`: what it would have changed, flow by flow; `shadow
    /// end web` stops it.
    Shadow(shadow::ShadowArgs),
    /// Engine status: cores, active revisions, barrier strategy.
    Status,
    /// The connection table: list, delete, flush, stats (as conntrack-tools' `conntrack`).
    Conntrack {
        #[command(subcommand)]
        cmd: conntrack::ConntrackCmd,
    },
    /// ipset-style sets: create, add, del, list, show, flush, swap, destroy, import, save.
    Set {
        #[command(subcommand)]
        command: sets::SetCommand,
    },
    /// Fleet mode (a vallumd with --fleet-endpoints): apply, status, list, delete, nodes.
    Fleet {
        #[command(subcommand)]
        command: fleet::FleetCommand,
    },
    /// NFQUEUE steering rules of the current network namespace (runs iptables locally; no
    /// server).
    Dataplane {
        #[command(subcommand)]
        command: dataplane::DataplaneCommand,
    },
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell); no server.
    Completions(docs::CompletionsArgs),
    /// Print the man page (roff), or write one per subcommand with --dir; no server.
    Man(docs::ManArgs),
}

/// The subcommands that run locally: they make no call, so their help does not list the
/// connection flags ([`command`]).
const LOCAL: [&str; 3] = ["dataplane", "completions", "man"];

impl Command {
    /// Whether the command runs locally (one of [`LOCAL`]).
    fn is_local(&self) -> bool {
        matches!(
            self,
            Command::Dataplane { .. } | Command::Completions(_) | Command::Man(_)
        )
    }

    /// Whether the command may change state on the server (`set` and `conntrack` count as
    /// changing).
    fn changes(&self) -> bool {
        match self {
            Command::Rulesets(r) => r.changes(),
            Command::Counters(c) => c.zero,
            Command::Shadow(a) => !matches!(a.command, Some(shadow::ShadowCommand::Report { .. })),
            Command::Fleet { command } => command.changes(),
            Command::Conntrack { .. } | Command::Set { .. } => true,
            Command::Trace(_)
            | Command::Replay(_)
            | Command::Monitor(_)
            | Command::Status
            | Command::Dataplane { .. }
            | Command::Completions(_)
            | Command::Man(_) => false,
        }
    }

    /// The local files the command reads (not standard input's `-`), checked before it
    /// connects ([`input::check_size`]).
    fn input_files(&self) -> Vec<&std::path::Path> {
        use fleet::FleetCommand as F;
        use rulesets::RulesetCommand as R;
        use sets::SetCommand as S;
        match self {
            Command::Rulesets(
                R::Validate { file, source, .. }
                | R::Stage { file, source, .. }
                | R::Apply { file, source, .. },
            ) => std::iter::once(file.as_path())
                .chain(source.v6.as_deref())
                .collect(),
            Command::Fleet {
                command: F::Apply { file, .. } | F::Rollout { file, .. },
            } => vec![file.as_path()],
            Command::Set {
                command: S::Add { file, .. } | S::Del { file, .. },
            } => file.as_deref().into_iter().collect(),
            Command::Set {
                command: S::Import { file },
            } => vec![file.as_path()],
            Command::Replay(a) => vec![a.pcap.as_path()],
            _ => Vec::new(),
        }
    }

    /// Whether the command streams or waits without end, so `--timeout` does not apply.
    fn streams(&self) -> bool {
        match self {
            Command::Rulesets(r) => r.streams(),
            Command::Fleet {
                command: fleet::FleetCommand::Wait { .. } | fleet::FleetCommand::Rollout { .. },
            } => true,
            Command::Monitor(_) => true,
            _ => false,
        }
    }
}

/// vallumctl's clap command: the derive's, with the connection flags hidden in the help,
/// completions and man pages of the [`LOCAL`] subcommands and theirs. They stay accepted there
/// (a `--server` before the subcommand, or in an environment that sets it, does not break a
/// local command): each local subcommand gets a hidden copy of them without the `VALLUM_*`
/// environment twin, so the global one is not propagated into its help.
fn command() -> clap::Command {
    let hidden: Vec<clap::Arg> =
        <connect::Connection as clap::Args>::augment_args(clap::Command::new("connection"))
            .get_arguments()
            .map(|a| a.clone().global(false).hide(true).env(None))
            .collect();
    fn hide(mut sc: clap::Command, hidden: &[clap::Arg]) -> clap::Command {
        sc = sc.args(hidden.iter().cloned());
        let subs: Vec<String> = sc
            .get_subcommands()
            .map(|s| s.get_name().to_owned())
            .collect();
        for name in subs {
            sc = sc.mut_subcommand(name, |s| hide(s, hidden));
        }
        sc
    }
    let mut cmd = Cli::command();
    for name in LOCAL {
        cmd = cmd.mut_subcommand(name, |sc| hide(sc, &hidden));
    }
    cmd
}

/// `cmd` without the `help` subcommands (for man pages: `vallumctl-set-help.1` is no page).
fn without_help_subcommands(cmd: clap::Command) -> clap::Command {
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    let mut cmd = cmd.disable_help_subcommand(true);
    for name in subs {
        cmd = cmd.mut_subcommand(name, without_help_subcommands);
    }
    cmd
}

async fn run(cli: &Cli) -> Result<(), CliError> {
    let out = cli.output;
    match &cli.command {
        Command::Dataplane { command } => {
            let (json, text) = dataplane::run(command)?;
            return print(out, json, || text);
        }
        Command::Completions(a) => {
            write_stdout(&docs::completions(command(), a.shell));
            return Ok(());
        }
        Command::Man(a) => {
            return match &a.dir {
                Some(dir) => {
                    let (json, text) = docs::man_pages(without_help_subcommands(command()), dir)?;
                    print(out, json, || text)
                }
                None => {
                    let page = docs::man_page(command())?;
                    print(out, json!({"page": page}), || page.clone())
                }
            };
        }
        _ => {}
    }
    for f in cli.command.input_files() {
        input::check_size(f)?;
    }
    let mut c = cli.connection.connect(!cli.command.streams()).await?;
    match &cli.command {
        Command::Rulesets(cmd) => rulesets::run(&mut c.rulesets, out, cmd).await?,
        Command::Counters(a) => counters::run(&mut c.counters, out, a).await?,
        Command::Shadow(a) => shadow::run(&mut c.rulesets, out, a).await?,
        Command::Trace(t) => trace::trace(&mut c.trace, out, t).await?,
        Command::Replay(a) => trace::replay(&mut c.trace, out, a).await?,
        Command::Monitor(a) => trace::monitor(&mut c.trace, out, a).await?,
        Command::Status => {
            let r = c.engine.get_status(GetStatusRequest {}).await?.into_inner();
            print(out, view::status_json(&r), || view::status_text(&r))?;
        }
        Command::Conntrack { cmd } => conntrack::run(&mut c.conntrack, cmd, out).await?,
        Command::Set { command } => sets::run(&mut c.sets, out, command).await?,
        Command::Fleet { command } => {
            fleet::run(&mut c.fleet, out, command, cli.connection.timeout).await?
        }
        // Handled above, before connecting.
        Command::Dataplane { .. } | Command::Completions(_) | Command::Man(_) => {}
    }
    Ok(())
}

/// Prints an error to stderr: one line per violation not in the headline (as
/// `FILE:LINE:COL: message` when the error is about a local file), then `vallumctl: HEADLINE`;
/// with `-o json` one JSON object ([`error::Report::json`]).
fn report(e: &CliError, cli: &Cli) {
    let r = e.report(error::Context {
        server: &cli.connection.server,
        timeout: (!cli.command.streams() && !cli.command.is_local())
            .then_some(cli.connection.timeout),
        changes: cli.command.changes(),
    });
    match cli.output {
        Output::Json => eprintln!("{}", r.json()),
        Output::Text => {
            for l in &r.lines {
                eprintln!("{l}");
            }
            if !matches!(e, CliError::Invalid) || r.lines.is_empty() {
                eprintln!("vallumctl: {}", r.headline);
            }
        }
    }
}

/// Prints a clap error: help and version to stdout; a usage error to stderr as clap words it,
/// or with `-o json` (or `VALLUM_OUTPUT=json`) as the JSON error object with reason `USAGE`.
/// Returns the exit code.
fn report_usage(e: &clap::Error) -> u8 {
    if !e.use_stderr() {
        let _ = e.print();
        return EXIT_OK;
    }
    let usage = ClientReason::Usage.info();
    if wants_json() {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or_default();
        let message = first.strip_prefix("error: ").unwrap_or(first);
        eprintln!(
            "{}",
            json!({
                "error": message,
                "exit_code": usage.exit_code,
                "violations": [],
                "reason": usage.name,
                "detail": text,
            })
        );
    } else {
        let _ = e.print();
    }
    usage.exit_code
}

/// Whether the command line (or `VALLUM_OUTPUT`) asks for `-o json`, read as far as it parses.
fn wants_json() -> bool {
    command()
        .ignore_errors(true)
        .try_get_matches()
        .ok()
        .and_then(|m| m.get_one::<Output>("output").copied())
        == Some(Output::Json)
}

/// The command line parsed with [`command`].
fn parse() -> Result<Cli, clap::Error> {
    let mut matches = command().try_get_matches()?;
    Cli::from_arg_matches_mut(&mut matches)
}

fn main() -> ExitCode {
    let mut cli = match parse() {
        Ok(c) => c,
        Err(e) => return ExitCode::from(report_usage(&e)),
    };
    cli.connection.resolve();
    input::set_max_file_bytes(cli.max_file_bytes);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vallumctl: cannot start the runtime: {e}");
            return ExitCode::from(ClientReason::Local.info().exit_code);
        }
    };
    match rt.block_on(run(&cli)) {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(e) => {
            let server = &cli.connection.server;
            let e = match e {
                e if error::maybe_tls_peer(&e) && rt.block_on(cli.connection.speaks_tls()) => {
                    CliError::Connect {
                        server: server.clone(),
                        message: format!(
                            "the server speaks TLS; use {}",
                            server.replacen("http://", "https://", 1)
                        ),
                    }
                }
                e => match error::http_not_grpc(&e) {
                    Some(http) => CliError::Connect {
                        server: server.clone(),
                        message: format!(
                            "it answered HTTP {http} without a gRPC status: this is not \
                             vallumd's gRPC port (the metrics port, 9464 by default, serves only \
                             HTTP; the gRPC API listens on vallumd's --listen, \
                             127.0.0.1:50051 by default)"
                        ),
                    },
                    None => e,
                },
            };
            report(&e, &cli);
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
        command().debug_assert();
    }

    /// The help of `cmd ... --help`, as clap renders it.
    fn help(path: &[&str]) -> String {
        let mut cmd = command();
        cmd.build();
        let mut sc = &mut cmd;
        for p in path {
            sc = sc
                .find_subcommand_mut(p)
                .unwrap_or_else(|| panic!("no {p}"));
        }
        sc.render_long_help().to_string()
    }

    #[test]
    fn local_subcommands_do_not_list_the_connection_flags() {
        for path in [
            &["dataplane"][..],
            &["dataplane", "install"],
            &["completions"],
            &["man"],
        ] {
            let h = help(path);
            for flag in ["--server", "--token", "--token-file", "--ca", "--timeout"] {
                assert!(!h.contains(flag), "{path:?} lists {flag}:\n{h}");
            }
            assert!(h.contains("--output"), "{path:?}:\n{h}");
        }
        for path in [
            &["apply"][..],
            &["status"],
            &["set", "add"],
            &["fleet", "status"],
        ] {
            let h = help(path);
            for flag in ["--server", "--token-file", "--timeout"] {
                assert!(h.contains(flag), "{path:?} does not list {flag}:\n{h}");
            }
        }
        // Still accepted (an environment with VALLUM_SERVER set, or the flag before the
        // subcommand, must not break a local command).
        let m = command().try_get_matches_from(["vallumctl", "--server", "http://h:1", "man"]);
        assert!(m.is_ok(), "{m:?}");
    }

    #[test]
    fn local_commands_are_the_local_list() {
        let cmd = command();
        for sc in cmd.get_subcommands() {
            let name = sc.get_name();
            if name == "help" {
                continue;
            }
            let mut argv = vec!["vallumctl", name];
            // Enough arguments for each to parse.
            argv.extend(match name {
                "dataplane" => &["status"][..],
                "completions" => &["bash"],
                _ => &[],
            });
            let Ok(mut m) = command().try_get_matches_from(&argv) else {
                continue;
            };
            let Ok(cli) = Cli::from_arg_matches_mut(&mut m) else {
                continue;
            };
            assert_eq!(cli.command.is_local(), LOCAL.contains(&name), "{name}");
        }
    }
}
