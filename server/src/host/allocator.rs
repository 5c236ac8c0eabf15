//! vallumd's global allocator, mimalloc, and how long it keeps freed memory.
//!
//! A 10k-rule Apply allocates and frees a few MB (the request, parsed rules, the canonical
//! text, the compiled snapshot). glibc's malloc handed that back to the kernel after every
//! call; mimalloc with its default `purge_delay` (1 s, decommitting) still purged ~1 GiB over
//! ~1,300 Applies of acl1_10k, and every call page-faulted its memory in again: ~90 page
//! faults and ~20% of the CPU time of a call (`perf stat`, BENCHMARKS.md §6). With a 10 s
//! delay a busy server reuses its memory and an idle one still returns it.

use std::ffi::c_long;

/// mimalloc's allocator type, for `#[global_allocator]` in `vallumd` and the server benches.
pub use mimalloc::MiMalloc;

/// How long freed memory stays with the process before mimalloc returns it to the kernel, ms.
pub const PURGE_DELAY_MS: c_long = 10_000;

/// `mi_option_purge_delay` of mimalloc.h (v3), which libmimalloc-sys 0.1.49 does not name.
/// `purge_delay_is_option_15` checks the number against the option's default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets mimalloc's purge delay to [`PURGE_DELAY_MS`], unless `MIMALLOC_PURGE_DELAY` is set in
/// the environment (then mimalloc read the operator's value at start and it stays). Call it
/// early in `main`; it only stores an option, whatever the global allocator is.
pub fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores a value for an option index in mimalloc's option table;
    // the index is in range (checked by `purge_delay_is_option_15`) and every value is valid
    // for this option (negative: never purge).
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Option 15 is the purge delay: it has that option's documented default (1000 ms in
    /// mimalloc v3) until set, and keeps what [`keep_freed_memory`] sets.
    #[test]
    fn purge_delay_is_option_15() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            panic!("purge_delay_is_option_15: MIMALLOC_PURGE_DELAY is set");
        }
        // SAFETY: reads an option value; the index is below `_mi_option_last`.
        let get = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(get(), 1000);
        keep_freed_memory();
        assert_eq!(get(), PURGE_DELAY_MS);
    }
}
