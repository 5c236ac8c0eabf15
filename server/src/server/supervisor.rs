//! vallumd's tasks under one supervisor: every background task and listener runs in one
//! [`JoinSet`] under a name and a [`Stage`]; [`Supervisor::shutdown`] stops them stage by stage
//! in [`Stage`] order (within a stage, in the order they were added), with one drain signal,
//! and reports how each ended ([`Report`]), so that no task's failure or panic is dropped.
//!
//! A task stops in one of two ways: a periodic loop ([`Supervisor::spawn_loop`],
//! [`Supervisor::adopt_loop`]) holds nothing to finish and is aborted; a listener
//! ([`Supervisor::spawn_drained`]) is built with a [`Drain`] ([`Supervisor::drain`]) as its
//! graceful shutdown, which resolves when its stage's turn comes, and returns after it. A task that has not ended `grace` after its
//! turn is aborted and reported as [`Ended::TimedOut`].
//!
//! Dropping the supervisor without [`Supervisor::shutdown`] (an error during start) aborts
//! every task (the [`JoinSet`]'s drop).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{AbortHandle, Id, JoinError, JoinHandle, JoinSet};

/// When a task stops: every task of a stage stops before any task of the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Periodic loops and watchers (timers, garbage collection, reloads, the fleet agent):
    /// first, so that nothing changes state while the listeners drain.
    Loops,
    /// The gRPC listeners (TCP and the local socket): the calls in flight end.
    Listeners,
    /// `/metrics`: last, so that it can be scraped until the rest stopped.
    Metrics,
}

/// How a task ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It returned `Ok` (a listener after its drain).
    Returned,
    /// It returned an error (its text).
    Failed(String),
    /// It was aborted at its turn (a loop).
    Aborted,
    /// It panicked (the panic's message), before or during shutdown.
    Panicked(String),
    /// It had not ended `grace` after its turn, and was aborted.
    TimedOut,
}

/// One task's end, as [`Supervisor::shutdown`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The name it was added with.
    pub name: &'static str,
    /// Its stage.
    pub stage: Stage,
    /// How it ended.
    pub ended: Ended,
}

impl Report {
    /// Whether this end is a fault: a failure, a panic or a task that would not stop.
    pub fn is_fault(&self) -> bool {
        matches!(
            self.ended,
            Ended::Failed(_) | Ended::Panicked(_) | Ended::TimedOut
        )
    }
}

/// The drain signal as one task sees it: resolves when its stage's turn to stop comes (or the
/// supervisor is gone).
#[derive(Debug)]
pub struct Drain {
    turn: watch::Receiver<Option<Stage>>,
    stage: Stage,
}

impl Drain {
    /// Waits for this task's turn to stop.
    pub async fn signalled(mut self) {
        let stage = self.stage;
        // An error: the supervisor was dropped, which stops everything.
        let _ = self.turn.wait_for(|t| t.is_some_and(|t| t >= stage)).await;
    }
}

/// A task added to the supervisor.
#[derive(Debug)]
struct Task {
    name: &'static str,
    stage: Stage,
    /// What is aborted at its turn (a loop), rather than drained.
    abort_at_turn: Option<AbortHandle>,
    /// Its task in the set.
    id: Id,
    abort: AbortHandle,
}

/// The supervisor: see the module docs.
#[derive(Debug)]
pub struct Supervisor {
    set: JoinSet<Ended>,
    tasks: Vec<Task>,
    /// The one drain signal: the stage whose turn it is (`None`: running).
    turn: watch::Sender<Option<Stage>>,
    grace: Duration,
}

impl Supervisor {
    /// A supervisor whose tasks each get `grace` to end after their turn (vallumd: 5 s).
    pub fn new(grace: Duration) -> Supervisor {
        Supervisor {
            set: JoinSet::new(),
            tasks: Vec::new(),
            turn: watch::Sender::new(None),
            grace,
        }
    }

