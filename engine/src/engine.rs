//! The engine: the active rulesets, the published [`Snapshot`] and the per-core workers that
//! classify packets, tied together by the commit protocol of [`crate::dataplane`].
//!
//! A commit ([`Engine::commit`]) runs these phases and times each one with the caller's
//! [`Clock`] (all durations in ns):
//! 1. **validate** every changed ruleset ([`crate::validate`]); any error aborts and changes
//!    nothing. A ruleset that replaces an active one of the same name is diffed against it
//!    chain by chain, and only its changed rules are checked one by one (same result as a
//!    full validation, see `validate_after` in [`crate::validate`]). A [`Change::Edit`]
//!    (insert, delete or replace rules by chain and number) makes the new ruleset from the
//!    active one, sharing every rule chunk it does not touch, so this diff and the compile's
//!    splice cost what the edit touched, not the size of the ruleset;
//! 2. **compile** all active rulesets with the change applied into a new [`Snapshot`],
//!    incrementally from the active one ([`Snapshot::compile_after`]: unchanged chains are
//!    shared, a few changed rules are spliced in and the chain's index updated), reusing the
//!    diffs validation computed;
//! 3. **publish** it (pointer swap + writer barrier) and 4. **quiesce**: wait only for the
//!    cores whose generation was odd (mid-batch), never for an RCU grace period, as x_tables'
//!    `xt_replace_table` does since 2021;
//! 5. **carry** counters of unchanged rules from the old snapshot into the new one: nothing
//!    to copy when the new snapshot counts in the old one's cells, where the rules it kept
//!    already count (the common case, see [`Snapshot::carry_from`]); by rule identity when
//!    it got fresh cells.
//!
//! The old snapshot comes back in [`Committed::retired`]; drop it off the commit path.
//! Commits are serialised by a mutex; workers never take it.
//!
//! # Publish now, retire later
//!
//! [`Engine::publish`] returns once the new snapshot is published (phase 3): every batch that
//! begins after it returns, so every packet a source hands to a worker after that, is decided
//! by the new rules. Phases 4 and 5 wait for cores that were mid-batch (a worker preempted
//! mid-batch on a busy host holds them for milliseconds), so they run later, off the caller's
//! path: the replaced snapshot joins a queue of outgoing snapshots, and [`Engine::settle`]
//! (the caller runs it on another thread after answering) waits for each one's cores, finishes
//! its carry and hands it back to be dropped. Counters stay exact meanwhile:
//! - the common commit counts in the old snapshot's cells ([`Snapshot::carry_from`]): a core
//!   still in a batch of the old snapshot adds to the very cells the new one reads, so there is
//!   nothing to carry and nothing to wait for before a read;
//! - a commit whose carry reads the old counts (fresh cells) or sets counters
//!   (`iptables-restore --counters`) leaves that carry pending on the last outgoing snapshot;
//!   whatever reads or changes counters first finishes it after the grace: the next
//!   [`Engine::publish`], [`Engine::counters`], [`Engine::zero_counters`] (and `_in`), or
//!   [`Engine::settle`]. Only the newest outgoing snapshot can have a pending carry (the next
//!   publish finishes it before it swaps), so the carry always goes into the active snapshot,
//!   and no count is lost or counted twice.
//!
//! At most [`MAX_OUTGOING`] replaced snapshots wait in the queue: a publish that finds it full
//! (cores that do not move on, or a caller that never settles) waits for the oldest.
//!
//! A commit can also be made in steps: [`Engine::validate_change`] (phase 1, the commit's one
//! validation), [`Engine::compile`] (phase 2; [`Engine::prepare`] is both) and
//! [`Engine::publish`] (phases 3-5); nothing is visible before publish. vallumd refuses an
//! invalid ruleset on the validation's verdict, compiles while it writes the revision to its
//! store and publishes once that is durable. A [`Prepared`] made before another commit was
//! published is refused as [`CommitError::Stale`].
//!
//! # Revisions
//! The caller may number what it commits ([`Prepared::set_revision`]: vallumd gives the
//! store's revision number) and ask which number runs ([`Engine::revisions`]); the engine
//! keeps the number with the active ruleset, drops it when the ruleset is replaced or
//! removed, and reads it for nothing else. The answer changes at publish, with what the cores
//! run, so it is the one in-memory owner of "which revision is active".
//!
//! # Shadow
//! One staged ruleset at a time may classify beside the active snapshot without deciding
//! anything ([`Engine::start_shadow`], `engine/shadow.rs`): its snapshot is published in a slot
//! of its own that the workers load inside their batches and retired with the same
//! generation counters ([`crate::dataplane::Quiescence`]). Any publish ends it (it was
//! compiled beside the rulesets the publish replaces; [`Engine::shadow_report`] has its last
//! report), and a commit that numbers the shadowed ruleset with the shadowed revision starts
//! its new rules' counters from the shadow's.
//!
//! # Conntrack
//! The engine owns one [`Conntrack`] table shared by all cores (unless
//! [`EngineConfig::conntrack`] is `None`). It lives outside the snapshots, so a commit keeps
//! every entry: established flows survive a ruleset change. [`EngineWorker::process`]
//! does per packet what netfilter does per hook: the raw-table base chains (priority -300,
//! where NOTRACK marks a packet UNTRACKED), then conntrack (-200) sets the packet's
//! `ct_state` ([`Conntrack::track`]; ICMP errors are RELATED through the header the parser
//! embedded in [`crate::packet::PacketFacts::embedded`]), then the other tables' chains,
//! whose `--ctstate` / `--state` matches read it. A new connection the table has no room for
//! (no entry could be dropped early) has its packet dropped, counted in
//! [`ConntrackStats::insert_failed`](crate::conntrack::ConntrackStats) and as a DROP verdict.
//!
//! The kernel tracks a packet once, at PREROUTING (or OUTPUT for local packets), and INPUT,
//! FORWARD and POSTROUTING reuse that state. Here a packet reaches the engine at one hook (its
//! `hook` field) and runs every chain it would have passed on the way there, in the kernel's
//! order: at INPUT and FORWARD, raw PREROUTING, then conntrack, then the other PREROUTING
//! chains, then the hook's own; at OUTPUT, raw OUTPUT, conntrack, filter OUTPUT (see the
//! evaluation order in [`crate::snapshot`]). So a raw PREROUTING DROP (Docker's guard for
//! container addresses) or NOTRACK decides an INPUT-queued packet as it does in the kernel.
//! A source must therefore not hand the same packet to the engine at two hooks (it would run
//! PREROUTING and be tracked twice).
//!
//! As in the kernel, a new connection's entry joins the table ("is confirmed",
//! [`Conntrack::confirm`]) only when the packet that opened it is accepted: a NEW packet the
//! rules drop or reject leaves no entry, so a dropped (possibly spoofed) first packet cannot
//! open a flow that a forged reply would then make ESTABLISHED. When the table is full at
//! that point and no entry can be dropped early, the accepted packet is dropped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::Clock;
use crate::conntrack::{Conntrack, ConntrackConfig};
use crate::dataplane::{
    BarrierStrategy, Dataplane, DataplaneError, Histogram, QuiesceReport, Retired, Unpublished,
};
use crate::kernel_decided::FactBits;
use crate::model::{Counters, EditError, Family, Hook, RuleEdit, Ruleset, TableKind};
use crate::packet::AsPacket;
use crate::sets::SetRegistry;
use crate::snapshot::{CompileError, DiffHint, LogEvent, LogRecord, SlotCounters, Snapshot, Trace};
use crate::validate::{Severity, Violation, ViolationKind, validate, validate_after};

