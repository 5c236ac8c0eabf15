//! Helpers of the namespace tests (corpus, physdev_bridge, nfqueue, nfqueue_overload, coexist,
//! kernel_tables): run a command, run one inside a network namespace (`ip netns exec`),
//! optionally with stdin — each returns the command's stdout, or an error naming the command
//! and its stderr —, run a closure on a thread inside a namespace ([`in_netns`]), send raw
//! Ethernet frames ([`Sender`]), and find a tool on PATH for the prerequisite checks. Plain `std::process` (no crate: the tests shell out to
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

/// An AF_PACKET socket in namespace `ns` bound for sending whole Ethernet frames on `dev`
/// (the frame's first 6 bytes are its destination).
pub struct Sender {
    fd: std::os::fd::OwnedFd,
    ifindex: i32,
}

impl Sender {
    /// Opens it; panics when the socket or the device cannot be had.
    pub fn open(ns: &str, dev: &str) -> Sender {
        let dev = std::ffi::CString::new(dev).expect("name");
        in_netns(ns, move || {
            use std::os::fd::FromRawFd;
            // SAFETY: plain socket(2); checked below.
            let fd =
                unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            // SAFETY: `dev` is NUL-terminated.
            let ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) } as i32;
            assert!(ifindex > 0, "if_nametoindex");
            Sender {
                // SAFETY: a new descriptor nothing else owns.
                fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
                ifindex,
            }
        })
    }

    /// Sends one frame; panics unless all of it went.
    pub fn send(&self, frame: &[u8]) {
        // SAFETY: sockaddr_ll is plain old data; zero is a valid value.
        let mut a: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        a.sll_family = libc::AF_PACKET as u16;
        a.sll_ifindex = self.ifindex;
        a.sll_halen = 6;
        a.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: the buffer and address are live for the lengths passed.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&a as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(
            n,
            frame.len() as isize,
            "sendto: {}",
            std::io::Error::last_os_error()
        );
    }
}
