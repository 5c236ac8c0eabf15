//! User and group names of `-m owner --uid-owner NAME` / `--gid-owner NAME`, looked up in the
//! host's databases when a ruleset is committed, as iptables does when it loads the rule
//! (libxt_owner calls `getpwnam` / `getgrnam`, which go through NSS: `/etc/passwd`, LDAP,
//! systemd's dynamic users). The parser takes [`resolve`] as its
//! [`ParseOptions::resolve_owner`](vallum_engine::restore::ParseOptions::resolve_owner) and
//! keeps the number, which is what the ruleset is stored and printed with (as iptables-save
//! prints it): a name that changes its id later does not change the rule.

use std::ffi::CString;

use vallum_engine::restore::OwnerDb;

/// The id of user (group) `name` on this host, `None` when there is no such name (or the
/// lookup fails). Blocking: NSS may ask a directory service; called on the commit path.
pub fn resolve(db: OwnerDb, name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // Grown on ERANGE; NSS entries are small, 1 MiB is far past any real one.
    let mut buf = vec![0u8; 1024];
    loop {
        let r = match db {
            OwnerDb::User => lookup_user(&c, &mut buf),
            OwnerDb::Group => lookup_group(&c, &mut buf),
        };
        match r {
            Err(libc::ERANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            Ok(id) => return id,
            Err(_) => return None,
        }
    }
}

fn lookup_user(name: &CString, buf: &mut [u8]) -> Result<Option<u32>, i32> {
    // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids); it is only written by
    // getpwnam_r.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: `name` is NUL-terminated, `pw`, `buf` (with its true length) and `out` are
    // valid for writes for the call; the strings getpwnam_r stores point into `buf`, which
    // we do not read.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    match rc {
        0 if out.is_null() => Ok(None),
        0 => Ok(Some(pw.pw_uid)),
        e => Err(e),
    }
}

fn lookup_group(name: &CString, buf: &mut [u8]) -> Result<Option<u32>, i32> {
    // SAFETY: all-zero is a valid `group`; it is only written by getgrnam_r.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: as in `lookup_user`, for getgrnam_r.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut gr,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    match rc {
        0 if out.is_null() => Ok(None),
        0 => Ok(Some(gr.gr_gid)),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// root is uid 0 and group root gid 0 on every Linux host; a name nobody has is `None`.
    #[test]
    fn looks_up_the_hosts_databases() {
        assert_eq!(resolve(OwnerDb::User, "root"), Some(0));
        assert_eq!(resolve(OwnerDb::Group, "root"), Some(0));
        assert_eq!(resolve(OwnerDb::User, "no-such-user-h34a"), None);
        assert_eq!(resolve(OwnerDb::User, "bad\0name"), None);
    }
}
