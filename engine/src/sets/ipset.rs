//! ipset-style sets: `hash:ip`, `hash:net`, `hash:ip,port`, `hash:net,port`, one family each,
//! with optional per-element timeouts and counters, managed by a [`SetManager`] without a
//! ruleset commit.
//!
//! # Lock-free reads (RCU by `arc-swap`)
//!
//! A set's elements live in an immutable `Content` (an Fx hash table plus the list of prefix
//! lengths present). A [`SetHandle`] is the shared cell the compiled snapshot holds (as
//! `Arc<dyn IpSet>`); it keeps the current content in an [`ArcSwap`]. The packet path does
//! `content.load()` (lock-free: a thread-local debt slot, no lock, no allocation), probes the
//! table and drops the guard. Writers (all serialized by the manager's mutex) clone the
//! content, change the clone and `store` it: copy-on-write, one publication per call, so
//! callers should batch (`add`/`delete` take many elements). A reader sees either the old or
//! the new table, never a half-applied batch. The old table is freed when its last reader
//! drops its guard.
//!
//! # Swap
//!
//! [`SetManager::swap`] exchanges the *contents* (elements and options) of two cells; the cells
//! stay under their names, so every handle a compiled snapshot already holds for `A` sees `B`'s
//! former elements from then on. Each cell flips atomically; a packet that tests both sets
//! during the swap may see both pointing at the same content for a moment (two stores).
//! Only sets of the same type and family can be swapped (as ipset), so a compiled
//! `--match-set` never sees its dimension change.
//!
//! # Destroy
//!
//! [`SetManager::destroy`] removes the name; snapshots still holding the handle keep matching
//! against its last content. Refusing to destroy a set that a committed ruleset references is
//! the caller's job (the server knows the rulesets); [`SetManager::handle_count`] helps.
//!
//! # Counters
//!
//! With `counters`, each element has packet/byte counters shared by every version of the table
//! (an `Arc` the copy-on-write clone keeps), bumped with relaxed atomics on a match.

mod content;
mod element;
mod manager;
#[cfg(test)]
mod tests;

pub use content::SetHandle;
pub use element::{AddOptions, Element, MAX_NAME_LEN, SetError, SetSpec, SetType, check_name};
pub(super) use manager::Staged;
pub use manager::{ListedElement, Prepared, SetInfo, SetManager, SetSummary};
