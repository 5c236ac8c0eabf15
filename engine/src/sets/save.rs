//! `ipset save` text: [`SetManager::restore`] reads it, [`SetManager::save`] writes it.
//!
//! Lines (as `ipset save` prints them; blank lines and `#` comments are skipped):
//!
//! ```text
//! create NAME TYPE family inet|inet6 [hashsize N] [maxelem N] [timeout N] [counters]
//!        [bucketsize N] [initval 0xN]
//! add NAME ELEMENT [timeout N] [packets N bytes N]
//! ```
//!
//! `bucketsize` and `initval` (kernel hash tuning) are accepted and dropped. A restore is all
//! or nothing: the text is checked and staged as changes under the manager's lock and
//! published only when every line succeeded; an error names its line, column and token.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use super::ipset::{
    AddOptions, Element, SetError, SetHandle, SetManager, SetSpec, SetType, Staged,
};
use crate::dataplane::left_right::Readers;
use crate::model::Family;

/// An error in `ipset save` text, at a 1-based line and column (bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {kind} (at {})", crate::echo::quoted(.token))]
pub struct SaveError {
    /// Line, from 1.
    pub line: usize,
    /// Column of the offending token, from 1.
    pub col: usize,
    /// The offending token (empty at the end of a line).
    pub token: String,
    /// What is wrong.
    pub kind: SaveErrorKind,
}

/// What is wrong with a line of `ipset save` text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaveErrorKind {
    /// A command other than `create` and `add`.
    #[error("unknown command")]
    UnknownCommand,
    /// A line ended where a word was needed.
    #[error("missing {0}")]
    Missing(&'static str),
    /// A set type this engine does not implement.
    #[error("unsupported set type")]
    UnknownType,
    /// An option the command does not take.
    #[error("unknown option")]
    UnknownOption,
    /// A number that does not parse or is out of range.
    #[error("bad number")]
    BadNumber,
    /// `family` other than `inet`/`inet6`.
    #[error("bad family")]
    BadFamily,
    /// The set operation failed (exists, not found, bad element, full).
    #[error("{0}")]
    Set(#[from] SetError),
}

/// Words of a line with their 1-based columns.
fn words(line: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices().chain([(line.len(), ' ')]) {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push((s + 1, &line[s..i]));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    out
}

struct Line<'a> {
    no: usize,
    words: Vec<(usize, &'a str)>,
    pos: usize,
    end_col: usize,
}

impl<'a> Line<'a> {
    fn err_at(&self, i: usize, kind: SaveErrorKind) -> SaveError {
        let (col, token) = self
            .words
            .get(i)
            .map_or((self.end_col, ""), |&(c, w)| (c, w));
        SaveError {
            line: self.no,
            col,
            token: token.into(),
            kind,
        }
    }

    /// The error at the last word taken.
    fn err(&self, kind: SaveErrorKind) -> SaveError {
        self.err_at(self.pos.saturating_sub(1), kind)
    }

    fn next(&mut self, what: &'static str) -> Result<&'a str, SaveError> {
        let w = self
            .words
            .get(self.pos)
            .map(|&(_, w)| w)
            .ok_or_else(|| self.err_at(self.pos, SaveErrorKind::Missing(what)))?;
        self.pos += 1;
        Ok(w)
    }

    fn number<T: std::str::FromStr>(&mut self, what: &'static str) -> Result<T, SaveError> {
        let w = self.next(what)?;
        w.parse().map_err(|_| self.err(SaveErrorKind::BadNumber))
    }
}

/// `ipset save` text checked and staged as changes, not yet visible:
/// [`SetManager::prepare_restore`] makes it, [`PreparedRestore::publish`] creates the new
/// sets and publishes every changed set; dropping it discards everything. Same contract as
/// [`super::Prepared`]: the caller keeps other set writers out until it publishes.
pub struct PreparedRestore {
    created: BTreeMap<String, Arc<SetHandle>>,
    staged: BTreeMap<String, Staged>,
    applied: usize,
}

impl std::fmt::Debug for PreparedRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedRestore")
            .field("created", &self.created.keys().collect::<Vec<_>>())
            .field("changed", &self.staged.keys().collect::<Vec<_>>())
            .field("applied", &self.applied)
            .finish()
    }
}

/// One set a restore creates or adds to.
#[derive(Debug)]
pub struct RestoredSet<'a> {
    /// Set name.
    pub name: &'a str,
    /// Its spec (of the new set, or of the existing one).
    pub spec: SetSpec,
    /// Whether the restore creates it.
    pub created: bool,
    /// Every element added, in text order, with its expiry (ns on the restore's clock,
    /// `u64::MAX` never); an element added twice appears twice.
    pub added: &'a [(Element, u64)],
}

