//! The README's runnable blocks, run as a new user would run them: the Quick start's vallumd
//! (`vallumd --example --source synthetic`), then every line of "Walk-through with vallumctl"
//! and the first block of "Drop-in iptables", with `set -e` (a failing line fails the test).
//!
//! What the test does instead of the user: it has built the binaries (the blocks' `cargo
//! build` lines are skipped and `PATH` holds the test's target directory instead of
//! `target/release`), and it runs everything inside `unshare --mount --net` with a tmpfs on
//! /run, so the README's fixed ports (50051, 9464) and socket (/run/vallum/vallumd.sock) are
//! this test's own whatever else runs on the machine; vallumd's database goes to a temporary
//! directory instead of ./vallum.db. The one walk-through line that blocks until Ctrl-C
//! (`vallumctl watch`) is left out.

use crate::support;

use std::path::Path;
use std::process::Command;

/// The lines of the first ```sh block after `heading` in `text`.
fn sh_block<'t>(text: &'t str, heading: &str) -> Vec<&'t str> {
    text.split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("README has no {heading:?}"))
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no sh block after {heading:?}"))
        .lines()
        .collect()
}

/// Whether a line is one the test does itself (builds, `PATH` to target/release).
fn done_by_the_test(line: &str) -> bool {
    line.starts_with("cargo ") || line.starts_with("export PATH=\"$PWD/target/release")
}

#[test]
#[ignore = "needs root (unshare --mount --net for the README's fixed ports and socket) and ip"]
fn readme_quick_start_walk_through_and_drop_in_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().display().to_string();

    // Its two commands: `cargo run ... --bin vallumd -- ARGS` (run here as the built vallumd
    // with ARGS) and `cargo test --workspace`.
    let block = sh_block(&readme, "## Quick start");
    assert_eq!(block.len(), 2, "Quick start has two commands: {block:?}");
    assert!(block[1].starts_with("cargo test --workspace"), "{block:?}");
    let args = block[0]
        .strip_prefix("cargo run --release -p vallum-server --bin vallumd -- ")
        .unwrap_or_else(|| panic!("Quick start runs vallumd: {block:?}"));
    let vallumd_line = format!("vallumd {args}");
    let quick = [vallumd_line.as_str()];

    let walk: Vec<&str> = sh_block(&readme, "## Walk-through with vallumctl")
        .into_iter()
        .filter(|l| !l.contains("(Ctrl-C)"))
        .collect();
    assert!(walk.len() > 20, "{walk:?}");

    // The drop-in block links the vallum-iptables of the target directory.
    let iptables = support::vallumctl().with_file_name("vallum-iptables");
    if !iptables.exists() {
        let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args([
                "build",
                "--quiet",
                "-p",
                "vallum-cli",
                "--bin",
                "vallum-iptables",
            ])
            .current_dir(&root)
            .status()
            .expect("cargo build");
        assert!(status.success(), "cargo build vallum-iptables");
    }
    let drop_in: Vec<String> = sh_block(&readme, "## Drop-in iptables")
        .into_iter()
        .filter(|l| !done_by_the_test(l))
        .map(|l| {
            l.replace(
                "$PWD/target/debug/vallum-iptables",
                &iptables.display().to_string(),
            )
        })
        .collect();
    assert!(
        drop_in.iter().any(|l| l.starts_with("iptables-save")),
        "{drop_in:?}"
    );

    let bin = Path::new(env!("CARGO_BIN_EXE_vallumd"))
        .parent()
        .expect("bin dir")
        .display()
        .to_string();
    let ctl = support::vallumctl()
        .parent()
        .expect("vallumctl dir")
        .display()
        .to_string();
    let script = format!(
        "set -e\n\
         mount -t tmpfs tmpfs /run\n\
         ip link set lo up\n\
         export PATH='{bin}':'{ctl}':\"$PATH\" HOME='{tmp}'\n\
         unset VALLUM_SERVER VALLUM_TOKEN VALLUM_TOKEN_FILE VALLUM_RULESET VALLUM_DB\n\
         (cd '{tmp}' && exec {vallumd}) >'{tmp}/vallumd.log' 2>&1 &\n\
         VALLUMD=$!\n\
         trap 'kill $VALLUMD 2>/dev/null' EXIT\n\
         set -x\n\
         {walk}\n\
         echo '@@drop-in'\n\
         {drop_in}\n",
        vallumd = quick[0],
        walk = walk.join("\n"),
        drop_in = drop_in.join("\n"),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--net", "sh", "-c", &script])
        .current_dir(&root)
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(dir.path().join("vallumd.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "the README's blocks failed ({}):\n{stderr}\nstdout:\n{stdout}\nvallumd:\n{log}",
        out.status
    );
    // What the blocks say they print: the walk-through's status and export, the drop-in's save.
    assert!(stdout.contains("host-firewall"), "{stdout}");
    assert!(stdout.contains("*filter"), "{stdout}");
    let saved = stdout.split("@@drop-in").nth(1).unwrap_or_default();
    assert!(
        saved.contains("-A SSH -s 10.0.0.0/8 -p tcp -m tcp --dport 22 -j ACCEPT")
            && saved.contains(":INPUT DROP"),
        "iptables-save after the drop-in script:\n{saved}"
    );
}