mod outgoing;
mod shadow;
mod worker;

pub use outgoing::Settled;
use outgoing::{Outgoing, PendingCarry};
use shadow::ShadowSlot;
pub use shadow::{
    DEFAULT_SHADOW_FLOWS, MAX_SHADOW_FLOWS, SHADOW_SAMPLE_CAPACITY, ShadowConfig, ShadowEnd,
    ShadowFlow, ShadowReport, ShadowSample, VerdictPair,
};
use worker::VerdictCounts;
pub use worker::{Batch, EngineWorker, LOG_RING_CAPACITY, LogDrops};

/// How to build an [`Engine`].
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Number of worker cores (at least 1).
    pub cores: usize,
    /// Barrier strategy of the packet path; `Membarrier` falls back to `SeqCst` when the kernel
    /// lacks membarrier(2) (see [`Engine::barrier_fallback`]).
    pub barrier: BarrierStrategy,
    /// The connection table's sizes; `None` (or `max_entries` 0) turns conntrack off: packets
    /// keep the `ct_state` they come with (NEW by default) and nothing is tracked. Buckets and
    /// locks are clamped to 1..=2^30.
    pub conntrack: Option<ConntrackConfig>,
}

/// A change to the set of active rulesets.
#[derive(Clone, Debug)]
pub enum Change {
    /// Add a ruleset, or replace the active one of the same name.
    Put(Ruleset),
    /// Deactivate the ruleset with this name (no error if absent).
    Remove(String),
    /// Replace every active ruleset.
    ReplaceAll(Vec<Ruleset>),
    /// Replace the active ruleset of the same name with one made from it by edits (iptables
    /// commands, `iptables-restore --noflush` text: see [`crate::restore::parse_onto`]), whose
    /// tables share the rule chunks the edits left alone. As [`Change::Put`], except that the
    /// model's counters (`Rule::counters`, a chain's policy counters) are not started: the
    /// rules it kept go on counting where they are, as with [`Change::Edit`], and the new ones
    /// start at zero. Without an active ruleset of the name it is a [`Change::Put`] with no
    /// counters started.
    PutEdited(Ruleset),
    /// Edit single rules of the active ruleset `ruleset`: insert, delete or replace rules at
    /// a chain and rule number, as `iptables -I` / `-D N` / `-R` ([`RuleEdit`], applied in
    /// order by [`Ruleset::with_edits`]). The caller neither copies nor parses the whole
    /// ruleset: the edited ruleset shares every rule chunk the edits leave alone with the
    /// active one, so validation and compilation look at the changed rules (and the chunk
    /// pointers) only. The commit is exactly the one `Put` of the edited ruleset would make:
    /// the same validation findings, snapshot verdicts and carried counters.
    Edit {
        /// Name of the active ruleset to edit.
        ruleset: String,
        /// The edits, applied in order.
        edits: Vec<RuleEdit>,
    },
}

/// Why a commit was refused. Nothing changed in the engine.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Validation found errors (all of them are listed, warnings too).
    #[error("ruleset is invalid: {} error(s), first: {}", count_errors(.0), first_error(.0))]
    Invalid(Vec<Violation>),
    /// The compiler refused the ruleset (validation should have caught it first).
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// [`Change::Edit`] names a ruleset that is not active.
    #[error("no active ruleset {0}")]
    NoSuchRuleset(String),
    /// [`Change::Edit`]: an edit names a missing table or chain, or a rule number out of
    /// range.
    #[error(transparent)]
    Edit(#[from] EditError),
    /// [`Engine::publish`]: another commit was published after this one was prepared.
    #[error("another commit was published since this one was prepared")]
    Stale,
}

fn count_errors(v: &[Violation]) -> usize {
    v.iter().filter(|v| v.severity == Severity::Error).count()
}