impl PreparedRestore {
    /// How many lines (`create`/`add`) the text had.
    pub fn applied(&self) -> usize {
        self.applied
    }

    /// The sets created or added to, by name.
    pub fn sets(&self) -> impl Iterator<Item = RestoredSet<'_>> {
        self.staged.iter().map(|(name, st)| RestoredSet {
            name,
            spec: st.spec(),
            created: self.created.contains_key(name),
            added: st.log(),
        })
    }

    /// Creates the new sets and publishes every changed one.
    pub fn publish(self, manager: &SetManager) {
        let mut sets = manager.lock();
        self.publish_locked(&mut sets);
    }

    fn publish_locked(self, sets: &mut BTreeMap<String, Arc<SetHandle>>) {
        sets.extend(self.created);
        for st in self.staged.into_values() {
            st.publish();
        }
    }
}

impl SetManager {
    /// Applies `ipset save` text (creates sets, adds elements) at time `now`, all or nothing.
    /// Returns how many lines were applied.
    pub fn restore(&self, text: &str, now: u64) -> Result<usize, SaveError> {
        let mut sets = self.lock();
        let p = Self::restore_locked(&sets, &self.readers, text, now)?;
        let n = p.applied;
        p.publish_locked(&mut sets);
        Ok(n)
    }

    /// As [`SetManager::restore`], but returns the result unpublished, with a log of what it
    /// adds (see [`PreparedRestore`]). Errors as `restore`; on error nothing is staged.
    pub fn prepare_restore(&self, text: &str, now: u64) -> Result<PreparedRestore, SaveError> {
        let sets = self.lock();
        Self::restore_locked(&sets, &self.readers, text, now)
    }

    fn restore_locked(
        sets: &BTreeMap<String, Arc<SetHandle>>,
        readers: &Arc<Readers>,
        text: &str,
        now: u64,
    ) -> Result<PreparedRestore, SaveError> {
        let mut created: BTreeMap<String, Arc<SetHandle>> = BTreeMap::new();
        let mut staged: BTreeMap<String, Staged> = BTreeMap::new();
        let mut applied = 0;
        for (i, raw) in text.lines().enumerate() {
            let mut l = Line {
                no: i + 1,
                words: words(raw),
                pos: 0,
                end_col: raw.len() + 1,
            };
            let Some(&(_, cmd)) = l.words.first() else {
                continue;
            };
            if cmd.starts_with('#') {
                continue;
            }
            l.pos = 1;
            match cmd {
                "create" => {
                    let name = l.next("set name")?;
                    let name_at = l.pos - 1;
                    let kind = SetType::from_name(l.next("set type")?)
                        .ok_or_else(|| l.err(SaveErrorKind::UnknownType))?;
                    let mut spec = SetSpec::new(kind, Family::Ipv4);
                    while l.pos < l.words.len() {
                        match l.next("option")? {
                            "family" => {
                                spec.family = match l.next("family")? {
                                    "inet" => Family::Ipv4,
                                    "inet6" => Family::Ipv6,
                                    _ => return Err(l.err(SaveErrorKind::BadFamily)),
                                }
                            }
                            "hashsize" => spec.hashsize = l.number("hashsize")?,
                            "maxelem" => spec.maxelem = l.number("maxelem")?,
                            "timeout" => spec.timeout = Some(l.number("timeout")?),
                            "counters" => spec.counters = true,
                            "bucketsize" => {
                                l.number::<u32>("bucketsize")?;
                            }
                            "initval" => {
                                let v = l.next("initval")?;
                                let hex = v.strip_prefix("0x").unwrap_or(v);
                                u32::from_str_radix(hex, 16)
                                    .map_err(|_| l.err(SaveErrorKind::BadNumber))?;
                            }
                            _ => return Err(l.err(SaveErrorKind::UnknownOption)),
                        }
                    }
                    if sets.contains_key(name) {
                        return Err(l.err_at(name_at, SetError::Exists(name.into()).into()));
                    }
                    SetManager::create_locked(&mut created, readers, name, spec)
                        .map_err(|e| l.err_at(name_at, e.into()))?;
                    let st = SetManager::stage(&created, name)
                        .map_err(|e| l.err_at(name_at, e.into()))?;
                    staged.insert(name.into(), st.logged());
                }
                "add" => {
                    let name = l.next("set name")?;
                    if !staged.contains_key(name) {
                        let st = SetManager::stage(sets, name).map_err(|e| l.err(e.into()))?;
                        staged.insert(name.into(), st.logged());
                    }
                    let Some(st) = staged.get_mut(name) else {
                        return Err(l.err(SetError::NotFound(name.into()).into()));
                    };
                    let spec = st.spec();
                    let text = l.next("element")?;
                    let elements = Element::parse(&spec, text).map_err(|reason| {
                        l.err(
                            SetError::BadElement {
                                set: name.into(),
                                element: text.into(),
                                reason,
                            }
                            .into(),
                        )
                    })?;
                    let mut opts = AddOptions::default();
                    let (mut packets, mut bytes) = (None, None);
                    while l.pos < l.words.len() {
                        match l.next("option")? {
                            "timeout" => opts.timeout = Some(l.number("timeout")?),
                            "packets" => packets = Some(l.number("packets")?),
                            "bytes" => bytes = Some(l.number("bytes")?),
                            _ => return Err(l.err(SaveErrorKind::UnknownOption)),
                        }
                    }
                    if packets.is_some() || bytes.is_some() {
                        opts.counters = Some((packets.unwrap_or(0), bytes.unwrap_or(0)));
                    }
                    st.add(name, elements.into_iter().map(|e| (e, opts)), now)
                        .map_err(|e| l.err_at(2, e.into()))?;
                }
                _ => return Err(l.err_at(0, SaveErrorKind::UnknownCommand)),
            }
            applied += 1;
        }
        Ok(PreparedRestore {
            created,
            staged,
            applied,
        })
    }

