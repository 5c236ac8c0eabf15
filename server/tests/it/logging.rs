//! vallumd's log: `--log-format json` writes one JSON object per stderr line with the
//! fields log collectors read, and `text` keeps the startup events readable; stdout keeps
//! its `metrics on ADDR` / `listening on ADDR` / `serving` lines in both.

use std::process::Stdio;

use serde_json::Value;

/// Runs vallumd with `args` until it exits by itself; returns (exit code, stdout, stderr).
fn vallumd(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");
    let out = crate::support::command()
        .args(["--cores", "1", "--db"])
        .arg(&db)
        .args(args)
        .env_remove("VALLUM_LOG_FORMAT")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run vallumd");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every stderr line is a JSON object with `timestamp`, `level`, `target` and
/// `fields.message`; the startup events carry the bound address as a field, and it is the one
/// stdout names.
#[test]
fn json_logs_are_one_object_a_line() {
    let (code, stdout, stderr) = vallumd(&["--log-format", "json", "--exit-after", "0.5"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let events: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l:?}")))
        .collect();
    for e in &events {
        assert!(e["timestamp"].is_string(), "{e}");
        assert!(e["level"].is_string(), "{e}");
        assert!(e["target"].is_string(), "{e}");
        assert!(e["fields"]["message"].is_string(), "{e}");
    }
    let listening = events
        .iter()
        .find(|e| e["fields"]["message"] == "listening")
        .unwrap_or_else(|| panic!("no `listening` event in {stderr}"));
    assert_eq!(listening["level"], "INFO");
    let addr = listening["fields"]["addr"].as_str().expect("addr field");
    assert!(
        stdout.lines().any(|l| l == format!("listening on {addr}")),
        "stdout {stdout:?} does not name {addr}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["fields"]["message"] == "metrics on" && e["fields"]["addr"].is_string()),
        "{stderr}"
    );
}

/// A start that fails logs one ERROR event with the error's text (ending in its reason code) (JSON through the
/// environment twin of the flag).
#[test]
fn a_failed_start_is_one_error_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# no token\n").expect("write");
    let tokens = tokens.display().to_string();
    let (code, _, stderr) = vallumd(
        &["--token-file", &tokens, "--exit-after", "30"],
        &[("VALLUM_LOG_FORMAT", "json")],
    );
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .filter(|e| e["level"] == "ERROR")
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let fields = &errors[0]["fields"];
    assert_eq!(fields["message"], "vallumd stopped");
    assert!(
        fields["error"]
            .as_str()
            .is_some_and(|e| e.contains(&tokens) && e.ends_with("(TOKEN_FILE_EMPTY)")),
        "{stderr}"
    );
}

/// The text format keeps the events readable, and `RUST_LOG` filters them.
#[test]
fn text_logs_and_rust_log() {
    let (code, stdout, stderr) = vallumd(&["--exit-after", "0.5"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("metrics on "), "{stdout}");
    // `serving` follows the listeners (the stored state loaded, the sources bound).
    let lines: Vec<&str> = stdout.lines().collect();
    let listening = lines.iter().position(|l| l.starts_with("listening on "));
    let serving = lines.iter().position(|l| *l == "serving");
    assert!(
        matches!((listening, serving), (Some(l), Some(s)) if l < s),
        "{stdout}"
    );
    let line = stderr
        .lines()
        .find(|l| l.contains("listening"))
        .unwrap_or_else(|| panic!("no listening event in {stderr:?}"));
    assert!(line.contains(" INFO ") && line.contains("addr="), "{line}");
    let (code, _, stderr) = vallumd(&["--exit-after", "0.5"], &[("RUST_LOG", "warn")]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("listening"), "{stderr}");
}
