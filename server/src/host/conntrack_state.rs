//! The connection table across a restart: on a graceful stop (SIGTERM, Ctrl-C,
//! `--exit-after`) vallumd writes its table to the database's path plus `.conntrack`
//! (`vallum.db.conntrack`), after the packet sources stopped; at the next start it reads it
//! back before it says SERVING and before any packet source starts, then deletes it (a file
//! is restored once). Each entry keeps the time it had left minus the wall-clock time
//! vallumd was away, never more than its state's timeout (`vallum_engine::conntrack::persist`);
//! a file older than `--conntrack-state-max-age` is not restored (while vallumd is down,
//! `--queue-bypass` lets traffic through unseen: flows may have closed meanwhile), nor one
//! stamped in the future beyond that age. `--conntrack-state-max-age 0` turns this off.
//!
//! What survives a kill -9 (or a crash, or a power loss): nothing of our table, since it is
//! written only on a graceful stop; TCP flows carry on through mid-stream pick-up with
//! `--conntrack-tcp-loose true` (the default), are cut in strict mode, and UDP flows open new
//! entries with their next datagram. A file that cannot be read is reported and the table
//! starts empty: vallumd never refuses to start over it.
//!
//! File: one line `# saved_unix_ms=MS`, then the engine's text ([`HEADER`] and one line per
//! entry). Written to `FILE.tmp` and renamed, so a stop that dies half way leaves no torn file.
//!
//! [`HEADER`]: vallum_engine::conntrack::persist::HEADER

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vallum_engine::conntrack::Conntrack;

/// The state file of the database at `db`: the same path with `.conntrack` appended.
pub fn path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(".conntrack");
    PathBuf::from(p)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Writes `ct` at engine time `now_ns` to `file`, stamped with the wall clock `wall`; returns
/// how many entries it wrote.
///
/// Errors: the I/O error of writing `FILE.tmp` or renaming it, with the path.
pub fn save(ct: &Conntrack, now_ns: u64, wall: SystemTime, file: &Path) -> Result<usize, String> {
    let body = ct.save(now_ns);
    let entries = body.lines().count().saturating_sub(1);
    let text = format!("# saved_unix_ms={}\n{body}", unix_ms(wall));
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, file).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(entries)
}

/// What [`restore`] did, for the start-up line.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No state file.
    Absent,
    /// Restored (counts from the engine), saved `age` before.
    Restored(vallum_engine::conntrack::Restored, Duration),
    /// Not restored: older than the maximum age (or stamped that far in the future).
    TooOld(Duration),
}

/// Restores `file` into `ct` at engine time `now_ns`, the wall clock being `wall`, unless it
/// was saved more than `max_age` ago; deletes the file either way.
///
/// Errors: a file that cannot be read or does not parse, as `FILE:LINE:COL: message`
/// (nothing is restored from it; it is deleted too).
pub fn restore(
    ct: &Conntrack,
    now_ns: u64,
    wall: SystemTime,
    max_age: Duration,
    file: &Path,
) -> Result<Outcome, String> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Outcome::Absent),
        Err(e) => return Err(format!("{}: {e}", file.display())),
    };
    let _ = std::fs::remove_file(file);
    let (stamp, body) = text.split_once('\n').unwrap_or((&text, ""));
    let saved = stamp
        .strip_prefix("# saved_unix_ms=")
        .and_then(|m| m.parse::<u64>().ok())
        .ok_or_else(|| format!("{}:1:1: expected `# saved_unix_ms=MS`", file.display()))?;
    let now_ms = unix_ms(wall);
    let age = Duration::from_millis(now_ms.abs_diff(saved));
    if age > max_age {
        return Ok(Outcome::TooOld(age));
    }
    // A clock that went back counts as no time away.
    let away_ns = u64::try_from(Duration::from_millis(now_ms.saturating_sub(saved)).as_nanos())
        .unwrap_or(u64::MAX);
    match ct.restore(body, now_ns, away_ns) {
        Ok(r) => Ok(Outcome::Restored(r, age)),
        Err(vallum_engine::conntrack::PersistError::Syntax {
            line,
            column,
            message,
        }) => Err(format!(
            "{}:{}:{column}: {message}",
            file.display(),
            line + 1
        )),
    }
}

#[cfg(test)]
mod tests {
    use vallum_engine::conntrack::{ConntrackConfig, Restored};
    use vallum_engine::packet::PacketMeta;

    use super::*;

    fn with_one_flow() -> Conntrack {
        let ct = Conntrack::new(ConntrackConfig::default()).unwrap();
        let p = PacketMeta {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            protocol: 17,
            sport: 5353,
            dport: 53,
            ..PacketMeta::default()
        };
        ct.track(&mut p.into(), 0);
        ct
    }

    #[test]
    fn saved_then_restored_once_and_aged() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(&dir.path().join("v.db"));
        assert!(file.ends_with("v.db.conntrack"));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(save(&with_one_flow(), 0, t0, &file), Ok(1));
        let ct = Conntrack::new(ConntrackConfig::default()).unwrap();
        let later = t0 + Duration::from_secs(10);
        let got = restore(&ct, 0, later, Duration::from_secs(600), &file).unwrap();
        let want = Restored {
            restored: 1,
            ..Restored::default()
        };
        assert_eq!(got, Outcome::Restored(want, Duration::from_secs(10)));
        // UDP unreplied lives 30 s: 20 s left after 10 s away.
        assert_eq!(ct.list()[0].expires_ns, 20_000_000_000);
        // Deleted: a second start restores nothing.
        assert_eq!(
            restore(&ct, 0, later, Duration::from_secs(600), &file),
            Ok(Outcome::Absent)
        );
    }

    #[test]
    fn too_old_or_bad_files_restore_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(&dir.path().join("v.db"));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        save(&with_one_flow(), 0, t0, &file).unwrap();
        let ct = Conntrack::new(ConntrackConfig::default()).unwrap();
        let got = restore(
            &ct,
            0,
            t0 + Duration::from_secs(601),
            Duration::from_secs(600),
            &file,
        );
        assert_eq!(got, Ok(Outcome::TooOld(Duration::from_secs(601))));
        assert!(ct.list().is_empty() && !file.exists());
        std::fs::write(
            &file,
            "# saved_unix_ms=1800000000000\n# vallum conntrack v1\n17 x\n",
        )
        .unwrap();
        let e = restore(&ct, 0, t0, Duration::from_secs(600), &file).unwrap_err();
        assert!(e.ends_with("v.db.conntrack:3:1: expected 7 or 8 fields (PROTO SRC DST SPORT DPORT STATUS LEFT_MS [ZONE]), found 2"), "{e}");
        assert!(ct.list().is_empty() && !file.exists());
    }
}