    /// All sets as `ipset save` prints them at `now` (sets and elements sorted; remaining
    /// timeouts rounded up to whole seconds).
    pub fn save(&self, now: u64) -> String {
        let sets = self.lock();
        let mut out = String::new();
        for name in sets.keys() {
            let Ok(info) = SetManager::list_locked(&sets, name, now) else {
                continue;
            };
            let s = &info.spec;
            let family = match s.family {
                Family::Ipv4 => "inet",
                Family::Ipv6 => "inet6",
            };
            let _ = write!(
                out,
                "create {name} {} family {family} hashsize {} maxelem {}",
                s.kind.name(),
                s.hashsize,
                s.maxelem
            );
            if let Some(t) = s.timeout {
                let _ = write!(out, " timeout {t}");
            }
            if s.counters {
                out.push_str(" counters");
            }
            out.push('\n');
            for e in &info.elements {
                let _ = write!(out, "add {name} {}", e.text);
                if let Some(t) = e.timeout {
                    let _ = write!(out, " timeout {t}");
                }
                if let Some((p, b)) = e.counters {
                    let _ = write!(out, " packets {p} bytes {b}");
                }
                out.push('\n');
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SetDir;
    use crate::packet::PacketMeta;
    use crate::sets::SetRegistry;

    /// A Docker + fail2ban style host: Docker's bridge set, fail2ban bans with timeouts and
    /// counters, an IPv6 ban list and a port allow list.
    const HOST: &str = "\
# ipset save on a Docker host running fail2ban
create docker-ext-bridges-v4 hash:net family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x6c1b5a3e
add docker-ext-bridges-v4 172.17.0.0/16
add docker-ext-bridges-v4 192.0.2.0/24

create f2b-sshd hash:ip family inet hashsize 1024 maxelem 65536 timeout 600 counters
add f2b-sshd 203.0.113.9 timeout 598 packets 12 bytes 720
add f2b-sshd 198.51.100.23 timeout 0 packets 0 bytes 0
create f2b-sshd-v6 hash:net family inet6 hashsize 1024 maxelem 65536 timeout 3600
add f2b-sshd-v6 2001:db8:bad::/48 timeout 3000
create allowed-services hash:ip,port family inet hashsize 64 maxelem 1024
add allowed-services 192.0.2.2,tcp:80
add allowed-services 192.0.2.2,udp:53
create office-nets hash:net,port family inet hashsize 1024 maxelem 65536
add office-nets 10.20.0.0/16,tcp:22
";

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn docker_fail2ban_import_and_round_trip() {
        let m = SetManager::new();
        let now = 1000 * SEC;
        assert_eq!(m.restore(HOST, now).unwrap(), 13);
        assert_eq!(m.names().len(), 5);
        let f2b = m.list("f2b-sshd", now).unwrap();
        assert_eq!(f2b.spec.timeout, Some(600));
        assert!(f2b.spec.counters);
        assert_eq!(f2b.elements.len(), 2);

        let bans = m.lookup("f2b-sshd").unwrap();
        let p = PacketMeta {
            src: "203.0.113.9".parse().unwrap(),
            len: 60,
            ..PacketMeta::default()
        };
        assert!(bans.contains(&p, &[SetDir::Src], now + 597 * SEC));
        assert!(!bans.contains(&p, &[SetDir::Src], now + 598 * SEC));

        let text = m.save(now);
        let expected = "\
create allowed-services hash:ip,port family inet hashsize 64 maxelem 1024
add allowed-services 192.0.2.2,tcp:80
add allowed-services 192.0.2.2,udp:53
create docker-ext-bridges-v4 hash:net family inet hashsize 1024 maxelem 65536
add docker-ext-bridges-v4 172.17.0.0/16
add docker-ext-bridges-v4 192.0.2.0/24
create f2b-sshd hash:ip family inet hashsize 1024 maxelem 65536 timeout 600 counters
add f2b-sshd 198.51.100.23 timeout 0 packets 0 bytes 0
add f2b-sshd 203.0.113.9 timeout 598 packets 13 bytes 780
create f2b-sshd-v6 hash:net family inet6 hashsize 1024 maxelem 65536 timeout 3600
add f2b-sshd-v6 2001:db8:bad::/48 timeout 3000
create office-nets hash:net,port family inet hashsize 1024 maxelem 65536
add office-nets 10.20.0.0/16,tcp:22
";
        assert_eq!(text, expected);
        let again = SetManager::new();
        again.restore(&text, now).unwrap();
        assert_eq!(again.save(now), text);
    }

    #[test]
    fn prepared_restore_logs_additions_and_publishes_on_demand() {
        let m = SetManager::new();
        m.restore("create old hash:ip family inet timeout 10\n", 0)
            .unwrap();
        let text = "create new hash:net family inet\nadd new 10.0.0.0/8\nadd old 192.0.2.1\nadd old 192.0.2.2 timeout 0\n";
        let p = m.prepare_restore(text, SEC).unwrap();
        assert_eq!(p.applied(), 4);
        let sets: Vec<_> = p.sets().collect();
        assert_eq!(sets.len(), 2);
        assert_eq!((sets[0].name, sets[0].created), ("new", true));
        assert_eq!(sets[0].added.len(), 1);
        assert_eq!(sets[0].added[0].1, u64::MAX);
        assert_eq!((sets[1].name, sets[1].created), ("old", false));
        assert_eq!(sets[1].added[0].1, 11 * SEC);
        assert_eq!(sets[1].added[1].1, u64::MAX);
        // Not visible yet.
        assert!(m.handle("new").is_none());
        assert!(m.list("old", SEC).unwrap().elements.is_empty());
        p.publish(&m);
        assert_eq!(m.list("new", SEC).unwrap().elements.len(), 1);
        assert_eq!(m.list("old", SEC).unwrap().elements.len(), 2);
    }

    #[test]
    fn errors_carry_line_and_column_and_apply_nothing() {
        let m = SetManager::new();
        let cases: &[(&str, &str)] = &[
            (
                "create a hash:ip family inet\nadd a 10.0.0.300\n",
                "2:7: set \"a\": invalid element",
            ),
            ("create a hash:mac\n", "1:10: unsupported set type"),
            ("create a hash:ip family inet7\n", "1:25: bad family"),
            ("create a hash:ip maxelem x\n", "1:26: bad number"),
            (
                "create a hash:ip\nadd a 10.0.0.1 foo\n",
                "2:16: unknown option",
            ),
            (
                "create a hash:ip\nadd a 10.0.0.1 timeout 5\n",
                "2:7: set \"a\": invalid element",
            ),
            (
                "create a hash:ip\nadd a 10.0.0.1 packets 1 bytes 2\n",
                "2:7: set \"a\": invalid element",
            ),
            ("add nope 10.0.0.1\n", "1:5: set \"nope\" does not exist"),
            ("del a 10.0.0.1\n", "1:1: unknown command"),
            ("create a hash:ip\nadd a\n", "2:6: missing element"),
            (
                "create a hash:ip maxelem 1\nadd a 10.0.0.1\nadd a 10.0.0.2\n",
                "3:7: set \"a\" is full",
            ),
        ];
        for (text, want) in cases {
            let e = m.restore(text, 0).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
        assert!(m.names().is_empty(), "failed restores create nothing");
        m.restore("create a hash:ip\n", 0).unwrap();
        let e = m.restore("create a hash:ip\n", 0).unwrap_err();
        assert_eq!((e.line, e.col, e.token.as_str()), (1, 8, "a"));
    }
}
