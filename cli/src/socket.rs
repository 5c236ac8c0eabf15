//! The local endpoint of vallumd (its unix socket, `vallumd --socket`), shared by `vallumctl`
//! and `vallum-iptables`: which endpoint to use when `--server` / `VALLUM_SERVER` is not
//! given ([`default_server`]) and the path of a `unix:` endpoint ([`unix_path`]). How each
//! connects is its own: vallumctl a tonic channel (`connect.rs`), vallum-iptables local calls
//! (`iptables/call.rs`).
//!
//! `--server` takes `unix:PATH` (or `unix://PATH`, PATH absolute) besides `http://` and
//! `https://` URLs. Without it: the first of [`sockets`] that exists as a socket (vallumd as
//! root, then vallumd as this user under `$XDG_RUNTIME_DIR`), else [`DEFAULT_TCP`].

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// vallumd's local socket when it runs as root.
pub const DEFAULT_SOCKET: &str = "/run/vallum/vallumd.sock";
/// The TCP endpoint used when no local socket exists.
pub const DEFAULT_TCP: &str = "http://127.0.0.1:50051";

/// Where a local vallumd's socket may be, in the order tried: [`DEFAULT_SOCKET`], then
/// `$XDG_RUNTIME_DIR/vallum/vallumd.sock` (vallumd run by this user).
pub fn sockets() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from(DEFAULT_SOCKET)];
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if d.is_absolute() {
            out.push(d.join("vallum/vallumd.sock"));
        }
    }
    out
}

/// The endpoint without `--server`: `unix:PATH` of the first existing socket of
/// [`sockets`], else [`DEFAULT_TCP`].
pub fn default_server() -> String {
    sockets()
        .into_iter()
        .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()))
        .map_or_else(
            || DEFAULT_TCP.to_owned(),
            |p| format!("unix:{}", p.display()),
        )
}

/// The socket path of a `unix:PATH` / `unix://PATH` endpoint (`None` for any other).
pub fn unix_path(server: &str) -> Option<&Path> {
    let rest = server.strip_prefix("unix:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    Some(Path::new(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_endpoints() {
        assert_eq!(
            unix_path("unix:/run/v.sock"),
            Some(Path::new("/run/v.sock"))
        );
        assert_eq!(
            unix_path("unix:///run/v.sock"),
            Some(Path::new("/run/v.sock"))
        );
        assert_eq!(unix_path("http://127.0.0.1:1"), None);
        assert_eq!(sockets()[0], Path::new(DEFAULT_SOCKET));
    }
}
