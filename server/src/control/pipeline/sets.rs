//! ipset-style sets in the pipeline: create, destroy, add/delete elements, flush, swap,
//! import `ipset save` text, restore at start and garbage-collect expired elements, all without
//! a ruleset commit.
//!
//! Every change follows the commit pipeline's order: check (bad input changes nothing), make
//! the change durable in one store transaction, then publish it in the engine (one atomic
//! store per set, through [`vallum_engine::sets::Prepared`]). All of it runs under the
//! pipeline's write lock, so set changes and commits reach the engine in the order the store
//! made them durable, and a commit's validation never races a destroy. After a `kill -9` at
//! any point a set is as before the call or as after it: the engine's copy is rebuilt from the
//! store at start ([`Pipeline::restore_sets`], before the active revisions are loaded).
//!
//! Time: the engine's sets expire on the engine clock (ns since start); the store keeps
//! absolute wall-clock expiries (Unix ns). Both are taken at the same moment of each call, and
//! at start a stored expiry becomes "now + what was left", so a restart never extends a
//! timeout (elements that expired while vallumd was down are not loaded).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use vallum_engine::echo::quoted;
use vallum_engine::model::{Match, Ruleset, Target};
use vallum_engine::nft::LoweredSet;
use vallum_engine::sets::ipset::check_name;
use vallum_engine::sets::{
    AddOptions, Element, IpSet, SaveError, SetError, SetInfo, SetManager, SetRegistry, SetSpec,
    SetSummary,
};

use super::Pipeline;
use crate::control::store::sets::{ImportedSet, StoredElement};
use crate::error::{Error, FieldViolation, Reason, Result};

/// The sets a validation looks up: the pipeline's, and the engine sets an nft input's named
/// sets become before its commit creates them (in a scratch manager of their own, empty: a
/// rule's validation needs the set's type, not its elements). Everything else (node facts,
/// reached hooks, kernel-decided bits) is the pipeline's.
pub(super) struct Planned<'a> {
    real: &'a SetManager,
    planned: Option<SetManager>,
}

impl<'a> Planned<'a> {
    /// `real`, with `sets` that `real` does not have added.
    pub(super) fn new(real: &'a SetManager, sets: &[LoweredSet]) -> Planned<'a> {
        let missing: Vec<&LoweredSet> = sets
            .iter()
            .filter(|s| real.summary(&s.name).is_none())
            .collect();
        let planned = (!missing.is_empty()).then(|| {
            let m = SetManager::new();
            for s in missing {
                // A name the engine refuses is refused again, with its field, by the commit.
                let _ = m.create(&s.name, s.spec);
            }
            m
        });
        Planned { real, planned }
    }
}

impl SetRegistry for Planned<'_> {
    fn lookup(&self, name: &str) -> Option<Arc<dyn IpSet>> {
        SetRegistry::lookup(self.real, name)
            .or_else(|| SetRegistry::lookup(self.planned.as_ref()?, name))
    }

    fn node_addrs(&self) -> Option<Arc<vallum_engine::node_addrs::NodeAddrs>> {
        SetRegistry::node_addrs(self.real)
    }

    fn reached_hooks(&self) -> Option<Arc<vallum_engine::validate::ReachedHooks>> {
        SetRegistry::reached_hooks(self.real)
    }

    fn kernel_fact_bit(&self, family: vallum_engine::model::Family, text: &str) -> Option<u8> {
        SetRegistry::kernel_fact_bit(self.real, family, text)
    }
}

/// How often [`Pipeline::spawn_set_gc`] frees expired elements by default.
pub const SET_GC_INTERVAL: Duration = Duration::from_secs(10);

/// One element of a request, in ipset syntax; errors name it by its index in the request's
/// list (`elements[3]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementInput {
    /// ipset syntax (`10.0.0.0/8`, `192.0.2.1,tcp:80`).
    pub text: String,
    /// `timeout N` seconds (0: never expires); `None`: the set's default.
    pub timeout: Option<u32>,
}

/// What an add or delete did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElementsChanged {
    /// Elements added (or renewed) or deleted, after CIDR / range expansion.
    pub changed: u64,
    /// Elements in the set afterwards.
    pub entries: u64,
}

/// The resource name of a set.
pub fn set_resource(name: &str) -> String {
    format!("sets/{name}")
}

fn not_found(name: &str) -> Error {
    Error::NotFound {
        kind: "set",
        name: set_resource(name),
    }
}