fn first_error(v: &[Violation]) -> String {
    v.iter()
        .find(|v| v.severity == Severity::Error)
        .map_or_else(String::new, ToString::to_string)
}

/// Phase durations of one commit, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitReport {
    /// Validation of the changed rulesets.
    pub validate_ns: u64,
    /// Compilation of the new snapshot.
    pub compile_ns: u64,
    /// Pointer swap and writer barrier.
    pub publish_ns: u64,
    /// Waiting for the cores that were mid-batch.
    pub quiesce_ns: u64,
    /// Carrying counters of unchanged rules into the new snapshot.
    pub carry_ns: u64,
    /// Cores that were mid-batch at publish time (the only ones waited for).
    pub cores_waited: usize,
    /// Rules in the new snapshot (enforced tables).
    pub rules: usize,
    /// Counter slots (rules and policies) carried over.
    pub carried: usize,
}

impl CommitReport {
    /// Sum of all phases, ns.
    pub fn total_ns(&self) -> u64 {
        self.validate_ns + self.compile_ns + self.publish_ns + self.quiesce_ns + self.carry_ns
    }
}

/// A successful commit.
#[derive(Debug)]
pub struct Committed {
    /// Phase durations.
    pub report: CommitReport,
    /// Warnings of validation (e.g. tables that are stored but not enforced).
    pub warnings: Vec<Violation>,
    /// The previous snapshot, unreachable by any core: drop it off the commit path.
    pub retired: Retired<Snapshot>,
}

/// Most snapshots replaced by publishes and not yet retired ([`Engine::settle`]); a publish
/// that finds this many waits for the oldest one's cores (module docs).
pub const MAX_OUTGOING: usize = 64;

/// A commit published by [`Engine::publish`]: answered as soon as the new snapshot is
/// published; the replaced one is retired later by [`Engine::settle`] (module docs).
#[derive(Debug)]
pub struct Published {
    /// Phase durations: `quiesce_ns` is what this publish waited for an earlier commit's
    /// pending carry (0 unless one was pending), `carry_ns` that carry; this commit's own
    /// quiescence and carry are in the [`Settled`] of the [`Engine::settle`] that retires it.
    pub report: CommitReport,
    /// Warnings of validation (e.g. tables that are stored but not enforced).
    pub warnings: Vec<Violation>,
    /// Earlier outgoing snapshots that no core could reach any more when this published
    /// (found without waiting): drop them off the commit path.
    pub retired: Vec<Retired<Snapshot>>,
}

/// A validated change, not compiled yet: made by [`Engine::validate_change`] (whose verdict it
/// is: it exists only when validation found no error), compiled by [`Engine::compile`].
pub struct Validated {
    /// [`Active::version`] it was made from.
    base: u64,
    next: BTreeMap<String, Arc<Ruleset>>,
    revisions: BTreeMap<String, u64>,
    /// The chains' diffs validation computed, for the incremental compile.
    hints: Vec<DiffHint>,
    start_counters: Vec<String>,
    /// The facts-field bits of `next` ([`crate::kernel_decided`]).
    facts: Arc<FactBits>,
    warnings: Vec<Violation>,
    validate_ns: u64,
}

impl std::fmt::Debug for Validated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validated")
            .field("base", &self.base)
            .field("rulesets", &self.next.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Validated {
    /// The warnings validation found (errors make [`Engine::validate_change`] fail instead),
    /// in source order per changed ruleset.
    pub fn warnings(&self) -> &[Violation] {
        &self.warnings
    }
}

/// A validated and compiled commit, not yet visible to the packet path: made by
/// [`Engine::prepare`], published by [`Engine::publish`] (or dropped: nothing happens, and
/// the counter slots its snapshot took go back when no later build took slots after them).
pub struct Prepared {
    /// [`Active::version`] it was made from; publishing checks it is still current.
    base: u64,
    next: BTreeMap<String, Arc<Ruleset>>,
    /// The caller's revision numbers of `next` ([`Prepared::set_revision`]).
    revisions: BTreeMap<String, u64>,
    /// The rulesets put by this change whose model carries rule or policy counters (parsed
    /// as `iptables-restore --counters`): publish starts those counters there.
    start_counters: Vec<String>,
    /// `None` once [`Engine::publish`] took it.
    snapshot: Option<Box<Snapshot>>,
    /// The facts-field bits the snapshot reads.
    facts: Arc<FactBits>,
    warnings: Vec<Violation>,
    validate_ns: u64,
    compile_ns: u64,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("base", &self.base)
            .field("rulesets", &self.next.keys().collect::<Vec<_>>())
            .field("rules", &self.snapshot.as_ref().map(|s| s.rule_count()))
            .finish_non_exhaustive()
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // Never published (no core counted in it): its new counter slots are free again.
        if let Some(s) = &self.snapshot {
            s.release_slots();
        }
    }
}

/// Whether a model carries counters to start from (`Rule::counters`, or a chain policy's
/// non-zero `Chain::counters`), as the parser keeps them only with `--counters`.
fn has_counters(rs: &Ruleset) -> bool {
    rs.tables
        .iter()
        .flat_map(|t| &t.chains)
        .any(|c| c.counters != Counters::default() || c.rules.has_counters())
}

impl Prepared {
    /// The model of ruleset `name` the engine runs once this is published (for a
    /// [`Change::Put`]: the ruleset given, now shared); `None` when it is not active then.
    pub fn ruleset(&self, name: &str) -> Option<&Arc<Ruleset>> {
        self.next.get(name)
    }

    /// The warnings validation found (errors make [`Engine::prepare`] fail instead).
    pub fn warnings(&self) -> &[Violation] {
        &self.warnings
    }

