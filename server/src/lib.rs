//! Vallum's firewall-management service: rulesets stored in SQLite, validated, staged and
//! committed atomically to the engine, plus the packet sources that feed the engine's workers.
//!
//! Layout (docs/architecture.md walks a commit and a packet through it):
//! - [`grpc`]: the edge. The gRPC services, proto <-> domain conversion, authentication, limits,
//!   connection caps and TLS;
//! - [`control`]: the control plane. The commit pipeline, the SQLite store, a revision's
//!   canonical content, commit outcomes, the hooks the plumbing plugs into, fleet mode;
//! - [`host`]: the Linux adapters. Packet sources (NFQUEUE, pcap), rtnetlink (routes, local
//!   addresses), the kernel's own tables (`iptables-restore`), steering, /proc readers, the
//!   local unix socket, the allocator, NSS owner names, the connection table across a restart;
//! - [`telemetry`]: metrics (OpenTelemetry -> Prometheus `/metrics`, OTLP traces) and packet
//!   events;
//! - [`clock`]: the one monotonic and wall clock, injected (tests drive a manual one);
//! - [`config`]: flags and their `VALLUM_*` env twins; [`error`]: errors and their gRPC
//!   statuses; [`server`]: wiring, [`run`].
//!
//! Binary: `vallumd` (the daemon). The command-line client `vallumctl` is its own package,
//! `vallum-cli` (`cli/`), which shares only `vallum-proto` and `vallum-api` (the error table,
//! re-exported by [`error`], and the TLS client config, by [`grpc::tls`]) with this crate.

pub mod clock;
pub mod config;
pub mod control;
pub mod error;
pub mod grpc;
pub mod host;
pub mod server;
pub mod telemetry;

pub use config::Config;
pub use error::{Error, Reason};
pub use server::{Summary, run};

/// The layout as docs/architecture.md describes it, checked.
#[cfg(test)]
mod layout {
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root")
            .to_path_buf()
    }

    /// Every `.rs` file under `dir`.
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read server/src") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every path docs/architecture.md names in backquotes (a word with a `/` made of path
    /// characters) exists in the workspace.
    #[test]
    fn architecture_doc_paths_exist() {
        let root = root();
        let doc = std::fs::read_to_string(root.join("docs/architecture.md"))
            .expect("docs/architecture.md");
        let is_path = |w: &str| {
            w.contains('/')
                && !w.starts_with('/')
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
        };
        let named: Vec<&str> = doc
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| is_path(w))
            .collect();
        let missing: Vec<&&str> = named.iter().filter(|p| !root.join(p).exists()).collect();
        assert!(
            missing.is_empty(),
            "docs/architecture.md names paths that do not exist: {missing:?}"
        );
        // The layout table and the commit walk name most files of server/src.
        assert!(named.len() > 60, "only {} paths named", named.len());
    }

    /// `server/src` has at most eight top-level modules, and docs/architecture.md names each.
    #[test]
    fn at_most_eight_top_level_modules() {
        let lib = include_str!("lib.rs");
        let doc = std::fs::read_to_string(root().join("docs/architecture.md"))
            .expect("docs/architecture.md");
        let modules: Vec<&str> = lib
            .lines()
            .filter_map(|l| {
                l.strip_prefix("pub mod ")
                    .or_else(|| l.strip_prefix("mod "))
            })
            .filter_map(|l| l.strip_suffix(';'))
            .collect();
        assert!(modules.len() >= 7, "modules: {modules:?}");
        assert!(
            modules.len() <= 8,
            "over eight top-level modules: {modules:?}"
        );
        for m in &modules {
            assert!(
                doc.contains(&format!("`server/src/{m}.rs`")),
                "docs/architecture.md does not name server/src/{m}.rs"
            );
        }
    }

    /// No file of `server/src` is over 1,200 lines, unless it is a `tests.rs` or its first
    /// lines say why it is ("over 1,200 lines").
    #[test]
    fn no_file_over_1200_lines() {
        let mut files = Vec::new();
        rust_files(&root().join("server/src"), &mut files);
        assert!(files.len() > 50, "only {} files", files.len());
        let long: Vec<(PathBuf, usize)> = files
            .into_iter()
            .filter(|p| !p.ends_with("tests.rs"))
            .filter_map(|p| {
                let text = std::fs::read_to_string(&p).expect("read a source file");
                let lines = text.lines().count();
                let says_why = text
                    .lines()
                    .take(30)
                    .any(|l| l.to_lowercase().contains("over 1,200 lines"));
                (lines > 1200 && !says_why).then_some((p, lines))
            })
            .collect();
        assert!(long.is_empty(), "files over 1,200 lines: {long:?}");
    }
}