/// Checks a set name against the engine's one grammar ([`check_name`]: 1 to 31 bytes, as
/// ipset; what `-m set --match-set NAME` can name), before anything else looks at it; the
/// message echoes at most a few dozen characters of the name.
///
/// Errors: [`Error::BadRequest`] on `field`.
pub fn check_set_name(field: &str, name: &str) -> Result<()> {
    check_name(name)
        .map_err(|why| Error::invalid(field, format!("set name {}: {why}", quoted(name))))
}

/// A [`SetError`] of an operation on set `name` (errors about elements are mapped by the
/// callers, which know the field).
fn set_error(e: SetError) -> Error {
    match e {
        SetError::BadName(n, why) => {
            Error::invalid("name", format!("set name {}: {why}", quoted(&n)))
        }
        SetError::Exists(n) => Error::AlreadyExists {
            kind: "set",
            name: set_resource(&n),
        },
        SetError::NotFound(n) => not_found(&n),
        SetError::Incompatible(a, b) => Error::Precondition {
            kind: "SET_TYPE",
            subject: set_resource(&a),
            message: format!(
                "the sets cannot be swapped: {a} and {b} differ in type or family (as ipset)"
            ),
        },
        SetError::BadElement {
            set,
            element,
            reason,
        } => Error::invalid(
            "elements",
            format!("set {set}: invalid element {element}: {reason}"),
        ),
        SetError::Full { set, maxelem } => Error::SetFull {
            set: set_resource(&set),
            maxelem,
        },
    }
}

/// Whether a rule of `rs` matches set `name` or dispatches through it (an nft verdict map).
fn references(rs: &Ruleset, name: &str) -> bool {
    rs.tables.iter().any(|t| {
        t.chains.iter().any(|c| {
            c.rules.iter().any(|r| {
                matches!(&r.target, Target::Vmap(v) if v.map == name)
                    || r.matches
                        .iter()
                        .any(|m| matches!(m, Match::Set(s) if s.name == name))
            })
        })
    })
}

/// The stored texts of the map elements among `elements` that the set holds with another
/// verdict now (their rows are replaced; an element's text holds its verdict).
fn replaced_rows<'a>(
    handle: &vallum_engine::sets::SetHandle,
    spec: &SetSpec,
    elements: impl Iterator<Item = &'a Element>,
) -> Vec<String> {
    elements
        .filter_map(|e| {
            let now = handle.verdict_of(e)?;
            (now != e.verdict()).then(|| e.with_verdict(now).display(spec))
        })
        .collect()
}

/// An engine expiry (ns on the engine clock, `u64::MAX` never) as a wall-clock expiry.
fn wall_expiry(expires: u64, now: u64, wall: i64) -> Option<i64> {
    (expires != u64::MAX).then(|| {
        wall.saturating_add(i64::try_from(expires.saturating_sub(now)).unwrap_or(i64::MAX))
    })
}

/// A wall-clock expiry as an engine expiry; `None` when it passed.
fn engine_expiry(expires_at: Option<i64>, now: u64, wall: i64) -> Option<u64> {
    match expires_at {
        None => Some(u64::MAX),
        Some(w) if w <= wall => None,
        Some(w) => Some(now.saturating_add(u64::try_from(w - wall).unwrap_or(0))),
    }
}

impl Pipeline {
    /// Loads the stored sets into the engine's registry; call once at start, BEFORE
    /// [`Pipeline::load`] (the active revisions may reference the sets). Elements whose
    /// timeout passed while vallumd was down are skipped; an element that no longer parses
    /// is reported on stderr and not loaded (as `load` does with a revision). Returns how
    /// many sets were loaded.
    ///
    /// Errors: [`Error::Store`].
    pub async fn restore_sets(&self) -> Result<usize> {
        let _w = self.write.lock().await;
        let wall = self.clock.unix_ns();
        let now = self.clock.now_ns();
        let stored = self.store.load_sets(wall).await?;
        let n = stored.len();
        for s in stored {
            if let Err(e) = self.sets.create(&s.name, s.spec) {
                tracing::error!(set = %s.name, error = %e, "stored set not loaded");
                continue;
            }
            let mut elements = Vec::with_capacity(s.elements.len());
            for e in &s.elements {
                let Some(expires) = engine_expiry(e.expires_at, now, wall) else {
                    continue;
                };
                match Element::parse(&s.spec, &e.text) {
                    Ok(parsed) => elements.extend(parsed.into_iter().map(|p| (p, expires))),
                    Err(why) => tracing::error!(
                        set = %s.name,
                        element = ?e.text,
                        error = %why,
                        "stored element not loaded"
                    ),
                }
            }
            if let Err(e) = self.sets.load(&s.name, elements) {
                tracing::error!(
                    set = %s.name,
                    error = %e,
                    "the stored set's elements are not loaded"
                );
            }
        }
        Ok(n)
    }

