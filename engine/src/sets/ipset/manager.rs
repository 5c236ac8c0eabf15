//! The [`SetManager`]: the registry of sets by name and every writer (create, add, delete,
//! swap, gc, list), staged changes ([`Prepared`]). Commit/API path; readers never take its lock.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::dataplane::Quiescence;
use crate::dataplane::left_right::{LeftRight, Readers};
use crate::sets::IpSet;

use super::content::{Content, Counters, Delta, Entry, SetHandle};
use super::element::*;

// === SetManager ===

/// One element as listed: element, seconds left (with timeouts), counters (with counters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedElement {
    /// The element.
    pub element: Element,
    /// Its text (`ipset save` syntax).
    pub text: String,
    /// Seconds until expiry (rounded up; 0 = never), when the set has timeouts.
    pub timeout: Option<u64>,
    /// `(packets, bytes)`, when the set has counters.
    pub counters: Option<(u64, u64)>,
}

/// A set as `ipset list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetInfo {
    /// Name.
    pub name: String,
    /// Type, family and options.
    pub spec: SetSpec,
    /// Live elements, sorted.
    pub elements: Vec<ListedElement>,
}

/// The registry of ipset-style sets. Writers are serialized by one mutex; readers (the packet
/// path, through handles) never take it. Implements [`SetRegistry`](crate::sets::SetRegistry).
///
/// Built for a dataplane ([`SetManager::for_dataplane`], with the engine's
/// [`Quiescence`](crate::engine::Engine::quiescence)), lookups inside that dataplane's batches read a
/// set through one pointer load; built without one ([`SetManager::new`]), or outside a batch,
/// each lookup takes a read lock (module docs of [`crate::sets::ipset`]).
#[derive(Debug)]
pub struct SetManager {
    pub(in crate::sets) sets: Mutex<BTreeMap<String, Arc<SetHandle>>>,
    /// What protects every set's readers (shared by all handles: `swap` moves copies).
    pub(in crate::sets) readers: Arc<Readers>,
    /// The node's address facts that `-m addrtype` reads (empty until its owner fills them).
    pub(in crate::sets) node_addrs: Arc<crate::node_addrs::NodeAddrs>,
    /// The hooks the node's packet path evaluates, once its owner has said
    /// ([`SetManager::set_reached_hooks`]).
    pub(in crate::sets) reached_hooks:
        std::sync::RwLock<Option<Arc<crate::validate::ReachedHooks>>>,
}

impl Default for SetManager {
    /// As [`SetManager::new`].
    fn default() -> SetManager {
        SetManager::new()
    }
}

impl crate::sets::SetRegistry for SetManager {
    fn lookup(&self, name: &str) -> Option<Arc<dyn IpSet>> {
        self.handle(name).map(|h| h as Arc<dyn IpSet>)
    }

    fn node_addrs(&self) -> Option<Arc<crate::node_addrs::NodeAddrs>> {
        Some(self.node_addrs.clone())
    }

