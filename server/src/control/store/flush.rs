//! Group commit: the one fsync of the WAL that every waiting write shares (as PostgreSQL's
//! `XLogFlush` or etcd's batched raft log append).
//!
//! The writer connection runs with `synchronous = NORMAL`: a transaction's commit writes its
//! frames to the WAL file (`DB-wal`, in the page cache: a crash of vallumd keeps it) and
//! returns without an fsync. Each commit on the writer takes the next [`Mark`] (a sequence
//! number, under the writer connection's lock, so marks follow the WAL's order). A caller that
//! needs its write on disk asks for its mark ([`Flusher::request`]) and waits for it
//! ([`Flusher::wait`]); one flusher thread takes the highest mark written so far, fsyncs the WAL
//! file once (`fdatasync(2)` through its own descriptor: Linux flushes the file, whichever
//! descriptor wrote it) and answers every waiter up to that mark. Callers that arrive during an
//! fsync share the next one, so N concurrent commits cost about two fsyncs, not N.
//!
//! SQLite itself fsyncs the WAL before each checkpoint and the database file after it, so a
//! frame is on disk either through a flush here or before the checkpoint that moves it. The
//! WAL's directory entry is made durable once, at the first flush (SQLite would do that at
//! its first WAL sync, which `NORMAL` defers to the first checkpoint).
//!
//! An fsync that fails is sticky (as PostgreSQL since "fsyncgate": the kernel may have dropped
//! the dirty pages, so a retry that succeeds proves nothing): every later wait fails with
//! [`Error::Io`] naming the fsync and its error, and vallumd must be restarted (it then reads the
//! store as the disk has it).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Error, Result};

/// A position in the writer's sequence of committed transactions: on disk once the
/// `Flusher`'s durable mark reaches it.
pub type Mark = u64;

/// What the flusher thread and the writers share.
#[derive(Debug)]
struct Shared {
    /// `DB-wal`.
    wal: PathBuf,
    state: Mutex<State>,
    /// Wakes the flusher thread: a mark was requested, or the store closed.
    wake: Condvar,
    /// What is durable (`Flushed`), for the waiters.
    durable: tokio::sync::watch::Sender<Flushed>,
}

#[derive(Debug, Default)]
struct State {
    /// The mark of the last committed transaction.
    written: Mark,
    /// The highest mark a caller asked to be flushed.
    wanted: Mark,
    /// The store is closed: the thread ends.
    stop: bool,
}

/// What the flusher has made durable.
#[derive(Clone, Debug, Default)]
struct Flushed {
    /// Every mark up to this one is on disk.
    upto: Mark,
    /// The fsync that failed, its error's kind and text (sticky; see the module docs).
    failed: Option<(std::io::ErrorKind, Arc<str>)>,
    /// Fsyncs done so far (for tests and the bench: how many writes shared one).
    fsyncs: u64,
}

/// The group flusher of one database's WAL (cheap to clone: shared). The thread ends when
/// the last clone is dropped.
#[derive(Clone, Debug)]
pub(crate) struct Flusher {
    shared: Arc<Shared>,
    _stop: Arc<StopOnDrop>,
}

/// Stops the flusher thread when the last [`Flusher`] goes.
#[derive(Debug)]
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        lock(&self.0.state).stop = true;
        self.0.wake.notify_one();
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Flusher {
    /// Starts the flusher of the database at `db` (its WAL is `db` + `-wal`).
    ///
    /// Errors: [`Error::Io`] when the thread cannot be started.
    pub(crate) fn start(db: &Path) -> Result<Flusher> {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        let shared = Arc::new(Shared {
            wal: PathBuf::from(wal),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            durable: tokio::sync::watch::Sender::new(Flushed::default()),
        });
        let thread = shared.clone();
        std::thread::Builder::new()
            .name("vallum-wal-flush".into())
            .spawn(move || run(&thread))
            .map_err(|source| Error::Io {
                what: "start the WAL flusher thread".into(),
                source,
            })?;
        Ok(Flusher {
            _stop: Arc::new(StopOnDrop(shared.clone())),
            shared,
        })
    }

    /// Records a committed transaction; returns its mark. The caller holds the writer
    /// connection, so marks follow the order of the transactions in the WAL.
    pub(crate) fn wrote(&self) -> Mark {
        let mut st = lock(&self.shared.state);
        st.written += 1;
        st.written
    }

    /// The mark of the last committed transaction.
    pub(crate) fn written(&self) -> Mark {
        lock(&self.shared.state).written
    }

    /// Asks for `mark` to be flushed, without waiting (the fsync starts now; [`Flusher::wait`]
    /// waits for it).
    pub(crate) fn request(&self, mark: Mark) {
        if self.shared.durable.borrow().upto >= mark {
            return;
        }
        let mut st = lock(&self.shared.state);
        if mark > st.wanted {
            st.wanted = mark;
            self.shared.wake.notify_one();
        }
    }

    /// Waits until `mark` is on disk (asking for it first).
    ///
    /// Errors: [`Error::Io`] when an fsync of the WAL failed (sticky, see the module docs);
    /// [`Error::Invariant`] when the flusher is gone.
    pub(crate) async fn wait(&self, mark: Mark) -> Result<()> {
        self.request(mark);
        let mut rx = self.shared.durable.subscribe();
        let done = rx
            .wait_for(|f| f.upto >= mark || f.failed.is_some())
            .await
            .map_err(|_| Error::Invariant {
                what: "the WAL flusher is gone while the store is open".into(),
            })?;
        match &done.failed {
            Some((kind, e)) => Err(Error::Io {
                what: format!(
                    "fsync of {} failed; acknowledged writes may be lost at a host crash, \
                     restart vallumd",
                    self.shared.wal.display()
                ),
                source: std::io::Error::new(*kind, e.to_string()),
            }),
            None => Ok(()),
        }
    }

    /// The fsyncs of the WAL done so far.
    pub(crate) fn fsyncs(&self) -> u64 {
        self.shared.durable.borrow().fsyncs
    }
}

/// The flusher thread: waits for a request, fsyncs up to the last written mark, answers.
fn run(sh: &Shared) {
    let mut dir_synced = false;
    loop {
        let target = {
            let mut st = lock(&sh.state);
            loop {
                if st.stop {
                    return;
                }
                if st.wanted > sh.durable.borrow().upto {
                    break;
                }
                st = sh.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            // Everything committed so far rides on this fsync, asked for or not.
            st.written
        };
        let result = sync(&sh.wal, !dir_synced);
        dir_synced |= result.is_ok();
        sh.durable.send_modify(|f| {
            f.fsyncs += 1;
            match result {
                Ok(()) => f.upto = f.upto.max(target),
                Err(e) => {
                    tracing::error!(wal = %sh.wal.display(), error = %e, "fsync of the WAL failed");
                    f.failed
                        .get_or_insert_with(|| (e.kind(), e.to_string().into()));
                }
            }
        });
        if sh.durable.borrow().failed.is_some() {
            // Every waiter has its answer; later waits see the failure at once.
            return;
        }
    }
}

/// `fdatasync(2)` of `wal` (and, with `dir`, `fsync(2)` of its directory).
fn sync(wal: &Path, dir: bool) -> std::io::Result<()> {
    std::fs::File::open(wal)?.sync_data()?;
    if dir && let Some(parent) = wal.parent() {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}