    /// Active rulesets whose rules reference set `name` (`-m set --match-set NAME`), by name.
    pub fn set_references(&self, name: &str) -> Vec<String> {
        self.engine
            .rulesets()
            .into_iter()
            .filter(|(_, rs)| references(rs, name))
            .map(|(n, _)| n)
            .collect()
    }

    /// Revisions a pending commit-confirmed would restore (on timeout) that reference set
    /// `name`, as `rulesets/R/revisions/N`: destroying the set would make that rollback fail.
    async fn pending_restore_references(&self, name: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for c in self.store.pending_confirms().await? {
            let Some(prev) = c.previous else { continue };
            let Some(rev) = self.store.get_revision(&c.ruleset, prev).await? else {
                continue;
            };
            if let Ok(m) = rev.content.to_ruleset(&c.ruleset, 0) {
                if references(&m, name) {
                    out.push(format!("rulesets/{}/revisions/{prev}", c.ruleset));
                }
            }
        }
        Ok(out)
    }

    /// Creates an empty set (`ipset create`). With `exist`, an existing set with the same
    /// spec is not an error (as `ipset create -exist`).
    ///
    /// Errors: [`Error::BadRequest`] for the name; [`Error::AlreadyExists`]; [`Error::Store`].
    pub async fn create_set(&self, name: &str, spec: SetSpec, exist: bool) -> Result<SetSummary> {
        check_set_name("name", name)?;
        let _w = self.write.lock().await;
        if let Some(cur) = self.sets.summary(name) {
            if exist && cur.spec == spec {
                return Ok(cur);
            }
            return Err(Error::AlreadyExists {
                kind: "set",
                name: set_resource(name),
            });
        }
        (self.hooks.limits).check_new_sets(self.sets.names().len(), [(name, spec.maxelem)])?;
        self.store
            .create_set(name, &spec, self.clock.unix_ns())
            .await?;
        self.sets.create(name, spec).map_err(set_error)?;
        self.sets
            .summary(name)
            .ok_or_else(|| Error::store_corrupt(format!("set {name} vanished after create")))
    }

    /// Creates the engine sets an nft ruleset's named sets become (`sets`, from
    /// [`vallum_engine::nft::lower()`]), each with its elements, before a commit of the ruleset
    /// validates against them: a set that does not exist is created (`--max-sets` applies);
    /// one that exists with the same spec keeps its elements and gets the listed ones added
    /// (as `nft -f` adds a set's listed elements to the set of that name). Each step is
    /// durable as [`Pipeline::create_set`] and [`Pipeline::add_elements`] make theirs.
    /// Returns the names of the sets it created, for [`Pipeline::settle_nft_sets`] when the
    /// commit does not happen; on an error the sets it created are destroyed again.
    ///
    /// Errors: [`Error::AlreadyExists`] when a set of that name exists with another spec
    /// (type, family, timeout); as [`Pipeline::create_set`]; [`Error::SetFull`].
    pub async fn ensure_nft_sets(&self, sets: &[LoweredSet]) -> Result<Vec<String>> {
        let mut created = Vec::new();
        for s in sets {
            let existed = self.sets.summary(&s.name).is_some();
            // An nft set without `size` (bounded by memory only, MAX_SET_ELEMENTS in the
            // engine's lowering) takes up to `--max-set-elements`, or its listed elements.
            let mut spec = s.spec;
            if spec.maxelem as usize == vallum_engine::nft::MAX_SET_ELEMENTS {
                let listed = u32::try_from(s.elements.len()).unwrap_or(u32::MAX);
                spec.maxelem = self.hooks.limits.max_set_elements.max(listed);
            }
            let step = async {
                self.create_set(&s.name, spec, true).await?;
                if !existed {
                    created.push(s.name.clone());
                }
                // A verdict map's listed elements may name chains this commit brings.
                if let Some(h) = self.sets.handle(&s.name) {
                    h.allow_verdicts(s.elements.iter().map(|(e, _)| e.verdict()));
                }
                self.add_listed(&s.name, &s.elements).await
            };
            if let Err(e) = step.await {
                self.undo_nft_sets(&created).await;
                return Err(e);
            }
        }
        Ok(created)
    }

