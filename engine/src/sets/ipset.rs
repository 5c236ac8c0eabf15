//! ipset-style sets: `hash:ip`, `hash:net`, `hash:ip,port`, `hash:net,port`, one family each,
//! and `bitmap:port` (ports of either family), with optional per-element timeouts and
//! counters, managed by a [`SetManager`] without a ruleset commit. A set whose elements carry
//! a verdict (`KEY : VERDICT`, [`crate::sets::verdict`]) is an nft verdict map, which a
//! compiled `vmap` rule looks the packet's key up in.
//!
//! # Reads without a lock: two copies, retired through the dataplane's generations
//!
//! A set's elements live in a `Content` (per-family Fx hash table with packed keys, plus the
//! prefix lengths present; see `content.rs` for the probe). A [`SetHandle`] is the shared cell
//! the compiled snapshot holds (as [`crate::sets::SetRef::Handle`], no trait object); it keeps
//! **two** copies of the content in a left-right cell
//! (`crate::dataplane::left_right`, which has the memory-ordering argument):
//! - a lookup inside a batch of the dataplane the [`SetManager`] was built for
//!   ([`SetManager::for_dataplane`]) reads the live copy through one Acquire pointer load:
//!   no lock, no reference count, no store. The batch's odd generation (the one commits wait
//!   for) protects it. A lookup anywhere else (traces, tests, a manager built with
//!   [`SetManager::new`]) takes a read lock instead;
//! - writers (serialized per set) stage a change as a list of element changes checked against
//!   the live copy (`Delta`: all or none), apply it to the standby copy, flip the pointer
//!   (one Release store: readers see all of the change or none), and replay it on the copy
//!   readers left at the next update, once the cores that were mid-batch at the flip have
//!   moved on (at most the rest of one batch each; usually they have long since). An update
//!   costs its own size twice and never copies the table; it waits for no reader.
//!
//! # Swap
//!
//! [`SetManager::swap`] exchanges the *contents* (elements and options) of two cells; the cells
//! stay under their names, so every handle a compiled snapshot already holds for `A` sees `B`'s
//! former elements from then on. Both copies move (nothing is copied or waited for); each cell
//! flips atomically; a packet that tests both sets during the swap may see both pointing at
//! the same content for a moment (two stores).
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
//! With `counters`, each element has packet/byte counters shared by both copies (one `Arc`),
//! bumped with relaxed atomics on a match.

mod content;
mod element;
mod manager;
#[cfg(test)]
mod tests;

pub use content::SetHandle;
pub use element::{
    AddOptions, Element, MAX_NAME_LEN, MAX_NFT_NAME_LEN, SetError, SetSpec, SetType, check_name,
};
pub(super) use manager::Staged;
pub use manager::{ListedElement, Prepared, SetInfo, SetManager, SetSummary};
