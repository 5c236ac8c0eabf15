//! What `vallumd` does at start when its configuration or its stored state is wrong: it says
//! where, never shows a secret, and never runs open.

#[path = "support/vallumd.rs"]
mod support;

use std::process::{Command, Stdio};

/// Runs vallumd with `args` (it must exit by itself) and returns (exit code, stderr).
fn vallumd_exits(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vallumd"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--cores", "1"])
        .args(args)
        .env_remove("VALLUM_DB")
        .stdin(Stdio::null())
        .output()
        .expect("run vallumd");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A token-file line in the wrong order (`TOKEN ROLE`) stops vallumd with the file, line and
/// field, and the token appears nowhere in what it prints.
#[test]
fn malformed_token_file_never_prints_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = "07d1c24b9f6a4e1d8c3b2a1f0e9d8c7b";
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("# tokens\n{secret} admin alice\n")).expect("write");
    let db = dir.path().join("v.db");
    let (code, stderr) = vallumd_exits(&[
        "--db",
        &db.display().to_string(),
        "--token-file",
        &tokens.display().to_string(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    let want = format!("{}:2: field 1 (ROLE)", tokens.display());
    assert!(stderr.contains(&want), "{stderr}");
    assert!(!stderr.contains(&secret[..8]), "token printed: {stderr}");
}