    /// The kernel-decided expressions its snapshot reads and their facts-field bits
    /// ([`crate::kernel_decided`]): what the steering's facts chains must set before it is
    /// published.
    pub fn kernel_facts(&self) -> &Arc<FactBits> {
        &self.facts
    }

    /// Numbers active ruleset `ruleset` with the caller's `revision` once this is published
    /// ([`Engine::revisions`]); a ruleset this change puts has no number until given one, an
    /// unchanged one keeps its own. Returns false (and numbers nothing) when `ruleset` is not
    /// active after this change.
    pub fn set_revision(&mut self, ruleset: &str, revision: u64) -> bool {
        if !self.next.contains_key(ruleset) {
            return false;
        }
        self.revisions.insert(ruleset.to_string(), revision);
        true
    }
}

/// An active ruleset's revision, as the caller numbered it ([`Prepared::set_revision`]), and
/// its priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActiveRevision {
    /// The caller's number.
    pub revision: u64,
    /// The ruleset's priority ([`Ruleset::priority`]).
    pub priority: i32,
}

/// The active rulesets and how many commits were published (a [`Prepared`] made from an older
/// version is stale).
#[derive(Default)]
struct Active {
    rulesets: BTreeMap<String, Arc<Ruleset>>,
    /// The facts-field bits of the kernel-decided expressions the active snapshot reads.
    facts: Arc<FactBits>,
    /// The caller's revision number of the active rulesets it numbered.
    revisions: BTreeMap<String, u64>,
    version: u64,
}

/// Packets counted by (family, hook, verdict name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerdictCount {
    /// Family.
    pub family: Family,
    /// Hook.
    pub hook: Hook,
    /// `ACCEPT`, `DROP` or `REJECT`.
    pub verdict: &'static str,
    /// Packets.
    pub packets: u64,
}

/// The engine. Share it by reference (or `Arc`) between the committer and the workers.
pub struct Engine {
    dataplane: Dataplane<Snapshot>,
    active: Mutex<Active>,
    /// Held by [`Engine::commit`] from prepare to publish, so that its own publish is never
    /// stale.
    committing: Mutex<()>,
    /// Snapshots replaced by a publish, oldest first, until [`Engine::settle`] retires them
    /// (module docs). Lock order: `active`, then this, then the dataplane's locks.
    outgoing: Mutex<VecDeque<Outgoing>>,
    verdicts: Box<[VerdictCounts]>,
    clock: Arc<dyn Clock>,
    conntrack: Option<Conntrack>,
    /// Rulesets validated so far ([`Engine::validations`]).
    validations: AtomicU64,
    /// The one shadow ([`Engine::start_shadow`]).
    shadow: ShadowSlot,
    /// The report of the last shadow that ended ([`Engine::shadow_report`]).
    shadow_last: Mutex<Option<ShadowReport>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("cores", &self.dataplane.cores())
            .field("barrier", &self.dataplane.barrier())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine with no ruleset (every packet accepted), `config.cores` cores and, unless
    /// `config.conntrack` is off, an empty connection table.
    pub fn new(config: EngineConfig, clock: Arc<dyn Clock>) -> Engine {
        let cores = config.cores.max(1);
        let conntrack = config
            .conntrack
            .filter(|c| c.max_entries > 0)
            .and_then(|c| {
                // Clamped into the range `Conntrack::new` accepts, so it cannot fail.
                Conntrack::new(ConntrackConfig {
                    buckets: c.buckets.clamp(1, 1 << 30),
                    locks: c.locks.clamp(1, 1 << 30),
                    max_entries: c.max_entries,
                    tcp_loose: c.tcp_loose,
                })
                .ok()
            });
        Engine {
            dataplane: Dataplane::new(Snapshot::empty(cores), cores, config.barrier, clock.clone()),
            active: Mutex::new(Active::default()),
            committing: Mutex::new(()),
            outgoing: Mutex::new(VecDeque::new()),
            verdicts: (0..cores).map(|_| VerdictCounts::default()).collect(),
            clock,
            conntrack,
            validations: AtomicU64::new(0),
            shadow: ShadowSlot::default(),
            shadow_last: Mutex::new(None),
        }
    }

    /// How many times this engine ran the validator on a ruleset: once per [`Engine::validate`]
    /// call and once per ruleset a commit's [`Engine::validate_change`] checks (commit and
    /// prepare included). A statistic (and how tests see that a commit validates once).
    pub fn validations(&self) -> u64 {
        // Relaxed: a count, ordered with nothing.
        self.validations.load(Ordering::Relaxed)
    }

    fn count_validation(&self) {
        // Relaxed: see `validations`.
        self.validations.fetch_add(1, Ordering::Relaxed);
    }

    /// Validates `ruleset` as a commit would (with `sets` for `--match-set`), without
    /// committing. Returns every violation, warnings included.
    pub fn validate(&self, ruleset: &Ruleset, sets: &dyn SetRegistry) -> Vec<Violation> {
        let (old, others, prev_facts) = {
            let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
            let others: Vec<Arc<Ruleset>> = active
                .rulesets
                .values()
                .filter(|r| r.name != ruleset.name)
                .cloned()
                .collect();
            (
                active.rulesets.get(&ruleset.name).cloned(),
                others,
                active.facts.clone(),
            )
        };
        self.count_validation();
        let mut v = match old {
            // The same result, checking only what changed (`validate_after`).
            Some(old) => validate_after(ruleset, &old, Some(sets)).0,
            None => validate(ruleset, Some(sets)),
        };
        // The facts field, as the commit would count it.
        let bits = sets.reached_hooks().map_or(0, |h| h.fact_bits());
        if bits > 0 {
            let all = others.iter().map(|r| &**r).chain(std::iter::once(ruleset));
            if let Err(o) = FactBits::assign(&prev_facts, bits, all) {
                v.push(overflow_violation(o));
            }
        }
        v
    }

