//! [`Snapshot::trace`]: the chain walk of `eval` with a recording observer ([`Tracing`])
//! instead of the counting one, and what it returns ([`Trace`], one [`TraceStep`] per matched
//! rule or applied policy). Not the packet path: a trace allocates its steps and LOG events,
//! counts nothing, takes no `-m limit`, `-m recent` or `-m hashlimit` token and remembers no
//! `-m connlimit` connection; like the walk
//! it takes no lock and reads no clock (`now` is passed in).

use std::sync::Arc;

use super::{Hint, Observer};
use crate::conntrack::Conntrack;
use crate::eval::connlimit::CConnlimit;
use crate::model::{Family, Policy, TableKind};
use crate::packet::{Packet, PacketFacts, PacketMeta};
use crate::snapshot::log_ring::{LogHit, LogSink};
use crate::snapshot::stateful::{CHashlimit, CRecent};
use crate::snapshot::*;

/// What happened at one step of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepOutcome {
    /// The rule matched and its target does not decide (no target, LOG, NOTRACK).
    Continue,
    /// `-j CHAIN`.
    Jump,
    /// `-g CHAIN`.
    Goto,
    /// RETURN (explicit).
    Return,
    /// ACCEPT by a rule: the packet goes on to the next base chain.
    Accept,
    /// DROP by a rule.
    Drop,
    /// REJECT by a rule.
    Reject,
    /// The chain's policy applied.
    Policy(Policy),
}

/// One step of a [`Trace`]: a rule that matched, or a policy that applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceStep {
    /// Ruleset name.
    pub ruleset: Arc<str>,
    /// Family of the table.
    pub family: Family,
    /// Table.
    pub table: TableKind,
    /// Chain.
    pub chain: Arc<str>,
    /// 1-based rule number; `None` when the step is the chain's policy.
    pub rule: Option<u32>,
    /// What the step did.
    pub outcome: StepOutcome,
}

/// The result of [`Snapshot::trace`]: the verdict and every rule that matched on the way, in
/// order (the rules whose counters would go up), like `nft monitor trace`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The hook's verdict.
    pub verdict: Verdict,
    /// Matched rules and applied policies in evaluation order.
    pub steps: Vec<TraceStep>,
    /// LOG events the packet would have produced.
    pub logs: Vec<LogEvent>,
    /// The packet mark at the end of the evaluation (after `-j MARK`, `-j CONNMARK
    /// --restore-mark`): what NFQUEUE mode would send back with the verdict.
    pub mark: u32,
    /// The conntrack entry's mark at the end (after `-j CONNMARK`); a trace changes no entry.
    pub ct_mark: u32,
    /// The packet's [`ct_state`](crate::model::ct_state) bit at the end of the evaluation: after raw-table NOTRACK
    /// and, in [`Snapshot::trace_tracked`], after the step between the raw and the other chains
    /// (the engine's conntrack lookup). Only raw-table rules change it, so it is the state the
    /// non-raw chains saw.
    pub ct_state: u8,
    /// The packet was dropped by a match that reads transport-header bytes it lacks
    /// ([`PacketMeta::l4_cut`], the kernel's hotdrop); that rule is not among the steps.
    pub hotdropped: bool,
    /// How many `-m limit`, `-m recent` and `-m hashlimit` matches the packet's path asked. A trace is a dry
    /// run for them: each answers whether a token is there now without taking it (a recent
    /// list is read, not changed), so a burst of real packets can be limited where a trace
    /// of each of them matched.
    pub limits_asked: u32,
}

/// The observer of a trace: records every step and LOG event, asks limits without taking
/// tokens. Visible in `compile` for the TupleMerge tests, which query the index with it.
pub(crate) struct Tracing<'a> {
    pub(crate) snapshot: u64,
    /// The connection table `-m connlimit` asks (`None`: no tracker).
    pub(crate) ct: Option<&'a Conntrack>,
    /// The packet's bytes, for `-m string`.
    pub(crate) payload: &'a [u8],
    pub(crate) names: &'a [Arc<str>],
    pub(crate) steps: Vec<TraceStep>,
    pub(crate) logs: Vec<LogEvent>,
    pub(crate) limits_asked: u32,
    pub(crate) hotdropped: bool,
}

