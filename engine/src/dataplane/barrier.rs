//! Barrier strategies: the fence a worker runs between "I am in a batch" (odd generation) and
//! loading the active snapshot, and the matching fence the committer runs between publishing and
//! reading the generations. See the argument in [`crate::dataplane`].

use crate::sync::{Ordering, fence, light_barrier};

/// How workers and the committer order the store-buffering pair of the commit protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BarrierStrategy {
    /// Symmetric: `fence(SeqCst)` in every batch (an `mfence`/`lock`-prefixed op on x86-64, a
    /// `dmb ish` on arm64) and in the committer. Works everywhere.
    SeqCst,
    /// Asymmetric: a compiler fence only in every batch; the committer calls
    /// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full barrier on every CPU
    /// currently running a thread of this process (threads that are not running pass one in the
    /// context switch). Linux >= 4.14; needs registration, done by `Dataplane::new`.
    Membarrier,
}

impl BarrierStrategy {
    /// A short lowercase name for metric labels (`seqcst`, `membarrier`).
    pub fn as_str(self) -> &'static str {
        match self {
            BarrierStrategy::SeqCst => "seqcst",
            BarrierStrategy::Membarrier => "membarrier",
        }
    }
}

impl std::fmt::Display for BarrierStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the membarrier strategy could not be set up (the dataplane then falls back to
/// [`BarrierStrategy::SeqCst`] and reports this through `Dataplane::fallback_reason`).
#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    /// `membarrier(MEMBARRIER_CMD_QUERY)` failed (ENOSYS: kernel without membarrier, or a
    /// seccomp filter that blocks it).
    #[error("membarrier query failed: {0}")]
    Query(#[source] std::io::Error),
    /// The kernel answered the query, but without `MEMBARRIER_CMD_PRIVATE_EXPEDITED` in the mask
    /// of supported commands (Linux < 4.14). Carries the mask.
    #[error("membarrier PRIVATE_EXPEDITED not supported (supported mask {0:#x})")]
    Unsupported(i64),
    /// `membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)` failed.
    #[error("membarrier REGISTER_PRIVATE_EXPEDITED failed: {0}")]
    Register(#[source] std::io::Error),
    /// The target OS has no membarrier (it is Linux-only).
    #[error("membarrier is only available on Linux")]
    NotLinux,
}

/// The membarrier commands we use (values of the kernel ABI, `uapi/linux/membarrier.h`).
pub(crate) mod cmd {
    /// Ask for the mask of supported commands.
    pub const QUERY: i32 = 0;
    /// Full barrier on every CPU running a thread of this process.
    pub const PRIVATE_EXPEDITED: i32 = 1 << 3;
    /// Register this process for `PRIVATE_EXPEDITED`.
    pub const REGISTER_PRIVATE_EXPEDITED: i32 = 1 << 4;
}

/// Issues `membarrier(cmd, flags = 0, cpu_id = 0)`; returns the syscall's non-negative result.
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn membarrier_syscall(cmd: i32) -> std::io::Result<i64> {
    // SAFETY: membarrier takes three integer arguments and touches no memory of ours; any
    // command value is safe to pass (unknown ones fail with EINVAL).
    let r = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd as libc::c_int,
            0 as libc::c_uint,
            0 as libc::c_int,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as i64)
    }
}

/// Not Linux (or under miri, which has no membarrier): the syscall does not exist.
#[cfg(any(not(target_os = "linux"), miri))]
pub(crate) fn membarrier_syscall(_cmd: i32) -> std::io::Result<i64> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// Queries support and registers the process for `PRIVATE_EXPEDITED`, using `sys` to issue the
/// syscall (injectable so that tests can drive the error paths).
pub(crate) fn register_with(
    sys: &mut dyn FnMut(i32) -> std::io::Result<i64>,
) -> Result<(), BarrierError> {
    if cfg!(not(target_os = "linux")) {
        return Err(BarrierError::NotLinux);
    }
    let mask = sys(cmd::QUERY).map_err(BarrierError::Query)?;
    if mask & i64::from(cmd::PRIVATE_EXPEDITED) == 0
        || mask & i64::from(cmd::REGISTER_PRIVATE_EXPEDITED) == 0
    {
        return Err(BarrierError::Unsupported(mask));
    }
    sys(cmd::REGISTER_PRIVATE_EXPEDITED).map_err(BarrierError::Register)?;
    Ok(())
}

/// The worker's barrier between the odd generation store and the load of `active`.
#[inline(always)]
pub(crate) fn reader_barrier(strategy: BarrierStrategy) {
    match strategy {
        // Pairs with the committer's fence(SeqCst) in `writer_barrier`: of the two fences, the
        // one first in the SeqCst total order makes its side's store visible to the other
        // side's load after the second fence.
        BarrierStrategy::SeqCst => fence(Ordering::SeqCst),
        // Pairs with the committer's membarrier(): see `crate::sync::light_barrier`.
        BarrierStrategy::Membarrier => light_barrier(),
    }
}

/// The committer's barrier between publishing the new snapshot and reading the generations.
///
/// # Panics
///
/// With [`BarrierStrategy::Membarrier`], if the membarrier syscall fails although registration
/// succeeded (the kernel documents no such failure). Without the barrier quiescence could not be
/// proven, so the caller must not free the old snapshot; `commit` leaks it in that case.
pub(crate) fn writer_barrier(strategy: BarrierStrategy) {
    if strategy == BarrierStrategy::Membarrier {
        #[cfg(not(loom))]
        if let Err(e) = membarrier_syscall(cmd::PRIVATE_EXPEDITED) {
            panic!("membarrier(PRIVATE_EXPEDITED) failed after successful registration: {e}");
        }
        // Under loom the membarrier is modelled by the fence below (the readers' light barrier
        // is a real fence(SeqCst) under loom as well).
    }
    // SeqCst: the writer half of the symmetric pairing (see `reader_barrier`). Membarrier: the
    // syscall already runs smp_mb() on this thread before and after the IPIs; the fence keeps
    // the language-level argument identical for both strategies and costs ~20 ns next to a
    // syscall of several microseconds.
    fence(Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(code: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(code)
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn query_failure_is_reported() {
        let err = register_with(&mut |_| Err(errno(libc::ENOSYS))).unwrap_err();
        assert!(matches!(err, BarrierError::Query(_)), "{err:?}");
        assert!(err.to_string().contains("query failed"), "{err}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn missing_private_expedited_is_reported() {
        let err = register_with(&mut |c| {
            assert_eq!(c, cmd::QUERY, "must not register without support");
            Ok(0b111)
        })
        .unwrap_err();
        assert!(matches!(err, BarrierError::Unsupported(0b111)), "{err:?}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn register_failure_is_reported() {
        let mut calls = Vec::new();
        let err = register_with(&mut |c| {
            calls.push(c);
            if c == cmd::QUERY {
                Ok(0x1ff)
            } else {
                Err(errno(libc::EPERM))
            }
        })
        .unwrap_err();
        assert!(matches!(err, BarrierError::Register(_)), "{err:?}");
        assert_eq!(calls, vec![cmd::QUERY, cmd::REGISTER_PRIVATE_EXPEDITED]);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn success_registers() {
        let mut calls = Vec::new();
        register_with(&mut |c| {
            calls.push(c);
            Ok(if c == cmd::QUERY { 0x1ff } else { 0 })
        })
        .unwrap();
        assert_eq!(calls, vec![cmd::QUERY, cmd::REGISTER_PRIVATE_EXPEDITED]);
    }
}
