//! Shell completions and man pages generated from vallumctl's clap definitions (`vallumctl
//! completions SHELL`, `vallumctl man [--dir DIR]`): they are produced for every shell clap
//! knows, name the subcommands and flags the parser accepts, and a bash script parses with
//! `bash -n`. Runs in `cargo test`, so CI generates them on every run.

use std::process::{Command, Output};

fn vallumctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vallumctl"))
        .args(args)
        .env_remove("VALLUM_OUTPUT")
        // A server setting meant for something else does not break a local command.
        .env("VALLUM_SERVER", "not a url")
        .output()
        .expect("run vallumctl")
}

fn stdout(args: &[&str]) -> String {
    let out = vallumctl(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn completions_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let s = stdout(&["completions", shell]);
        for word in [
            "apply",
            "conntrack",
            "token-file",
            "dry-run",
            "line-numbers",
        ] {
            assert!(s.contains(word), "{shell} completions lack {word}");
        }
    }
    let out = vallumctl(&["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn bash_completion_parses() {
    let script = stdout(&["completions", "bash"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("vallumctl.bash");
    std::fs::write(&path, script).expect("write the script");
    let out = Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("run bash -n");
    assert!(
        out.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn man_pages() {
    let page = stdout(&["man"]);
    assert!(page.contains(".TH vallumctl 1"), "{page}");
    assert!(
        page.contains("token\\-file"),
        "the connection flags are documented"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().to_str().expect("UTF-8 temp dir");
    let json = stdout(&["-o", "json", "man", "--dir", d]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let pages: Vec<&str> = v["pages"]
        .as_array()
        .expect("pages")
        .iter()
        .filter_map(|p| p.as_str())
        .collect();
    for want in [
        "vallumctl.1",
        "vallumctl-apply.1",
        "vallumctl-set-add.1",
        "vallumctl-fleet-status.1",
        "vallumctl-dataplane-install.1",
    ] {
        assert!(pages.contains(&want), "{want} missing from {pages:?}");
    }
    assert!(
        !pages.iter().any(|p| p.contains("-help")),
        "no pages for help subcommands: {pages:?}"
    );
    let apply = std::fs::read_to_string(dir.path().join("vallumctl-apply.1")).expect("apply page");
    assert!(apply.contains("dry\\-run"), "{apply}");
    assert!(
        apply.contains("server"),
        "remote commands document --server"
    );
    let install =
        std::fs::read_to_string(dir.path().join("vallumctl-dataplane-install.1")).expect("page");
    assert!(
        !install.contains("token\\-file"),
        "local commands do not list the connection flags:\n{install}"
    );
}