    /// The end of a commit that [`Pipeline::ensure_nft_sets`] prepared: `done` as it is, after
    /// destroying the sets it `created` when the commit failed (nothing references them then).
    pub async fn settle_nft_sets<T>(&self, created: &[String], done: Result<T>) -> Result<T> {
        if done.is_err() {
            self.undo_nft_sets(created).await;
        }
        done
    }

    /// Destroys the sets [`Pipeline::ensure_nft_sets`] created for a commit that did not
    /// happen (nothing references them then); a failure is logged.
    async fn undo_nft_sets(&self, created: &[String]) {
        for name in created {
            if let Err(e) = self.destroy_set(name, None).await {
                tracing::warn!(set = %name, error = %e, "set created for a refused nft commit not destroyed");
            }
        }
    }

    /// Adds parsed elements with their options to set `set` (existing ones renewed, as
    /// `ipset add -exist`), store first, then the engine.
    async fn add_listed(&self, set: &str, elements: &[(Element, AddOptions)]) -> Result<()> {
        if elements.is_empty() {
            return Ok(());
        }
        let _w = self.write.lock().await;
        let spec = self.sets.summary(set).ok_or_else(|| not_found(set))?.spec;
        let now = self.clock.now_ns();
        let wall = self.clock.unix_ns();
        let stored: Vec<StoredElement> = elements
            .iter()
            .map(|(e, opts)| StoredElement {
                text: e.display(&spec),
                expires_at: wall_expiry(spec.expiry(opts, now), now, wall),
            })
            .collect();
        let replaced = match self.sets.handle(set) {
            Some(h) => replaced_rows(&h, &spec, elements.iter().map(|(e, _)| e)),
            None => Vec::new(),
        };
        let prepared = self
            .sets
            .prepare_update(set, elements.iter().copied(), [], now)
            .map_err(set_error)?;
        self.store
            .change_elements(set, &stored, &replaced, None)
            .await?;
        prepared.publish();
        Ok(())
    }

    /// Destroys a set (`ipset destroy`).
    ///
    /// Errors: [`Error::NotFound`]; [`Error::Precondition`] (`SET_IN_USE`) while an active
    /// ruleset references it (as ipset: "Set cannot be destroyed: it is in use by a kernel
    /// component"), or the revision a pending commit-confirmed would restore does;
    /// [`Error::EtagMismatch`] when `etag` is given and is not the set's; [`Error::Store`].
    pub async fn destroy_set(&self, name: &str, etag: Option<&str>) -> Result<()> {
        let _w = self.write.lock().await;
        if self.sets.summary(name).is_none() {
            return Err(not_found(name));
        }
        let mut users = self.set_references(name);
        // A commit-confirmed's restore target counts too (its rollback would fail).
        for rev in self.pending_restore_references(name).await? {
            users.push(format!(
                "{rev} (restored if the pending commit is not confirmed)"
            ));
        }
        if !users.is_empty() {
            return Err(Error::Precondition {
                kind: "SET_IN_USE",
                subject: set_resource(name),
                message: format!(
                    "Set cannot be destroyed: it is in use by a kernel component (active rulesets: {})",
                    users.join(", ")
                ),
            });
        }
        self.store.destroy_set(name, etag).await?;
        self.sets.destroy(name).map_err(set_error)
    }

