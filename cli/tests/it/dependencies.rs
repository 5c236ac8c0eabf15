//! The dependency boundary of vallumctl: building the client builds no server code. The
//! normal (non-dev) dependency tree of vallum-cli, as `cargo tree` prints it, holds none of
//! the daemon's crates: not vallum-server, not its SQLite driver (rusqlite, sqlx) and not its
//! metrics stack (opentelemetry*, prometheus).

use std::process::Command;

/// Crates (or name prefixes) only the daemon may need.
const SERVER_ONLY: &[&str] = &[
    "vallum-server",
    "rusqlite",
    "libsqlite3-sys",
    "sqlx",
    "opentelemetry",
    "prometheus",
    "mimalloc",
    "netlink-",
];

#[test]
fn vallum_cli_builds_no_server_code() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "vallum-cli",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo tree failed: {stderr}");
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    // The tree was read: the client's own crates are in it.
    for own in ["vallum-cli", "vallum-api", "vallum-proto", "tonic", "clap"] {
        assert!(crates.contains(&own), "{own} missing from:\n{tree}");
    }
    let server: Vec<&&str> = crates
        .iter()
        .filter(|c| SERVER_ONLY.iter().any(|s| c.starts_with(s)))
        .collect();
    assert!(
        server.is_empty(),
        "vallum-cli depends on server crates {server:?}:\n{tree}"
    );
}