    /// Applies `change` atomically: validate, compile, publish, quiesce, carry counters.
    /// See the module docs for the phases. [`Engine::prepare`] then [`Engine::publish`], with
    /// no other commit in between.
    ///
    /// Errors: [`CommitError::Invalid`] with every violation when validation finds an error;
    /// [`CommitError::Compile`] when compilation fails; for [`Change::Edit`],
    /// [`CommitError::NoSuchRuleset`] and [`CommitError::Edit`] (a missing table or chain, a
    /// rule number out of range). The engine is unchanged on error.
    pub fn commit(&self, change: Change, sets: &dyn SetRegistry) -> Result<Committed, CommitError> {
        let _one = self.committing.lock().unwrap_or_else(|e| e.into_inner());
        let prepared = self.prepare(change, sets)?;
        let (mut report, warnings, earlier, ours) = self.publish_with(prepared, true)?;
        drop(earlier);
        let Some((retired, settled)) = ours else {
            unreachable!("publish_with(_, true) retires the snapshot it replaced")
        };
        report.quiesce_ns += settled.quiesce_ns;
        report.carry_ns += settled.carry_ns;
        report.carried += settled.carried;
        Ok(Committed {
            report,
            warnings,
            retired,
        })
    }

    /// [`Engine::validate_change`] then [`Engine::compile`]: the snapshot of every active
    /// ruleset with `change` applied, validated and compiled, without touching the packet
    /// path, so that a caller can overlap it with other work and publish only once that
    /// succeeded.
    ///
    /// Errors: as [`Engine::commit`]. Nothing changes on error.
    pub fn prepare(&self, change: Change, sets: &dyn SetRegistry) -> Result<Prepared, CommitError> {
        let validated = self.validate_change(change, sets)?;
        self.compile(validated, sets)
    }

    /// Phase 1 of a commit, its one validation: applies `change` to (a copy of) the active
    /// rulesets and validates each ruleset it changes, against the active one of its name
    /// when there is one (`validate_after`: only what changed is checked, same result as a
    /// full validation). Nothing changes; the [`Validated`] goes to [`Engine::compile`].
    ///
    /// Errors: [`CommitError::Invalid`] with every violation of the changed rulesets when one
    /// has an error; for [`Change::Edit`], [`CommitError::NoSuchRuleset`] and
    /// [`CommitError::Edit`]; for [`Change::ReplaceAll`], [`CommitError::Compile`] with
    /// [`CompileError::DuplicateRuleset`].
    pub fn validate_change(
        &self,
        change: Change,
        sets: &dyn SetRegistry,
    ) -> Result<Validated, CommitError> {
        let t0 = self.clock.now_ns();
        let (base, mut next, mut revisions, prev_facts) = {
            let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
            (
                active.version,
                active.rulesets.clone(),
                active.revisions.clone(),
                active.facts.clone(),
            )
        };
        // Each changed ruleset with the active one of its name (if any), which it is
        // validated and diffed against.
        let mut changed: Vec<(Arc<Ruleset>, Option<Arc<Ruleset>>)> = Vec::new();
        // Only what is put now starts counters from the model: an edit keeps the active
        // model's other rules, whose counters (if any) were started when it was put.
        let put = !matches!(change, Change::Edit { .. } | Change::PutEdited(_));
        match change {
            Change::Put(rs) | Change::PutEdited(rs) => {
                let rs = Arc::new(rs);
                let old = next.insert(rs.name.clone(), rs.clone());
                changed.push((rs, old));
            }
            Change::Remove(name) => {
                next.remove(&name);
            }
            Change::Edit { ruleset, edits } => {
                let old = next
                    .get(&ruleset)
                    .cloned()
                    .ok_or(CommitError::NoSuchRuleset(ruleset))?;
                let rs = Arc::new(old.with_edits(edits)?);
                next.insert(rs.name.clone(), rs.clone());
                changed.push((rs, Some(old)));
            }
            Change::ReplaceAll(all) => {
                let mut old = std::mem::take(&mut next);
                for rs in all {
                    let rs = Arc::new(rs);
                    if next.insert(rs.name.clone(), rs.clone()).is_some() {
                        return Err(CompileError::DuplicateRuleset(rs.name.clone()).into());
                    }
                    let prev = old.remove(&rs.name);
                    changed.push((rs, prev));
                }
            }
        }
        // A changed ruleset is numbered again by the caller; a removed one has no number.
        revisions.retain(|name, _| {
            next.contains_key(name) && !changed.iter().any(|(rs, _)| rs.name == *name)
        });
        let start_counters = changed
            .iter()
            .filter(|(rs, _)| put && has_counters(rs))
            .map(|(rs, _)| rs.name.clone())
            .collect();
        let mut violations = Vec::new();
        let mut hints = Vec::new();
        for (rs, old) in changed {
            self.count_validation();
            match old {
                // Unchanged rules are not checked again (`validate_after`), and the chains'
                // diffs it computes spare the compile its own.
                Some(old) => {
                    let (v, diffs) = validate_after(&rs, &old, Some(sets));
                    violations.extend(v);
                    hints.push(DiffHint {
                        new: rs,
                        old,
                        diffs,
                    });
                }
                None => violations.extend(validate(&rs, Some(sets))),
            }
        }
        // The kernel-decided expressions of every active ruleset, one facts bit each; counted
        // before anything is kept, refused at the first rule that does not fit.
        let bits = sets.reached_hooks().map_or(0, |h| h.fact_bits());
        let facts = if bits == 0 {
            prev_facts
        } else {
            match FactBits::assign(&prev_facts, bits, next.values().map(|r| &**r)) {
                Ok(f) => Arc::new(f),
                Err(o) => {
                    violations.push(overflow_violation(o));
                    prev_facts
                }
            }
        };
        if violations.iter().any(|v| v.severity == Severity::Error) {
            return Err(CommitError::Invalid(violations));
        }
        let t1 = self.clock.now_ns();
        Ok(Validated {
            base,
            next,
            revisions,
            hints,
            start_counters,
            facts,
            warnings: violations,
            validate_ns: t1.saturating_sub(t0),
        })
    }