    /// Runs `task`, a loop, aborted in the [`Stage::Loops`] turn.
    pub fn spawn_loop<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let abort = self.set.spawn(async move {
            task.await;
            Ended::Returned
        });
        self.push(name, Stage::Loops, Some(abort.clone()), abort);
    }

    /// Takes over `handle`, a loop spawned elsewhere: aborted in the [`Stage::Loops`] turn;
    /// its panic is reported as its own.
    pub fn adopt_loop(&mut self, name: &'static str, handle: JoinHandle<()>) {
        let inner = handle.abort_handle();
        let abort = self.set.spawn(async move {
            // Dropping this task (the supervisor dropped) drops the guard, which aborts the
            // loop; at its turn the loop itself is aborted, and this reports it.
            let mut guard = AbortOnDrop(handle);
            match (&mut guard.0).await {
                Ok(()) => Ended::Returned,
                Err(e) if e.is_panic() => Ended::Panicked(panic_message(e)),
                Err(_) => Ended::Aborted,
            }
        });
        self.push(name, Stage::Loops, Some(inner), abort);
    }

    /// The drain signal of `stage`, for a listener to stop on (its graceful shutdown future)
    /// before it is handed over with [`Supervisor::spawn_drained`].
    pub fn drain(&self, stage: Stage) -> Drain {
        Drain {
            turn: self.turn.subscribe(),
            stage,
        }
    }

    /// Runs `task`, which returns once the [`Supervisor::drain`] of `stage` it was built with
    /// resolves (in `stage`'s turn).
    pub fn spawn_drained<F>(&mut self, name: &'static str, stage: Stage, task: F)
    where
        F: Future<Output = Result<(), String>> + Send + 'static,
    {
        let abort = self.set.spawn(async move {
            match task.await {
                Ok(()) => Ended::Returned,
                Err(e) => Ended::Failed(e),
            }
        });
        self.push(name, stage, None, abort);
    }

    fn push(
        &mut self,
        name: &'static str,
        stage: Stage,
        abort_at_turn: Option<AbortHandle>,
        abort: AbortHandle,
    ) {
        self.tasks.push(Task {
            name,
            stage,
            abort_at_turn,
            id: abort.id(),
            abort,
        });
    }

    /// Stops every task, stage by stage (see [`Stage`]), and reports how each ended, in the
    /// order they were stopped. Failures and panics are logged as errors here too, a task
    /// that would not stop as a warning.
    pub async fn shutdown(mut self) -> Vec<Report> {
        let mut tasks = std::mem::take(&mut self.tasks);
        // Stable: within a stage, the order they were added.
        tasks.sort_by_key(|t| t.stage);
        let mut ended: HashMap<Id, Result<Ended, JoinError>> = HashMap::new();
        let mut reports = Vec::with_capacity(tasks.len());
        let mut stage = None;
        for task in &tasks {
            if stage != Some(task.stage) {
                stage = Some(task.stage);
                self.turn.send_replace(stage);
            }
            if let Some(abort) = &task.abort_at_turn {
                abort.abort();
            }
            let end = match self.join(task.id, &mut ended).await {
                Some(Ok(end)) => end,
                Some(Err(e)) if e.is_cancelled() => Ended::Aborted,
                Some(Err(e)) => Ended::Panicked(panic_message(e)),
                None => {
                    // Gone before the next task's turn (or, stuck outside an await, given up
                    // on after a second grace).
                    task.abort.abort();
                    let _ = self.join(task.id, &mut ended).await;
                    Ended::TimedOut
                }
            };
            let report = Report {
                name: task.name,
                stage: task.stage,
                ended: end,
            };
            if let Ended::TimedOut = report.ended {
                tracing::warn!(task = report.name, "task did not stop in time: aborted");
            } else if report.is_fault() {
                tracing::error!(task = report.name, ended = ?report.ended, "task ended badly");
            } else {
                tracing::debug!(task = report.name, ended = ?report.ended, "task stopped");
            }
            reports.push(report);
        }
        self.set.shutdown().await;
        reports
    }

    /// The result of task `id`, waiting at most `grace` (`None`: not ended by then); results
    /// of other tasks that end meanwhile are kept in `ended`.
    async fn join(
        &mut self,
        id: Id,
        ended: &mut HashMap<Id, Result<Ended, JoinError>>,
    ) -> Option<Result<Ended, JoinError>> {
        let grace = tokio::time::sleep(self.grace);
        tokio::pin!(grace);
        loop {
            if let Some(r) = ended.remove(&id) {
                return Some(r);
            }
            tokio::select! {
                next = self.set.join_next_with_id() => match next {
                    Some(Ok((done, r))) => {
                        ended.insert(done, Ok(r));
                    }
                    Some(Err(e)) => {
                        ended.insert(e.id(), Err(e));
                    }
                    // Every task was joined, `id` among them: not reached.
                    None => return None,
                },
                _ = &mut grace => return None,
            }
        }
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The message of a panic (`&str` or `String` payloads; others are named by type only).
fn panic_message(e: JoinError) -> String {
    let payload = e.into_panic();
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Pushes its name to the log when dropped (a task's end, aborted or returned).
    struct Mark(&'static str, Arc<Mutex<Vec<&'static str>>>);

    impl Drop for Mark {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    #[tokio::test]
    async fn stops_stage_by_stage_and_reports_each_task() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut sup = Supervisor::new(Duration::from_secs(30));
        // Added out of stop order: metrics first, as vallumd starts it first.
        let (mark, drain) = (Mark("metrics", log.clone()), sup.drain(Stage::Metrics));
        sup.spawn_drained("metrics", Stage::Metrics, async move {
            let _mark = mark;
            drain.signalled().await;
            Ok(())
        });
        let (mark, drain) = (Mark("grpc", log.clone()), sup.drain(Stage::Listeners));
        sup.spawn_drained("grpc", Stage::Listeners, async move {
            let _mark = mark;
            drain.signalled().await;
            Err("accept failed".to_string())
        });
        let mark = Mark("timer", log.clone());
        sup.spawn_loop("timer", async move {
            let _mark = mark;
            std::future::pending::<()>().await;
        });
        let mark = Mark("adopted", log.clone());
        let adopted = tokio::spawn(async move {
            let _mark = mark;
            std::future::pending::<()>().await;
        });
        sup.adopt_loop("adopted", adopted);
        let reports = sup.shutdown().await;
        let got: Vec<(&str, Ended)> = reports.iter().map(|r| (r.name, r.ended.clone())).collect();
        assert_eq!(
            got,
            vec![
                ("timer", Ended::Aborted),
                ("adopted", Ended::Aborted),
                ("grpc", Ended::Failed("accept failed".into())),
                ("metrics", Ended::Returned),
            ]
        );
        // Each ended in its turn: the adopted loop itself, not only its wrapper, was aborted.
        assert_eq!(
            *log.lock().unwrap(),
            vec!["timer", "adopted", "grpc", "metrics"]
        );
    }

    #[tokio::test]
    async fn a_panic_is_reported_with_its_message() {
        let mut sup = Supervisor::new(Duration::from_secs(30));
        sup.spawn_drained("listener", Stage::Listeners, async move {
            panic!("listener broke");
        });
        let looped = tokio::spawn(async { panic!("loop broke") });
        while !looped.is_finished() {
            tokio::task::yield_now().await;
        }
        sup.adopt_loop("loop", looped);
        // Both panicked before the shutdown: reported, not dropped.
        let reports = sup.shutdown().await;
        let got: Vec<(&str, Ended)> = reports.iter().map(|r| (r.name, r.ended.clone())).collect();
        assert_eq!(
            got,
            vec![
                ("loop", Ended::Panicked("loop broke".into())),
                ("listener", Ended::Panicked("listener broke".into())),
            ]
        );
        assert!(reports.iter().all(Report::is_fault));
    }

    #[tokio::test]
    async fn tasks_that_ignore_the_drain_are_aborted_after_the_grace() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut sup = Supervisor::new(Duration::from_millis(20));
        // Three stuck listeners: three graces, one after the other.
        for name in ["stuck-1", "stuck-2", "stuck-3"] {
            let mark = Mark(name, log.clone());
            sup.spawn_drained(name, Stage::Listeners, async move {
                let _mark = mark;
                std::future::pending::<Result<(), String>>().await
            });
        }
        let (mark, drain) = (Mark("metrics", log.clone()), sup.drain(Stage::Metrics));
        sup.spawn_drained("metrics", Stage::Metrics, async move {
            let _mark = mark;
            drain.signalled().await;
            Ok(())
        });
        let reports = sup.shutdown().await;
        let got: Vec<(&str, Ended)> = reports.iter().map(|r| (r.name, r.ended.clone())).collect();
        assert_eq!(
            got,
            vec![
                ("stuck-1", Ended::TimedOut),
                ("stuck-2", Ended::TimedOut),
                ("stuck-3", Ended::TimedOut),
                ("metrics", Ended::Returned),
            ]
        );
        // Each stuck task is gone (aborted) before the next stage was told to stop.
        assert_eq!(
            *log.lock().unwrap(),
            vec!["stuck-1", "stuck-2", "stuck-3", "metrics"]
        );
    }

    #[tokio::test]
    async fn a_dropped_supervisor_drains_its_listeners() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut sup = Supervisor::new(Duration::from_secs(30));
        let drain = sup.drain(Stage::Metrics);
        sup.spawn_loop("loop", std::future::pending());
        let waiter = tokio::spawn(async move {
            drain.signalled().await;
            tx.send(()).unwrap();
        });
        drop(sup);
        rx.await.unwrap();
        waiter.await.unwrap();
    }
}
