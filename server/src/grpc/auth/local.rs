//! Local callers: who may change state through the local unix socket without a token
//! ([`LocalPolicy`], from `SO_PEERCRED` and `/proc/PID/status`), and `--socket-group` by name
//! ([`resolve_group`]).

use std::path::PathBuf;
use std::sync::Arc;

use super::{AuthError, Caller, Role};

/// `CAP_NET_ADMIN`'s bit in `CapEff` (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;

/// Who may change state through the local socket without a token, and what an anonymous
/// TCP caller may do; built by [`AuthConfig::local_policy`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPolicy {
    /// vallumd's own effective uid: the user who runs vallumd may manage it (as rootless
    /// docker's socket).
    pub own_uid: u32,
    /// `--socket-group` as a gid: its members may change state too.
    pub group: Option<u32>,
    /// `--insecure-no-auth`: without tokens, TCP callers are anonymous admins.
    pub anonymous_tcp_admin: bool,
    /// Where `/proc` is (`PID/status` is read for CapEff and Groups); a test seam.
    pub proc_root: PathBuf,
}

impl Default for LocalPolicy {
    /// Root runs vallumd, no group, anonymous TCP read-only, `/proc`.
    fn default() -> Self {
        LocalPolicy {
            own_uid: 0,
            group: None,
            anonymous_tcp_admin: false,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// A local-socket peer as `SO_PEERCRED` gives it (tokio's `UnixStream::peer_cred`): the
/// uid, primary gid and pid at `connect(2)`; the pid is `None` when the peer's process is not
/// visible from vallumd's pid namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPeer {
    /// Effective uid.
    pub uid: u32,
    /// Effective primary gid.
    pub gid: u32,
    /// Process id, in vallumd's pid namespace.
    pub pid: Option<i32>,
}

/// What `/proc/PID/status` says of a process: effective uid, effective capabilities and
/// every group (primary and supplementary).
#[derive(Debug, Default, PartialEq, Eq)]
struct ProcStatus {
    euid: Option<u32>,
    cap_eff: u64,
    groups: Vec<u32>,
}

/// Parses the `Uid:`, `CapEff:` and `Groups:` lines of `/proc/PID/status` (proc(5)).
fn parse_status(text: &str) -> ProcStatus {
    let mut st = ProcStatus::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let mut words = value.split_whitespace();
        match key {
            // Real, effective, saved, filesystem.
            "Uid" => st.euid = words.nth(1).and_then(|w| w.parse().ok()),
            "CapEff" => {
                st.cap_eff = words
                    .next()
                    .and_then(|w| u64::from_str_radix(w, 16).ok())
                    .unwrap_or(0)
            }
            "Groups" => st.groups = words.filter_map(|w| w.parse().ok()).collect(),
            _ => {}
        }
    }
    st
}

impl LocalPolicy {
    /// Why `peer` may change state (`None`: it may only read): `uid=0`, `owner` (vallumd's
    /// uid), `gid=G` (`--socket-group`), `cap=net_admin`. The capability and supplementary
    /// groups come from `/proc/PID/status`, trusted only while its effective uid is the
    /// peer's (a pid reused by another user's process grants nothing).
    pub fn privilege(&self, peer: &LocalPeer) -> Option<String> {
        if peer.uid == 0 {
            return Some("uid=0".into());
        }
        if peer.uid == self.own_uid {
            return Some("owner".into());
        }
        if self.group == Some(peer.gid) {
            return Some(format!("gid={}", peer.gid));
        }
        let st = peer
            .pid
            .filter(|&p| p > 0)
            .and_then(|p| {
                std::fs::read_to_string(self.proc_root.join(p.to_string()).join("status")).ok()
            })
            .map(|t| parse_status(&t))
            .filter(|st| st.euid == Some(peer.uid))?;
        if let Some(g) = self.group.filter(|g| st.groups.contains(g)) {
            return Some(format!("gid={g}"));
        }
        (st.cap_eff & (1 << CAP_NET_ADMIN) != 0).then(|| "cap=net_admin".to_owned())
    }

    /// The caller of a local-socket request without a token: an admin when
    /// [`LocalPolicy::privilege`] says so, otherwise read-only; named
    /// `local:uid=U,pid=P[,WHY]` for the audit log.
    pub fn caller(&self, peer: &LocalPeer) -> Caller {
        let pid = peer.pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
        let why = self.privilege(peer);
        let name = match &why {
            Some(w) if w != "uid=0" => format!("local:uid={},pid={pid},{w}", peer.uid),
            _ => format!("local:uid={},pid={pid}", peer.uid),
        };
        Caller {
            name: Arc::from(name),
            role: if why.is_some() {
                Role::Admin
            } else {
                Role::ReadOnly
            },
            scope: None,
        }
    }

    /// What a local peer lacks for a change, for the refusal's message.
    pub(super) fn missing(&self) -> String {
        let group = match self.group {
            Some(g) => format!(", membership of --socket-group (gid {g})"),
            None => String::new(),
        };
        format!(
            "uid 0 (or vallumd's uid {}), CAP_NET_ADMIN{group}",
            self.own_uid
        )
    }
}

/// The gid of `--socket-group`: a number, or a group name looked up with `getgrnam_r(3)`.
///
/// Errors: [`AuthError::UnknownGroup`] when the name is not a group.
pub fn resolve_group(group: &str) -> Result<u32, AuthError> {
    if let Ok(g) = group.parse::<u32>() {
        return Ok(g);
    }
    let unknown = || AuthError::UnknownGroup {
        group: group.to_owned(),
    };
    let name = std::ffi::CString::new(group).map_err(|_| unknown())?;
    // SAFETY: `group` is plain data; all-zero is a valid value that getgrnam_r overwrites.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is live for the call and `buf`'s length is passed; on success
    // `out` points at `grp`, whose strings point into `buf` (not read after this block).
    let r = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    if r != 0 || out.is_null() {
        return Err(unknown());
    }
    Ok(grp.gr_gid)
}