    /// Phase 2 of a commit: compiles the snapshot of every active ruleset with the validated
    /// change applied, incrementally from the active snapshot. `sets` must be the registry
    /// `validated` was checked against. Counter reads, traces and scrapes do not wait for it.
    ///
    /// Errors: [`CommitError::Compile`] when compilation fails (validation should have caught
    /// it first). Nothing changes on error.
    pub fn compile(
        &self,
        validated: Validated,
        sets: &dyn SetRegistry,
    ) -> Result<Prepared, CommitError> {
        let t1 = self.clock.now_ns();
        let Validated {
            base,
            next,
            revisions,
            hints,
            start_counters,
            facts,
            warnings,
            validate_ns,
        } = validated;
        let sets = &WithFacts {
            sets,
            facts: &facts,
        };
        let list: Vec<Arc<Ruleset>> = next.values().cloned().collect();
        // Incremental: unchanged chains share the active snapshot's compiled rules and index,
        // changed ones are spliced from them where that pays (`Snapshot::compile_after`). The
        // snapshot compiled against must still be the active one at publish: `base` checks.
        // `with_base`: counter reads, traces and scrapes do not wait for the compile.
        let cores = self.dataplane.cores();
        let snapshot = self.dataplane.with_base(|prev| {
            #[cfg(test)]
            tests::compile_hook();
            Snapshot::compile_after_hinted(prev, &list, sets, cores, &hints)
        })?;
        let t2 = self.clock.now_ns();
        Ok(Prepared {
            base,
            next,
            revisions,
            start_counters,
            snapshot: Some(Box::new(snapshot)),
            facts,
            warnings,
            validate_ns,
            compile_ns: t2.saturating_sub(t1),
        })
    }

    /// The second half of a commit: publishes a [`Prepared`] snapshot and returns. Every
    /// batch that begins after the return runs it; the replaced snapshot waits in the outgoing
    /// queue for [`Engine::settle`] (quiesce, carry, retire; module docs "Publish now, retire
    /// later"). Waits only when the previous commit's carry is still pending (fresh counter
    /// cells or counters to start): for that commit's cores, then carries.
    ///
    /// Errors: [`CommitError::Stale`] when another commit was published since `prepared` was
    /// made (prepare again); the engine is then unchanged.
    pub fn publish(&self, prepared: Prepared) -> Result<Published, CommitError> {
        let (report, warnings, retired, _) = self.publish_with(prepared, false)?;
        Ok(Published {
            report,
            warnings,
            retired,
        })
    }

    /// [`Engine::publish`]; with `wait`, the replaced snapshot is retired before the return
    /// (its cores waited for and its carry done under the locks, as [`Engine::commit`]
    /// promises) instead of queued, and comes back with what that cost.
    #[allow(clippy::type_complexity)] // One private use per caller; the parts are named there.
    fn publish_with(
        &self,
        mut prepared: Prepared,
        wait: bool,
    ) -> Result<
        (
            CommitReport,
            Vec<Violation>,
            Vec<Retired<Snapshot>>,
            Option<(Retired<Snapshot>, Settled)>,
        ),
        CommitError,
    > {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if active.version != prepared.base {
            return Err(CommitError::Stale);
        }
        let Some(snapshot) = prepared.snapshot.take() else {
            unreachable!("a Prepared holds its snapshot until published")
        };
        let rules = snapshot.rule_count();
        let mut outgoing = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
        // An earlier commit's carry goes into the snapshot active now: before it is replaced.
        let mut earlier = self.finish_carry(&mut outgoing);
        // A bound on memory when cores do not move on (a worker stuck in a batch) and nobody
        // settles: publishes then wait, as every commit did before the queue.
        while outgoing.len() >= MAX_OUTGOING {
            let Some(o) = outgoing.pop_front() else {
                break;
            };
            let t = self.clock.now_ns();
            earlier.retired.push(o.old.retire());
            earlier.quiesce_ns += self.clock.now_ns().saturating_sub(t);
        }
        // Free (`false`) when the new snapshot counts in the active one's cells. The active
        // snapshot cannot change meanwhile: publishes hold `active`, which we hold.
        let counts = self.dataplane.with_active(|old| snapshot.carry_reads(old));
        let carried = if counts {
            0
        } else {
            // Copies nothing (the same cells); only says how many slots continue.
            self.dataplane.with_active(|old| snapshot.carry_from(old))
        };
        let start_counters = std::mem::take(&mut prepared.start_counters);
        let (unpublished, q): (Unpublished<Snapshot>, QuiesceReport) =
            self.dataplane.publish(snapshot);
        // A shadow was compiled beside the rulesets this replaced: it ends here (its own
        // grace wait, only when one runs), its report made against the replaced snapshot.
        if let Some(sh) = self.retire_shadow() {
            let ct = self.conntrack.as_ref();
            let report = sh.report(unpublished.get(), ct, Some(ShadowEnd::Committed));
            if prepared.revisions.get(&sh.ruleset) == Some(&sh.revision) {
                self.dataplane
                    .with_active(|new| new.add_counters(&report.counters));
            }
            self.keep_last(&report);
        }
        let carry = (counts || !start_counters.is_empty()).then_some(PendingCarry {
            counts,
            start_counters,
        });
        outgoing.push_back(Outgoing {
            old: unpublished,
            carry,
        });
        let mut ours = None;
        if wait {
            let mut settled = self.finish_carry(&mut outgoing);
            let Some(o) = outgoing.pop_back() else {
                unreachable!("pushed above")
            };
            let t = self.clock.now_ns();
            let retired = o.old.retire();
            settled.quiesce_ns += self.clock.now_ns().saturating_sub(t);
            ours = Some((retired, settled));
        }
        // Outgoing snapshots no core can reach any more, this commit's among them when no
        // core was mid-batch (a look, no wait).
        let mut now = Settled {
            retired: std::mem::take(&mut earlier.retired),
            ..Settled::default()
        };
        self.retire_quiescent(&mut outgoing, &mut now);
        drop(outgoing);
        active.rulesets = std::mem::take(&mut prepared.next);
        active.facts = prepared.facts.clone();
        active.revisions = std::mem::take(&mut prepared.revisions);
        active.version += 1;
        let report = CommitReport {
            validate_ns: prepared.validate_ns,
            compile_ns: prepared.compile_ns,
            publish_ns: q.publish_ns,
            quiesce_ns: earlier.quiesce_ns,
            carry_ns: earlier.carry_ns + now.carry_ns,
            cores_waited: q.cores_waited,
            rules,
            carried: carried + now.carried,
        };
        Ok((
            report,
            std::mem::take(&mut prepared.warnings),
            now.retired,
            ours,
        ))
    }