    fn reached_hooks(&self) -> Option<Arc<crate::validate::ReachedHooks>> {
        self.reached_hooks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A staged change of one set, published by [`Staged::publish`]: the elements it sets or
/// removes, checked against the live copy (read under the handle's writer lock).
pub(in crate::sets) struct Staged {
    pub(in crate::sets) handle: Arc<SetHandle>,
    /// The set's options (as staged).
    pub(in crate::sets) opts: super::content::Options,
    /// How many elements the set has with this change.
    pub(in crate::sets) len: usize,
    pub(in crate::sets) delta: Delta,
    /// With [`Staged::logged`]: every element added, with its expiry.
    pub(in crate::sets) log: Option<Vec<(Element, u64)>>,
}

impl SetManager {
    /// An empty manager whose sets are read under a lock (no dataplane): for tests and tools
    /// that call sets directly. A server uses [`SetManager::for_dataplane`].
    pub fn new() -> SetManager {
        SetManager::with_readers(None)
    }

    /// An empty manager whose sets are read without a lock or reference count inside the
    /// batches of the dataplane `quiescence` belongs to ([`crate::engine::Engine::quiescence`]); set
    /// updates retire old contents through its generations (never waiting for more than the
    /// rest of one batch per core) and lookups elsewhere take a read lock.
    pub fn for_dataplane(quiescence: Arc<Quiescence>) -> SetManager {
        SetManager::with_readers(Some(quiescence))
    }

    fn with_readers(quiescence: Option<Arc<Quiescence>>) -> SetManager {
        SetManager {
            sets: Mutex::default(),
            readers: Arc::new(Readers::new(quiescence)),
            node_addrs: Arc::default(),
            reached_hooks: std::sync::RwLock::default(),
        }
    }

    /// The dataplane generations lookups are protected by (`None`: every lookup locks).
    pub fn quiescence(&self) -> Option<&Arc<Quiescence>> {
        self.readers.quiescence()
    }

    /// The node's address facts compiled `-m addrtype` matches read; replace them with
    /// [`NodeAddrs::replace`](crate::node_addrs::NodeAddrs::replace) when the host's
    /// addresses change.
    pub fn node_addrs(&self) -> &Arc<crate::node_addrs::NodeAddrs> {
        &self.node_addrs
    }

    /// Says which hooks the node's packet path evaluates, for validation's
    /// [`crate::validate::ViolationKind::HookNotReached`] warnings (`None`: unknown, no
    /// warning).
    pub fn set_reached_hooks(&self, hooks: Option<crate::validate::ReachedHooks>) {
        *self
            .reached_hooks
            .write()
            .unwrap_or_else(|e| e.into_inner()) = hooks.map(Arc::new);
    }

    pub(in crate::sets) fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Arc<SetHandle>>> {
        // A writer that panicked left the map itself consistent (contents are published whole).
        self.sets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The handle of `name` (what a compiled snapshot keeps).
    pub fn handle(&self, name: &str) -> Option<Arc<SetHandle>> {
        self.lock().get(name).cloned()
    }

    /// How many handles of `name` exist besides the manager's own (compiled snapshots, ...);
    /// `None` when the set does not exist.
    pub fn handle_count(&self, name: &str) -> Option<usize> {
        self.lock().get(name).map(|h| Arc::strong_count(h) - 1)
    }

    /// Set names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Creates an empty set.
    pub fn create(&self, name: &str, spec: SetSpec) -> Result<(), SetError> {
        let mut sets = self.lock();
        Self::create_locked(&mut sets, &self.readers, name, spec)
    }

    pub(in crate::sets) fn create_locked(
        sets: &mut BTreeMap<String, Arc<SetHandle>>,
        readers: &Arc<Readers>,
        name: &str,
        spec: SetSpec,
    ) -> Result<(), SetError> {
        check_name(name).map_err(|why| SetError::BadName(name.into(), why))?;
        if sets.contains_key(name) {
            return Err(SetError::Exists(name.into()));
        }
        let handle = SetHandle::new(&spec, Arc::clone(readers));
        sets.insert(name.into(), Arc::new(handle));
        Ok(())
    }

    /// Removes the set's name. Handles still held keep its last content (see module docs).
    pub fn destroy(&self, name: &str) -> Result<(), SetError> {
        self.lock()
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| SetError::NotFound(name.into()))
    }

    /// Parses element texts for set `name` (see [`Element::parse`]).
    pub fn parse_elements(&self, name: &str, texts: &[&str]) -> Result<Vec<Element>, SetError> {
        let h = self
            .handle(name)
            .ok_or_else(|| SetError::NotFound(name.into()))?;
        let spec = h.spec(h.content.lock().live());
        let mut out = Vec::new();
        for t in texts {
            out.extend(
                Element::parse(&spec, t).map_err(|reason| SetError::BadElement {
                    set: name.into(),
                    element: (*t).into(),
                    reason,
                })?,
            );
        }
        Ok(out)
    }

    /// Adds elements in one publication (all or none). An element already present gets its
    /// timeout renewed and keeps its counters (as `ipset add -exist`).
    pub fn add(
        &self,
        name: &str,
        elements: impl IntoIterator<Item = (Element, AddOptions)>,
        now: u64,
    ) -> Result<(), SetError> {
        let sets = self.lock();
        let mut st = Self::stage(&sets, name)?;
        st.add(name, elements, now)?;
        st.publish();
        Ok(())
    }

    /// Adds element texts with default options (convenience over [`SetManager::add`]).
    pub fn add_str(&self, name: &str, texts: &[&str], now: u64) -> Result<(), SetError> {
        let elements = self.parse_elements(name, texts)?;
        self.add(
            name,
            elements.into_iter().map(|e| (e, AddOptions::default())),
            now,
        )
    }

    /// Adds `add` and deletes `delete` in one publication (readers see both or neither);
    /// returns how many deleted elements were present. Deletions apply after additions.
    pub fn update(
        &self,
        name: &str,
        add: impl IntoIterator<Item = (Element, AddOptions)>,
        delete: impl IntoIterator<Item = Element>,
        now: u64,
    ) -> Result<usize, SetError> {
        let sets = self.lock();
        let p = Self::prepare_locked(&sets, name, add, delete, now)?;
        let n = p.deleted;
        p.publish();
        Ok(n)
    }

    /// As [`SetManager::update`], but returns the change unpublished (see [`Prepared`] for
    /// the caller's part). Errors as `update`; on error nothing is staged.
    pub fn prepare_update(
        &self,
        name: &str,
        add: impl IntoIterator<Item = (Element, AddOptions)>,
        delete: impl IntoIterator<Item = Element>,
        now: u64,
    ) -> Result<Prepared, SetError> {
        let sets = self.lock();
        Self::prepare_locked(&sets, name, add, delete, now)
    }

    pub(in crate::sets) fn prepare_locked(
        sets: &BTreeMap<String, Arc<SetHandle>>,
        name: &str,
        add: impl IntoIterator<Item = (Element, AddOptions)>,
        delete: impl IntoIterator<Item = Element>,
        now: u64,
    ) -> Result<Prepared, SetError> {
        let mut st = Self::stage(sets, name)?;
        st.add(name, add, now)?;
        let deleted = st.remove_all(delete);
        Ok(Prepared {
            staged: st,
            deleted,
        })
    }

    /// Adds elements with absolute expiries (ns on the caller's clock, `u64::MAX` never) and
    /// fresh counters, in one publication (all or none): how a persisted set is loaded back.
    ///
    /// Errors: [`SetError::NotFound`], [`SetError::Full`].
    pub fn load(
        &self,
        name: &str,
        elements: impl IntoIterator<Item = (Element, u64)>,
    ) -> Result<(), SetError> {
        let sets = self.lock();
        let mut st = Self::stage(&sets, name)?;
        st.insert_until(name, elements)?;
        st.publish();
        Ok(())
    }

    /// The header of `name`.
    pub fn summary(&self, name: &str) -> Option<SetSummary> {
        let sets = self.lock();
        sets.get(name).map(|h| Self::summary_of(name, h))
    }

    /// The headers of every set, by name.
    pub fn summaries(&self) -> Vec<SetSummary> {
        let sets = self.lock();
        sets.iter().map(|(n, h)| Self::summary_of(n, h)).collect()
    }

    pub(in crate::sets) fn summary_of(name: &str, h: &SetHandle) -> SetSummary {
        let w = h.content.lock();
        SetSummary {
            name: name.into(),
            spec: h.spec(w.live()),
            entries: w.live().len(),
        }
    }

    /// Deletes elements in one publication; returns how many were present.
    pub fn delete(
        &self,
        name: &str,
        elements: impl IntoIterator<Item = Element>,
    ) -> Result<usize, SetError> {
        let sets = self.lock();
        let mut st = Self::stage(&sets, name)?;
        let n = st.remove_all(elements);
        st.publish();
        Ok(n)
    }

    /// Deletes element texts (convenience over [`SetManager::delete`]).
    pub fn delete_str(&self, name: &str, texts: &[&str]) -> Result<usize, SetError> {
        let elements = self.parse_elements(name, texts)?;
        self.delete(name, elements)
    }

    /// Removes every element.
    pub fn flush(&self, name: &str) -> Result<(), SetError> {
        let sets = self.lock();
        let h = sets
            .get(name)
            .ok_or_else(|| SetError::NotFound(name.into()))?;
        h.content.publish(Delta {
            clear: true,
            ..Delta::default()
        });
        Ok(())
    }

    /// Exchanges the contents (elements and options) of two sets of the same type and family;
    /// existing handles see the exchanged contents (see module docs).
    pub fn swap(&self, a: &str, b: &str) -> Result<(), SetError> {
        let sets = self.lock();
        let ha = sets.get(a).ok_or_else(|| SetError::NotFound(a.into()))?;
        let hb = sets.get(b).ok_or_else(|| SetError::NotFound(b.into()))?;
        if ha.kind != hb.kind || ha.family != hb.family {
            return Err(SetError::Incompatible(a.into(), b.into()));
        }
        // Every handle of a manager shares its `Readers`, so this cannot fail.
        let exchanged = LeftRight::exchange(&ha.content, &hb.content);
        debug_assert!(exchanged, "sets of one manager share their readers");
        Ok(())
    }

    /// Frees expired elements (matching already ignores them); returns how many.
    pub fn gc(&self, now: u64) -> usize {
        let sets = self.lock();
        let mut freed = 0;
        for h in sets.values() {
            let mut w = h.content.lock();
            let changes: rustc_hash::FxHashMap<Element, Option<Entry>> = (w.live().iter())
                .filter(|(_, e)| now >= e.expires)
                .map(|(k, _)| (k, None))
                .collect();
            if changes.is_empty() {
                continue;
            }
            freed += changes.len();
            h.content.publish_locked(
                &mut w,
                Delta {
                    clear: false,
                    changes,
                },
            );
        }
        freed
    }

    /// The set as `ipset list` shows it at `now` (live elements only, sorted).
    pub fn list(&self, name: &str, now: u64) -> Result<SetInfo, SetError> {
        let sets = self.lock();
        Self::list_locked(&sets, name, now)
    }

    pub(in crate::sets) fn list_locked(
        sets: &BTreeMap<String, Arc<SetHandle>>,
        name: &str,
        now: u64,
    ) -> Result<SetInfo, SetError> {
        let h = sets
            .get(name)
            .ok_or_else(|| SetError::NotFound(name.into()))?;
        let w = h.content.lock();
        let c = w.live();
        let spec = h.spec(c);
        let mut elements: Vec<ListedElement> = c
            .iter()
            .filter(|(_, e)| now < e.expires)
            .map(|(k, e)| ListedElement {
                element: k,
                text: k.display(&spec),
                timeout: spec.timeout.map(|_| {
                    if e.expires == u64::MAX {
                        0
                    } else {
                        (e.expires - now).div_ceil(NS_PER_S)
                    }
                }),
                counters: e.counters.as_ref().map(|c| {
                    (
                        c.packets.load(Ordering::Relaxed),
                        c.bytes.load(Ordering::Relaxed),
                    )
                }),
            })
            .collect();
        elements.sort_by_key(|e| e.element);
        Ok(SetInfo {
            name: name.into(),
            spec,
            elements,
        })
    }

    /// An empty change of `name` to build and publish later.
    pub(in crate::sets) fn stage(
        sets: &BTreeMap<String, Arc<SetHandle>>,
        name: &str,
    ) -> Result<Staged, SetError> {
        let h = sets
            .get(name)
            .ok_or_else(|| SetError::NotFound(name.into()))?;
        let w = h.content.lock();
        Ok(Staged {
            handle: Arc::clone(h),
            opts: w.live().opts,
            len: w.live().len(),
            delta: Delta::default(),
            log: None,
        })
    }
}

impl Staged {
    pub(in crate::sets) fn spec(&self) -> SetSpec {
        self.handle.spec_of(&self.opts)
    }

    /// The element's entry as it will be after this change (expired ones included).
    fn get<'a>(&'a self, live: &'a Content, e: &Element) -> Option<&'a Entry> {
        match self.delta.changes.get(e) {
            Some(v) => v.as_ref(),
            None if self.delta.clear => None,
            None => live.get(e),
        }
    }

    /// Sets `e` to `make(its entry as it is with this change so far)`, unless adding it would
    /// exceed `maxelem`. One probe of the change and at most one of the live copy.
    fn put_with(
        &mut self,
        live: &Content,
        name: &str,
        e: Element,
        make: impl FnOnce(Option<&Entry>) -> Entry,
    ) -> Result<(), SetError> {
        use std::collections::hash_map::Entry as Slot;
        let (len, maxelem) = (&mut self.len, self.opts.maxelem);
        let mut count_new = || {
            if *len >= maxelem as usize {
                return Err(SetError::Full {
                    set: name.into(),
                    maxelem,
                });
            }
            *len += 1;
            Ok(())
        };
        match self.delta.changes.entry(e) {
            Slot::Occupied(mut o) => {
                if o.get().is_none() {
                    count_new()?;
                }
                let new = make(o.get().as_ref());
                o.insert(Some(new));
            }
            Slot::Vacant(v) => {
                let old = if self.delta.clear { None } else { live.get(&e) };
                if old.is_none() {
                    count_new()?;
                }
                v.insert(Some(make(old)));
            }
        }
        Ok(())
    }

    /// Removes each element from the change; returns how many were present.
    pub(in crate::sets) fn remove_all(
        &mut self,
        elements: impl IntoIterator<Item = Element>,
    ) -> usize {
        let handle = Arc::clone(&self.handle);
        let w = handle.content.lock();
        let mut n = 0;
        for e in elements {
            if self.get(w.live(), &e).is_some() {
                n += 1;
                self.len -= 1;
                self.delta.changes.insert(e, None);
            }
        }
        n
    }

    pub(in crate::sets) fn add(
        &mut self,
        name: &str,
        elements: impl IntoIterator<Item = (Element, AddOptions)>,
        now: u64,
    ) -> Result<(), SetError> {
        let opts = self.opts;
        let handle = Arc::clone(&self.handle);
        let w = handle.content.lock();
        let elements = elements.into_iter();
        self.delta.changes.reserve(elements.size_hint().0);
        for (e, add) in elements {
            // As ipset: per-element options need the set to have been created with them.
            let unsupported = if add.timeout.is_some() && opts.timeout.is_none() {
                Some("the set was created without timeout")
            } else if add.counters.is_some() && !opts.counters {
                Some("the set was created without counters")
            } else {
                None
            };
            if let Some(reason) = unsupported {
                return Err(SetError::BadElement {
                    set: name.into(),
                    element: e.display(&self.spec()),
                    reason: reason.into(),
                });
            }
            let expires = expiry(opts.timeout, &add, now);
            // Explicit counters go into fresh ones: the old `Arc` is shared with the published
            // content, and writing it now would change the live set before (or without) a
            // publish. Otherwise the element keeps its counters.
            let make = |old: Option<&Entry>| {
                let counters = opts.counters.then(|| match add.counters {
                    Some((p, b)) => Arc::new(Counters {
                        packets: AtomicU64::new(p),
                        bytes: AtomicU64::new(b),
                    }),
                    None => old.and_then(|o| o.counters.clone()).unwrap_or_default(),
                });
                Entry {
                    expires,
                    counters,
                    verdict: e.verdict,
                }
            };
            self.check_verdict(name, &e)?;
            self.put_with(w.live(), name, e, make)?;
            if let Some(log) = &mut self.log {
                log.push((e, expires));
            }
        }
        Ok(())
    }

    /// Inserts elements with absolute expiries (ns; `u64::MAX` never), fresh counters.
    pub(in crate::sets) fn insert_until(
        &mut self,
        name: &str,
        elements: impl IntoIterator<Item = (Element, u64)>,
    ) -> Result<(), SetError> {
        let counters = self.opts.counters;
        let handle = Arc::clone(&self.handle);
        let w = handle.content.lock();
        for (e, expires) in elements {
            let counters = counters.then(Arc::default);
            self.check_verdict(name, &e)?;
            self.put_with(w.live(), name, e, |_| Entry {
                expires,
                counters,
                verdict: e.verdict,
            })?;
        }
        Ok(())
    }

    /// Refuses an element without a verdict in a verdict map and one with a verdict in a
    /// plain set; the first element a set ever gets decides which it is
    /// ([`SetHandle::map`]).
    fn check_verdict(&self, name: &str, e: &Element) -> Result<(), SetError> {
        use super::content::{MAP, PLAIN, UNDECIDED};
        let want = if e.verdict != 0 { MAP } else { PLAIN };
        // Relaxed: the flag guards no other memory; writers of one set are serialized.
        let bad = |reason: String| SetError::BadElement {
            set: name.into(),
            element: e.display(&self.spec()),
            reason,
        };
        if !self.handle.may_carry(e.verdict) {
            return Err(bad(format!(
                "`{}`: no such chain in the map's table",
                crate::sets::verdict::text(e.verdict)
            )));
        }
        match (self.handle.map).compare_exchange(
            UNDECIDED,
            want,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(()),
            Err(now) if now == want => Ok(()),
            Err(now) => Err(bad(if now == MAP {
                "the set is a verdict map: each element needs ` : VERDICT`".into()
            } else {
                "the set is not a verdict map: an element takes no verdict".into()
            })),
        }
    }

    /// Keeps a log of every element [`Staged::add`] inserts, with its expiry.
    pub(in crate::sets) fn logged(mut self) -> Staged {
        self.log = Some(Vec::new());
        self
    }

    /// The logged additions (empty unless [`Staged::logged`]).
    pub(in crate::sets) fn log(&self) -> &[(Element, u64)] {
        self.log.as_deref().unwrap_or(&[])
    }

    /// Applies the change to the set's standby copy and flips it live ([`LeftRight::publish`]).
    pub(in crate::sets) fn publish(self) {
        if self.delta.clear || !self.delta.changes.is_empty() {
            self.handle.content.publish(self.delta);
        }
    }
}

// === Prepared ===

/// A change of one set, checked against its content and kept as a list of element changes, not
/// yet visible to readers: [`SetManager::prepare_update`] makes it, [`Prepared::publish`]
/// applies it to the standby copy and makes it visible in one store; dropping it discards it.
/// This lets a caller make the change durable elsewhere (the server's SQLite store) between
/// the check and the publication.
///
/// Contract: between prepare and publish the caller keeps every other writer of this set
/// out (the server holds its write lock); a publish applies its changes on top of changes
/// made in between (whose elements it may then overwrite or exceed `maxelem` with).
pub struct Prepared {
    pub(in crate::sets) staged: Staged,
    pub(in crate::sets) deleted: usize,
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("len", &self.staged.len)
            .field("deleted", &self.deleted)
            .finish()
    }
}

impl Prepared {
    /// How many of the elements to delete were present.
    pub fn deleted(&self) -> usize {
        self.deleted
    }

    /// The set's spec.
    pub fn spec(&self) -> SetSpec {
        self.staged.spec()
    }

    /// Makes the change visible (one atomic store; readers see all of it or none). Costs the
    /// change's size, not the set's; waits for no reader (module docs of [`crate::sets::ipset`]).
    pub fn publish(self) {
        self.staged.publish();
    }
}

/// A set's header as `ipset list -terse` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSummary {
    /// Name.
    pub name: String,
    /// Type, family and options.
    pub spec: SetSpec,
    /// Elements held, including expired ones not yet freed by [`SetManager::gc`] (as ipset's
    /// "Number of entries").
    pub entries: usize,
}
