//! The commit events WatchCommits streams: numbered, and the latest [`KEPT`] kept in memory
//! so a watcher that reconnects resumes after the last one it saw without a gap or a
//! duplicate ([`Journal::resume`]).
//!
//! Sequence numbers increase by one per event. The first event of a process is numbered
//! with the wall-clock time (Unix ns) the journal was made, so the numbers of a restarted
//! vallumd start far above those of its previous run (which issued fewer than one event per
//! nanosecond): a watcher that resumes from a number of the previous run is told that the
//! events after it are not kept ([`Error::EventsNotKept`]) instead of silently missing them.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::broadcast;

use super::CommitEvent;
use crate::error::{Error, Result};

/// Commit events kept for resuming (the latest ones).
pub const KEPT: usize = 4096;

/// Events a live watcher may fall behind by before it is told it lost some.
const LIVE_CAPACITY: usize = 1024;

/// The numbered commit events: kept ones and the live channel.
#[derive(Debug)]
pub struct Journal {
    /// Sending and subscribing both happen under this lock, so a resumed watcher's replay
    /// (the kept events) and its live receiver meet exactly.
    inner: Mutex<Inner>,
    live: broadcast::Sender<CommitEvent>,
}

#[derive(Debug)]
struct Inner {
    /// The number of this process's first event.
    first: u64,
    /// The number the next event gets.
    next: u64,
    /// The latest events, oldest first, at most `capacity`.
    kept: VecDeque<CommitEvent>,
    capacity: usize,
}

impl Journal {
    /// A journal whose first event gets number `first` (≥ 1), keeping `capacity` events.
    pub fn new(first: u64, capacity: usize) -> Journal {
        let (live, _) = broadcast::channel(LIVE_CAPACITY);
        let first = first.max(1);
        Journal {
            inner: Mutex::new(Inner {
                first,
                next: first,
                kept: VecDeque::with_capacity(capacity.min(KEPT)),
                capacity,
            }),
            live,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the queue consistent (push/pop only).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Numbers `event` (its `sequence` is overwritten), keeps it and sends it to the live
    /// watchers.
    pub fn send(&self, mut event: CommitEvent) {
        let mut inner = self.lock();
        event.sequence = inner.next;
        inner.next += 1;
        if inner.kept.len() == inner.capacity {
            inner.kept.pop_front();
        }
        if inner.capacity > 0 {
            inner.kept.push_back(event.clone());
        }
        // No receiver is not an error: nobody watches.
        let _ = self.live.send(event);
    }

    /// The events after this call.
    pub fn subscribe(&self) -> broadcast::Receiver<CommitEvent> {
        let _inner = self.lock();
        self.live.subscribe()
    }

    /// The kept events numbered above `after`, and a receiver of every event after them.
    ///
    /// Errors: [`Error::EventsNotKept`] when an event numbered above `after` is no longer
    /// kept (evicted, or issued by an earlier run of vallumd); [`Error::BadRequest`] on
    /// `start_after` for a number not issued yet.
    pub fn resume(
        &self,
        after: u64,
    ) -> Result<(Vec<CommitEvent>, broadcast::Receiver<CommitEvent>)> {
        let inner = self.lock();
        let latest = inner.next - 1;
        if after > latest {
            return Err(Error::invalid(
                "start_after",
                format!("sequence {after} was not issued yet (the latest is {latest})"),
            ));
        }
        let oldest = inner.kept.front().map_or(inner.next, |e| e.sequence);
        if after + 1 < oldest {
            let kept = if inner.kept.is_empty() {
                format!(
                    "this vallumd keeps no event yet (its first will be {}; it started after that sequence was issued, or evicted it)",
                    inner.next
                )
            } else {
                format!(
                    "this vallumd keeps {oldest}..={latest} (the latest {}; its run started at {})",
                    inner.capacity, inner.first
                )
            };
            return Err(Error::EventsNotKept {
                start_after: after,
                kept,
            });
        }
        let replay = inner
            .kept
            .iter()
            .filter(|e| e.sequence > after)
            .cloned()
            .collect();
        Ok((replay, self.live.subscribe()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::outcome::Outcome;
    use crate::control::store::Phases;

    fn event(ruleset: &str) -> CommitEvent {
        CommitEvent {
            sequence: 0,
            ruleset: ruleset.to_string(),
            revision: Some(1),
            outcome: Outcome::Committed,
            phases: Phases::default(),
            error: None,
            time_ns: 0,
        }
    }

    fn seqs(v: &[CommitEvent]) -> Vec<u64> {
        v.iter().map(|e| e.sequence).collect()
    }

    #[test]
    fn resume_replays_the_kept_then_goes_live() {
        let j = Journal::new(100, 3);
        for _ in 0..2 {
            j.send(event("a"));
        }
        let (replay, mut rx) = j.resume(100).unwrap();
        assert_eq!(seqs(&replay), [101]);
        j.send(event("a"));
        assert_eq!(rx.try_recv().unwrap().sequence, 102);
        // The last one seen: nothing to replay.
        assert!(j.resume(102).unwrap().0.is_empty());
        // Before the first event of this run, nothing was missed.
        assert_eq!(seqs(&j.resume(99).unwrap().0), [100, 101, 102]);
    }

    #[test]
    fn evicted_and_earlier_runs_are_out_of_range() {
        let j = Journal::new(100, 2);
        for _ in 0..4 {
            j.send(event("a"));
        }
        // 100 and 101 were evicted: after 100, 101 is missing.
        assert!(matches!(
            j.resume(100),
            Err(Error::EventsNotKept {
                start_after: 100,
                ..
            })
        ));
        assert_eq!(seqs(&j.resume(101).unwrap().0), [102, 103]);
        // A number of an earlier run, with nothing issued yet in this one.
        let fresh = Journal::new(1_000, 2);
        let e = fresh.resume(50).unwrap_err();
        assert!(e.to_string().contains("keeps no event yet"), "{e}");
        // Not issued yet.
        assert!(matches!(j.resume(104), Err(Error::BadRequest { .. })));
    }
}
