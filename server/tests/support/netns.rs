//! Helpers of the namespace tests (corpus, physdev_bridge, nfqueue, nfqueue_overload, coexist,
//! kernel_tables): run a command, run one inside a network namespace (`ip netns exec`),
//! optionally with stdin — each returns the command's stdout, or an error naming the command
//! and its stderr —, run a closure on a thread inside a namespace ([`in_netns`]), and find a
//! tool on PATH for the SKIP checks. Plain `std::process` (no crate: the tests shell out to
//! `ip`, `iptables-legacy-restore` and the like, which is what they check).

#![allow(dead_code)] // Each test uses a different part.

use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

/// Whether `tool` is an executable file in a directory of PATH.
pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Runs `f` on a new thread inside network namespace `name` (`/run/netns/NAME`) and returns
/// its result; a panic in `f` propagates. The calling thread never changes namespace.
pub fn in_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{name}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: `file` is an open namespace file; setns changes only this thread.
        let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

pub fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn nsx(ns: &str, args: &[&str]) -> Result<String, String> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(args);
    sh(&full)
}

pub fn nsx_in(ns: &str, args: &[&str], input: &str) -> Result<String, String> {
    use std::io::Write as _;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    child
        .stdin
        .take()
        .ok_or("stdin")?
        .write_all(input.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