    /// Parses request elements for a set of `spec`: every bad element is listed.
    fn parse_inputs(
        spec: &SetSpec,
        field: &str,
        inputs: &[ElementInput],
        with_timeouts: bool,
    ) -> Result<Vec<(usize, Element, AddOptions)>> {
        let mut out = Vec::with_capacity(inputs.len());
        let mut violations = Vec::new();
        for (i, input) in inputs.iter().enumerate() {
            if with_timeouts && input.timeout.is_some() && spec.timeout.is_none() {
                violations.push(FieldViolation::new(
                    format!("{field}[{i}].timeout"),
                    "the set was created without timeout (as ipset)",
                ));
                continue;
            }
            match Element::parse(spec, &input.text) {
                Ok(es) => {
                    let opts = AddOptions {
                        timeout: input.timeout.filter(|_| with_timeouts),
                        counters: None,
                    };
                    out.extend(es.into_iter().map(|e| (i, e, opts)));
                    // Each text expands to at most 65536 elements, but a request may hold
                    // many: stop before holding more than the set could ever have.
                    if out.len() as u64 > u64::from(spec.maxelem) {
                        violations.push(FieldViolation::new(
                            format!("{field}[{i}]"),
                            format!(
                                "the request expands to more than the set's maxelem ({}) elements",
                                spec.maxelem
                            ),
                        ));
                        break;
                    }
                }
                Err(why) => violations.push(FieldViolation::new(
                    format!("{field}[{i}]"),
                    format!("invalid element {}: {why}", quoted(&input.text)),
                )),
            }
        }
        if violations.is_empty() {
            Ok(out)
        } else {
            Err(Error::BadRequest {
                reason: Reason::InvalidArgument,
                violations,
            })
        }
    }

    /// Adds elements (request field `field`) to a set in one step, all or none (`ipset add`; with `exist`, an element
    /// already there gets its timeout renewed instead of failing, as `ipset add -exist`).
    ///
    /// Errors: [`Error::NotFound`] (set); [`Error::BadRequest`] naming each bad element's
    /// field; [`Error::AlreadyExists`] (an element is there, without `exist`);
    /// [`Error::SetFull`]; [`Error::EtagMismatch`] when `etag` is given and is not the
    /// set's; [`Error::Store`].
    pub async fn add_elements(
        &self,
        set: &str,
        field: &str,
        inputs: &[ElementInput],
        exist: bool,
        etag: Option<&str>,
    ) -> Result<ElementsChanged> {
        let _w = self.write.lock().await;
        let handle = self.sets.handle(set).ok_or_else(|| not_found(set))?;
        let spec = self.sets.summary(set).ok_or_else(|| not_found(set))?.spec;
        let parsed = Self::parse_inputs(&spec, field, inputs, true)?;
        let now = self.clock.now_ns();
        let wall = self.clock.unix_ns();
        if !exist {
            let mut seen = HashSet::with_capacity(parsed.len());
            for (i, e, _) in &parsed {
                if handle.test(e, now) || !seen.insert(*e) {
                    return Err(Error::AlreadyExists {
                        kind: "element",
                        name: format!(
                            "{}: {} ({field}[{i}]; it's already added, as ipset without -exist)",
                            set_resource(set),
                            e.display(&spec),
                        ),
                    });
                }
            }
        }
        // A map element stored with another verdict: its old row goes (the store keys
        // elements by their text, which holds the verdict).
        let replaced = replaced_rows(&handle, &spec, parsed.iter().map(|(_, e, _)| e));
        drop(handle);
        let stored: Vec<StoredElement> = parsed
            .iter()
            .map(|(_, e, opts)| StoredElement {
                text: e.display(&spec),
                expires_at: wall_expiry(spec.expiry(opts, now), now, wall),
            })
            .collect();
        let prepared = self
            .sets
            .prepare_update(set, parsed.iter().map(|(_, e, o)| (*e, *o)), [], now)
            .map_err(set_error)?;
        self.store
            .change_elements(set, &stored, &replaced, etag)
            .await?;
        prepared.publish();
        Ok(ElementsChanged {
            changed: stored.len() as u64,
            entries: self.entries(set),
        })
    }