    /// The kernel-decided expressions the active snapshot reads and their facts-field bits
    /// ([`crate::kernel_decided`]).
    pub fn kernel_facts(&self) -> Arc<FactBits> {
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .facts
            .clone()
    }

    /// The active rulesets, by name.
    pub fn rulesets(&self) -> BTreeMap<String, Arc<Ruleset>> {
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rulesets
            .clone()
    }

    /// The active rulesets the caller numbered ([`Prepared::set_revision`]), by name, with
    /// their priority: what the cores run now (it changes at publish).
    pub fn revisions(&self) -> BTreeMap<String, ActiveRevision> {
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        active
            .revisions
            .iter()
            .filter_map(|(name, &revision)| {
                let priority = active.rulesets.get(name)?.priority;
                Some((name.clone(), ActiveRevision { revision, priority }))
            })
            .collect()
    }

    /// [`Engine::revisions`] of one ruleset.
    pub fn revision(&self, ruleset: &str) -> Option<ActiveRevision> {
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        let revision = *active.revisions.get(ruleset)?;
        let priority = active.rulesets.get(ruleset)?.priority;
        Some(ActiveRevision { revision, priority })
    }

    /// The model of active ruleset `ruleset` with its number ([`Engine::revisions`]), read
    /// together (one lock): the model is that revision's. `None` when it is not active or not
    /// numbered.
    pub fn revision_model(&self, ruleset: &str) -> Option<(u64, Arc<Ruleset>)> {
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        let revision = *active.revisions.get(ruleset)?;
        Some((revision, active.rulesets.get(ruleset)?.clone()))
    }

    /// The priority of active ruleset `ruleset` (numbered or not); `None` when it is not
    /// active.
    pub fn priority(&self, ruleset: &str) -> Option<i32> {
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        active.rulesets.get(ruleset).map(|r| r.priority)
    }