impl Observer for Tracing<'_> {
    fn rule(&mut self, _: usize, chain: &CChain, number: u32, _: &PacketMeta) {
        self.steps.push(TraceStep {
            ruleset: self.names[chain.ruleset as usize].clone(),
            family: chain.family,
            table: chain.table,
            chain: chain.name.clone(),
            rule: Some(number),
            outcome: StepOutcome::Continue,
        });
    }
    fn policy(&mut self, _: usize, chain: &CChain, _: &PacketMeta) {
        self.steps.push(TraceStep {
            ruleset: self.names[chain.ruleset as usize].clone(),
            family: chain.family,
            table: chain.table,
            chain: chain.name.clone(),
            rule: None,
            outcome: StepOutcome::Policy(chain.policy.unwrap_or(Policy::Accept)),
        });
    }
    fn limit(&mut self, bucket: &TokenBucket, now: u64) -> bool {
        // A trace must not consume tokens that real traffic would get.
        self.limits_asked += 1;
        bucket.would_conform(now)
    }
    fn recent(&mut self, r: &CRecent, pkt: &PacketMeta, now: u64) -> bool {
        // Nor change a recent list.
        self.limits_asked += 1;
        r.matches(pkt, now, false)
    }
    fn hashlimit(&mut self, h: &CHashlimit, pkt: &PacketMeta, now: u64) -> bool {
        self.limits_asked += 1;
        h.matches(pkt, now, false)
    }
    fn connlimit(
        &mut self,
        c: &CConnlimit,
        pkt: &PacketMeta,
        facts: &PacketFacts,
        now: u64,
    ) -> bool {
        self.limits_asked += 1;
        c.matches(pkt, facts, now, self.ct, false)
    }
    fn payload(&self) -> &[u8] {
        self.payload
    }
    fn log(
        &mut self,
        chain: &CChain,
        chain_index: u32,
        number: u32,
        log: &LogSpec,
        pkt: &PacketMeta,
        facts: &PacketFacts,
    ) {
        let hit = LogHit::new(
            self.snapshot,
            self.names,
            chain,
            chain_index,
            number,
            log,
            pkt,
            facts,
        );
        self.logs.log(&hit);
    }
    fn outcome(&mut self, what: StepOutcome) {
        if let Some(last) = self.steps.last_mut() {
            if last.rule.is_some() {
                last.outcome = what;
            }
        }
    }
    fn hotdrop(&mut self) {
        self.hotdropped = true;
    }
}

impl Snapshot {
    /// Evaluates one packet without counting or consuming `-m limit` tokens (a dry run for
    /// them: [`Trace::limits_asked`] says how many were asked), and returns the
    /// verdict with the path taken: every matched rule (ruleset, table, chain, 1-based number)
    /// and every applied policy, in order.
    pub fn trace(&self, packet: impl Into<Packet>, now: u64) -> Trace {
        self.trace_tracked(&packet.into(), &[], now, None, |_, _| None)
    }

    /// As [`Snapshot::trace`], the same walk as [`Snapshot::classify_batch`]'s with
    /// `after_raw` as conntrack's lookup between the raw and the other chains ([`Trace::ct_state`] is the state the
    /// packet had after it; its confirmation is not run: a trace changes no table), with
    /// `-m string` searching `bytes` (the packet from its network header on; empty:
    /// `--string` is false) and `-m connlimit` counting the connections of `ct` (a dry run: no
    /// list changes; without a table a connlimit rule counts only the packet's own
    /// connection).
    pub fn trace_tracked(
        &self,
        packet: &Packet,
        bytes: &[u8],
        now: u64,
        ct: Option<&Conntrack>,
        after_raw: impl FnOnce(&mut PacketMeta, &PacketFacts) -> Option<Verdict>,
    ) -> Trace {
        let mut after_raw = Some(after_raw);
        let mut track =
            |p: &mut PacketMeta, f: &PacketFacts| after_raw.take().and_then(|t| t(p, f));
        let Packet {
            meta: mut p,
            facts: mut f,
        } = *packet;
        let mut obs = Tracing {
            snapshot: self.id,
            ct,
            payload: bytes,
            names: &self.names,
            steps: Vec::new(),
            logs: Vec::new(),
            limits_asked: 0,
            hotdropped: false,
        };
        let verdict = self.evaluate(&mut p, &mut f, now, &mut obs, Hint::NONE, &mut track);
        Trace {
            verdict,
            steps: obs.steps,
            logs: obs.logs,
            mark: p.mark,
            ct_mark: p.ct_mark,
            ct_state: p.ct_state,
            limits_asked: obs.limits_asked,
            hotdropped: obs.hotdropped,
        }
    }
}