    /// Deletes elements (request field `field`) from a set in one step, all or none (`ipset del`; with `exist`, an
    /// element that is not there is not an error).
    ///
    /// Errors: [`Error::NotFound`] (the set, or an element without `exist`);
    /// [`Error::BadRequest`] naming each bad element's field; [`Error::EtagMismatch`] when
    /// `etag` is given and is not the set's; [`Error::Store`].
    pub async fn delete_elements(
        &self,
        set: &str,
        field: &str,
        inputs: &[ElementInput],
        exist: bool,
        etag: Option<&str>,
    ) -> Result<ElementsChanged> {
        let _w = self.write.lock().await;
        let handle = self.sets.handle(set).ok_or_else(|| not_found(set))?;
        let spec = self.sets.summary(set).ok_or_else(|| not_found(set))?.spec;
        let parsed = Self::parse_inputs(&spec, field, inputs, false)?;
        let now = self.clock.now_ns();
        if !exist {
            let mut seen = HashSet::with_capacity(parsed.len());
            for (i, e, _) in &parsed {
                if !handle.test(e, now) || !seen.insert(*e) {
                    return Err(Error::NotFound {
                        kind: "element",
                        name: format!(
                            "{}: {} ({field}[{i}]; it's not added, as ipset without -exist)",
                            set_resource(set),
                            e.display(&spec),
                        ),
                    });
                }
            }
        }
        // A map element's row holds its verdict: the one it has now (`DELETE KEY` as nft).
        let texts: Vec<String> = parsed
            .iter()
            .map(|(_, e, _)| {
                let verdict = handle.verdict_of(e).unwrap_or(e.verdict());
                e.with_verdict(verdict).display(&spec)
            })
            .collect();
        drop(handle);
        let prepared = self
            .sets
            .prepare_update(set, [], parsed.iter().map(|(_, e, _)| *e), now)
            .map_err(set_error)?;
        let deleted = prepared.deleted() as u64;
        self.store.change_elements(set, &[], &texts, etag).await?;
        prepared.publish();
        Ok(ElementsChanged {
            changed: deleted,
            entries: self.entries(set),
        })
    }

    fn entries(&self, set: &str) -> u64 {
        self.sets.summary(set).map_or(0, |s| s.entries as u64)
    }

    /// Removes every element of a set (`ipset flush`).
    ///
    /// Errors: [`Error::NotFound`]; [`Error::EtagMismatch`] when `etag` is given and is not
    /// the set's; [`Error::Store`].
    pub async fn flush_set(&self, name: &str, etag: Option<&str>) -> Result<()> {
        let _w = self.write.lock().await;
        if self.sets.summary(name).is_none() {
            return Err(not_found(name));
        }
        self.store.flush_set(name, etag).await?;
        self.sets.flush(name).map_err(set_error)
    }

    /// Exchanges two sets' contents (`ipset swap`); rules referencing either name see the
    /// other's former elements from then on, without a commit.
    ///
    /// Errors: [`Error::NotFound`]; [`Error::Precondition`] (`SET_TYPE`) when type or family
    /// differ; [`Error::EtagMismatch`] when one of `etags` (of `a`, of `b`) is given and is
    /// not its set's; [`Error::Store`].
    pub async fn swap_sets(&self, a: &str, b: &str, etags: [Option<&str>; 2]) -> Result<()> {
        let _w = self.write.lock().await;
        let sa = self.sets.summary(a).ok_or_else(|| not_found(a))?;
        let sb = self.sets.summary(b).ok_or_else(|| not_found(b))?;
        if (sa.spec.kind, sa.spec.family) != (sb.spec.kind, sb.spec.family) {
            return Err(set_error(SetError::Incompatible(a.into(), b.into())));
        }
        if a == b {
            return Ok(());
        }
        self.store.swap_sets(a, b, etags).await?;
        self.sets.swap(a, b).map_err(set_error)
    }

    /// Applies `ipset save` text (`create` and `add` lines), all or nothing (`ipset
    /// restore`). Returns the lines applied and the sets created or added to.
    ///
    /// Errors: [`Error::BadRequest`] on `field` with `FILE:LINE:COL: message` (bad syntax,
    /// unknown set, a set that exists, a bad element, a full set); [`Error::Store`].
    pub async fn import_sets(
        &self,
        field: &str,
        filename: &str,
        text: &str,
    ) -> Result<(usize, Vec<String>)> {
        let bad = |e: &SaveError| Error::BadRequest {
            reason: Reason::InvalidArgument,
            violations: vec![FieldViolation::new(field, format!("{filename}:{e}"))],
        };
        let _w = self.write.lock().await;
        let now = self.clock.now_ns();
        let wall = self.clock.unix_ns();
        let prepared = self.sets.prepare_restore(text, now).map_err(|e| bad(&e))?;
        let created = (prepared.sets())
            .filter(|s| s.created)
            .map(|s| (s.name, s.spec.maxelem));
        (self.hooks.limits).check_new_sets(self.sets.names().len(), created)?;
        let mut imported = Vec::new();
        for s in prepared.sets() {
            check_set_name(field, s.name)?;
            imported.push(ImportedSet {
                name: s.name.to_string(),
                create: s.created.then_some(s.spec),
                added: s
                    .added
                    .iter()
                    .map(|(e, expires)| StoredElement {
                        text: e.display(&s.spec),
                        expires_at: wall_expiry(*expires, now, wall),
                    })
                    .collect(),
            });
        }
        self.store.import_sets(&imported, wall).await?;
        let lines = prepared.applied();
        prepared.publish(&self.sets);
        Ok((lines, imported.into_iter().map(|s| s.name).collect()))
    }

