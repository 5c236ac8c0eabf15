//! vallumd's local unix socket (`--socket`), the default local endpoint of `vallumctl` and
//! `vallum-iptables` (as `docker.sock`): where it lives, and binding it without taking it from
//! a running vallumd. Who may do what through it is the auth layer's (peer credentials,
//! `crate::grpc::auth`); what it speaks (gRPC over HTTP/2, and local calls for
//! `vallum-iptables`) is `crate::grpc::local_call`'s.
//!
//! Path: `--socket PATH`; without the flag [`DEFAULT_SOCKET`] when vallumd runs as root, else
//! `$XDG_RUNTIME_DIR/vallum/vallumd.sock` (no socket when that is unset); `--socket none` turns
//! it off. The parent directory is created (mode 0755) when missing; the socket is mode 0666,
//! since every local user may connect and read (the auth layer decides who may change state).
//!
//! A socket file left by a vallumd that is gone (connecting is refused) is replaced; one that
//! a running vallumd answers on is not: that is an error for an explicit `--socket`, and a
//! warning (no socket, TCP only) for the default path, so a second vallumd on a host (a test,
//! a foreground run next to the service) still starts. A default path that cannot be created
//! (not root, a read-only /run) is a warning too; an explicit one is an error. At shutdown
//! the file is removed if it is still the one this process bound.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The local socket of a vallumd run as root.
pub const DEFAULT_SOCKET: &str = "/run/vallum/vallumd.sock";

/// Which socket to bind, from `--socket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// `--socket none`, or no default applies (not root and no `$XDG_RUNTIME_DIR`).
    Off,
    /// No `--socket`: a failure to bind is a warning.
    Default(PathBuf),
    /// `--socket PATH`: a failure to bind is an error.
    Explicit(PathBuf),
}

/// The socket for `flag` (`--socket`), vallumd's effective uid and `$XDG_RUNTIME_DIR`.
pub fn choose(flag: Option<&Path>, euid: u32, xdg_runtime_dir: Option<&Path>) -> Choice {
    match flag {
        Some(p) if p == Path::new("none") => Choice::Off,
        Some(p) => Choice::Explicit(p.to_owned()),
        None if euid == 0 => Choice::Default(PathBuf::from(DEFAULT_SOCKET)),
        None => match xdg_runtime_dir {
            Some(d) if d.is_absolute() => Choice::Default(d.join("vallum/vallumd.sock")),
            _ => Choice::Off,
        },
    }
}

/// Why the socket was not bound.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// A running vallumd answers on it.
    #[error("{}: another vallumd serves this socket (stop it, or pass --socket PATH or --socket none)", .0.display())]
    InUse(PathBuf),
    /// The path exists and is not a socket.
    #[error("{}: exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    /// Creating the directory, binding or setting the mode failed.
    #[error("{}: {step}: {source}", path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What was being done.
        step: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A bound local socket; its file is removed on drop while it is still this one.
#[derive(Debug)]
pub struct LocalSocket {
    /// The listener (taken by the server).
    pub listener: Option<tokio::net::UnixListener>,
    /// Where it is.
    pub path: PathBuf,
    /// (device, inode) of the file bound, to remove only our own.
    id: (u64, u64),
}

/// Binds `path` (mode 0666), creating its directory, replacing a stale socket file.
///
/// Errors: [`SocketError`]. Must run inside a tokio runtime.
pub fn bind(path: &Path) -> Result<LocalSocket, SocketError> {
    let io = |step: &'static str| {
        let path = path.to_owned();
        move |source| SocketError::Io { path, step, source }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(io("create directory"))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                .map_err(io("chmod directory"))?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse(path.to_owned()));
            }
            std::fs::remove_file(path).map_err(io("remove stale socket"))?;
        }
        Ok(_) => return Err(SocketError::NotASocket(path.to_owned())),
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(io("bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(io("chmod socket"))?;
    let m = std::fs::metadata(path).map_err(io("stat socket"))?;
    Ok(LocalSocket {
        listener: Some(listener),
        path: path.to_owned(),
        id: (m.dev(), m.ino()),
    })
}

impl Drop for LocalSocket {
    fn drop(&mut self) {
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices() {
        let xdg = Path::new("/run/user/1000");
        assert_eq!(
            choose(None, 0, Some(xdg)),
            Choice::Default(DEFAULT_SOCKET.into())
        );
        assert_eq!(
            choose(None, 1000, Some(xdg)),
            Choice::Default("/run/user/1000/vallum/vallumd.sock".into())
        );
        assert_eq!(choose(None, 1000, None), Choice::Off);
        assert_eq!(choose(None, 1000, Some(Path::new("rel"))), Choice::Off);
        assert_eq!(choose(Some(Path::new("none")), 0, None), Choice::Off);
        assert_eq!(
            choose(Some(Path::new("/tmp/v.sock")), 0, None),
            Choice::Explicit("/tmp/v.sock".into())
        );
    }

    #[tokio::test]
    async fn binds_replaces_stale_refuses_live_and_cleans_up() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/vallumd.sock");
        let s = bind(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666);
        // Live: refused, and the file stays.
        assert!(matches!(bind(&p), Err(SocketError::InUse(_))));
        assert!(p.exists());
        drop(s);
        assert!(!p.exists(), "removed at drop");
        // Stale (bound, listener gone, file left): replaced.
        let stale = std::os::unix::net::UnixListener::bind(&p).unwrap();
        drop(stale);
        let s = bind(&p).unwrap();
        // A file that is not a socket is never removed.
        let f = d.path().join("plain");
        std::fs::write(&f, "x").unwrap();
        assert!(matches!(bind(&f), Err(SocketError::NotASocket(_))));
        assert!(f.exists());
        drop(s);
    }
}