    /// Claims core `core` for a worker thread. Each core has at most one worker at a time.
    ///
    /// Errors: [`DataplaneError`] when the index is out of range or the core is claimed.
    pub fn worker(&self, core: usize) -> Result<EngineWorker<'_>, DataplaneError> {
        Ok(EngineWorker::new(
            self.dataplane.worker(core)?,
            &self.dataplane,
            &self.verdicts[core],
            self.conntrack.as_ref(),
            &self.shadow,
        ))
    }

    /// The event a worker's [`LogRecord`] stands for ([`EngineWorker::drain_log_records`]),
    /// named on the active snapshot; `None` when a commit replaced the snapshot the hit
    /// happened in. Takes the commit lock briefly ([`Dataplane::with_active`]).
    pub fn log_event(&self, record: &LogRecord) -> Option<LogEvent> {
        self.dataplane.with_active(|s| s.log_event(record))
    }

    /// Evaluates one packet against the active snapshot without counting, returning the
    /// verdict, the rules it went through and, in [`Trace::ct_state`], the conntrack state the
    /// packet got: with conntrack on, a lookup between the raw and the other chains
    /// ([`Conntrack::peek`]) that changes nothing in the table; with it off, the packet's own
    /// `ct_state`. Raw-table NOTRACK still makes it UNTRACKED. `packet` is a
    /// [`Packet`](crate::packet::Packet) or a [`PacketMeta`](crate::packet::PacketMeta) with
    /// no facts known ([`AsPacket`]).
    pub fn trace(&self, packet: &impl AsPacket, now_ns: u64) -> Trace {
        self.trace_bytes(packet, &[], now_ns, true)
    }

    /// As [`Engine::trace`] but with the packet's `ct_state` taken as given (no conntrack
    /// lookup), to ask how the rules treat e.g. an ESTABLISHED packet (`-m connlimit` still
    /// counts the table's connections).
    pub fn trace_with_state(&self, packet: &impl AsPacket, now_ns: u64) -> Trace {
        self.trace_bytes(packet, &[], now_ns, false)
    }

    /// [`Engine::trace`] (`lookup`) or [`Engine::trace_with_state`] (not), with the packet's
    /// bytes from its network header on, which `-m string` searches (empty: none, and
    /// `--string` is false).
    pub fn trace_bytes(
        &self,
        packet: &impl AsPacket,
        bytes: &[u8],
        now_ns: u64,
        lookup: bool,
    ) -> Trace {
        let packet = &packet.to_packet();
        let ct = self.conntrack.as_ref();
        self.dataplane.with_active(|s| {
            s.trace_tracked(packet, bytes, now_ns, ct, |p, f| {
                if let (Some(ct), true) = (ct, lookup) {
                    ct.peek_into(p, f, now_ns);
                }
                None
            })
        })
    }

    /// The connection table, `None` when conntrack is off: stats, list, delete by filter,
    /// flush.
    pub fn conntrack(&self) -> Option<&Conntrack> {
        self.conntrack.as_ref()
    }

    /// One garbage-collection step of the connection table: deletes the expired entries of
    /// the next `budget` buckets (round robin) at `now_ns` (the engine clock's ns). Returns how
    /// many it deleted (0 when conntrack is off). Call it periodically, off the packet path.
    pub fn gc(&self, now_ns: u64, budget: usize) -> usize {
        self.conntrack
            .as_ref()
            .map_or(0, |ct| ct.gc(now_ns, budget))
    }

    /// Per-rule and per-policy counters of the active snapshot (sum over cores plus carried).
    /// Waits for a pending carry first (module docs, "Publish now, retire later"), so
    /// that counts of rules a commit kept are never missing or doubled.
    pub fn counters(&self) -> Vec<SlotCounters> {
        self.with_counted(Snapshot::counters)
    }

    /// Zeroes the counters of one ruleset, or of all (after a pending carry, as
    /// [`Engine::counters`]).
    pub fn zero_counters(&self, ruleset: Option<&str>) {
        self.with_counted(|s| s.zero_counters(ruleset));
    }

    /// Zeroes counters of one ruleset as `iptables [-t TABLE] -Z [CHAIN [N]]` (see
    /// [`Snapshot::zero_counters_in`]).
    pub fn zero_counters_in(
        &self,
        ruleset: &str,
        family: Family,
        table: Option<crate::model::TableKind>,
        chain: Option<&str>,
        rule: Option<u32>,
    ) {
        self.with_counted(|s| s.zero_counters_in(ruleset, family, table, chain, rule));
    }

    /// Packets counted per (family, hook, verdict), summed over cores; zero rows omitted.
    pub fn verdict_counts(&self) -> Vec<VerdictCount> {
        let mut out = Vec::new();
        for (fi, family) in [Family::Ipv4, Family::Ipv6].into_iter().enumerate() {
            for hook in Hook::ALL {
                for (vi, verdict) in ["ACCEPT", "DROP", "REJECT"].into_iter().enumerate() {
                    let packets: u64 = self.verdicts.iter().map(|c| c.get(fi, hook, vi)).sum();
                    if packets != 0 {
                        out.push(VerdictCount {
                            family,
                            hook,
                            verdict,
                            packets,
                        });
                    }
                }
            }
        }
        out
    }

    /// Per-core generation counters (odd: mid-batch).
    pub fn generations(&self) -> Vec<u64> {
        self.dataplane.generations()
    }

    /// Per-core packet counts.
    pub fn core_packets(&self) -> Vec<u64> {
        self.dataplane.packets()
    }

    /// The barrier strategy in effect.
    pub fn barrier(&self) -> BarrierStrategy {
        self.dataplane.barrier()
    }

    /// Why `Membarrier` was requested but `SeqCst` is in effect, if so.
    pub fn barrier_fallback(&self) -> Option<&str> {
        self.dataplane.fallback_reason()
    }

    /// The sampled barrier cost per packet (see [`crate::dataplane::SAMPLE_EVERY`]).
    pub fn barrier_histogram(&self) -> Histogram {
        self.dataplane.barrier_histogram()
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.dataplane.cores()
    }

    /// The workers' generation counters, for sets whose lookups should run lock-free inside
    /// this engine's batches ([`crate::sets::SetManager::for_dataplane`]).
    pub fn quiescence(&self) -> &Arc<crate::dataplane::Quiescence> {
        self.dataplane.quiescence()
    }
}

/// The error at the first rule whose kernel-decided expression found no facts bit.
fn overflow_violation(o: crate::kernel_decided::FactsOverflow) -> Violation {
    Violation {
        severity: Severity::Error,
        ruleset: o.ruleset,
        family: Some(o.family),
        table: Some(TableKind::Filter),
        chain: Some(o.chain),
        rule: Some(o.rule),
        location: o.location,
        kind: ViolationKind::TooManyKernelFacts {
            text: o.text,
            bits: o.bits,
        },
    }
}

/// A registry that also gives the facts-field bits of one assignment to the compile.
struct WithFacts<'a> {
    sets: &'a dyn SetRegistry,
    facts: &'a FactBits,
}

impl SetRegistry for WithFacts<'_> {
    fn lookup(&self, name: &str) -> Option<Arc<dyn crate::sets::IpSet>> {
        self.sets.lookup(name)
    }
    fn node_addrs(&self) -> Option<Arc<crate::node_addrs::NodeAddrs>> {
        self.sets.node_addrs()
    }
    fn reached_hooks(&self) -> Option<Arc<crate::validate::ReachedHooks>> {
        self.sets.reached_hooks()
    }
    fn kernel_fact_bit(&self, family: Family, text: &str) -> Option<u8> {
        self.facts.bit(family, text)
    }
}

#[cfg(test)]
mod tests;