    /// A set with its live elements (`ipset list NAME`).
    ///
    /// Errors: [`Error::NotFound`].
    pub fn get_set(&self, name: &str) -> Result<SetInfo> {
        self.sets.list(name, self.clock.now_ns()).map_err(set_error)
    }

    /// `ipset save` text of one set or (`None`) of all.
    ///
    /// Errors: [`Error::NotFound`].
    pub fn export_sets(&self, name: Option<&str>) -> Result<String> {
        let all = self.sets.save(self.clock.now_ns());
        let Some(name) = name else {
            return Ok(all);
        };
        if self.sets.summary(name).is_none() {
            return Err(not_found(name));
        }
        Ok(all
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some(name))
            .flat_map(|l| [l, "\n"])
            .collect())
    }

    /// Frees expired elements in the engine and deletes them from the store; how many the
    /// engine freed.
    ///
    /// Errors: [`Error::Store`].
    pub async fn gc_sets(&self) -> Result<usize> {
        let _w = self.write.lock().await;
        let freed = self.sets.gc(self.clock.now_ns());
        self.store.expire_set_elements(self.clock.unix_ns()).await?;
        Ok(freed)
    }

    /// Runs [`Pipeline::gc_sets`] every `interval` until the returned task is aborted.
    pub fn spawn_set_gc(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
            loop {
                tick.tick().await;
                if let Err(e) = me.gc_sets().await {
                    tracing::warn!(error = %e, "set garbage collection failed");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_convert_between_clocks_without_extending() {
        let (now, wall) = (5_000, 1_000_000);
        assert_eq!(wall_expiry(u64::MAX, now, wall), None);
        assert_eq!(wall_expiry(now + 700, now, wall), Some(wall + 700));
        // Restart: the engine clock starts again near 0; 300 ns of wall time passed.
        assert_eq!(engine_expiry(Some(wall + 700), 10, wall + 300), Some(410));
        assert_eq!(engine_expiry(Some(wall + 700), 10, wall + 700), None);
        assert_eq!(engine_expiry(None, 10, wall), Some(u64::MAX));
    }

    #[test]
    fn request_expansion_is_bounded_by_maxelem() {
        use vallum_engine::model::Family;
        use vallum_engine::sets::SetType;
        let input = |t: &str| ElementInput {
            text: t.into(),
            timeout: None,
        };
        let refused_at = |maxelem: u32, inputs: &[ElementInput]| {
            let mut spec = SetSpec::new(SetType::HashIp, Family::Ipv4);
            spec.maxelem = maxelem;
            match Pipeline::parse_inputs(&spec, "elements", inputs, true) {
                Ok(v) => Err(v.len()),
                Err(Error::BadRequest { violations, .. }) => Ok(violations
                    .iter()
                    .map(|v| (v.field.clone(), v.description.contains("maxelem")))
                    .collect::<Vec<_>>()),
                Err(e) => panic!("{e}"),
            }
        };
        let two = [input("10.0.0.0/26"), input("10.0.1.0/26")];
        assert_eq!(refused_at(128, &two), Err(128));
        assert_eq!(
            refused_at(127, &two),
            Ok(vec![("elements[1]".to_string(), true)])
        );
        // Thousands of /16s (3e8 elements): refused at the first, the rest never expanded.
        let many: Vec<ElementInput> = (0..5000).map(|_| input("10.0.0.0/16")).collect();
        assert_eq!(
            refused_at(65535, &many),
            Ok(vec![("elements[0]".to_string(), true)])
        );
    }

    #[test]
    fn set_names() {
        assert!(check_set_name("name", "docker-ext-bridges-v4").is_ok());
        assert!(check_set_name("name", "").is_err());
        assert!(check_set_name("name", &"x".repeat(32)).is_err());
        assert!(check_set_name("name", "a b").is_err());
        // What `--match-set` cannot name cannot be created.
        assert!(check_set_name("name", "-x").is_err());
        assert!(check_set_name("name", "q\"").is_err());
        let long = check_set_name("name", &"x".repeat(10_000))
            .unwrap_err()
            .to_string();
        assert!(long.len() < 200, "{long}");
    }
}
