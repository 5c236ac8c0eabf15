use super::*;
use crate::clock::ManualClock;
use crate::control::content::{RulesetInput, TextPart};
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::EngineConfig;
use vallum_engine::model::Family;

fn entry() -> AuditEntry {
    AuditEntry {
        caller: "me".into(),
        method: "Apply".into(),
        request_digest: "d".into(),
        outcome: "OK".into(),
    }
}

thread_local! {
    /// Run (once) by a commit on this thread just before it publishes.
    static BEFORE_PUBLISH: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        std::cell::RefCell::new(None);
}

/// Called by [`Pipeline::run`] once the revision is durable, just before it publishes
/// (on the test's thread: `#[tokio::test]` runs on one).
pub(super) fn before_publish() {
    if let Some(hook) = BEFORE_PUBLISH.with(|h| h.borrow_mut().take()) {
        hook();
    }
}

fn input(text: String) -> RulesetInput {
    RulesetInput {
        parts: vec![TextPart {
            text,
            family: Family::Ipv4,
            filename: "t.rules".into(),
            field: "source.text.content".into(),
            line_fields: None,
        }],
        nft: None,
    }
}

fn text(rules: usize) -> String {
    let mut text = String::from("*filter\n:INPUT DROP [0:0]\n");
    for i in 0..rules {
        text.push_str(&format!("-A INPUT -p tcp --dport {} -j ACCEPT\n", i + 1));
    }
    text.push_str("COMMIT\n");
    text
}

fn checked(rules: usize) -> Checked {
    crate::control::content::check("web", 0, &input(text(rules))).expect("checks")
}

fn engine(clock: Arc<dyn vallum_engine::Clock>) -> Arc<Engine> {
    Arc::new(Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        clock,
    ))
}

/// A pipeline on a one-core engine and a store in a temporary directory (kept alive by
/// the returned guard).
async fn pipeline(hooks: Hooks) -> (Pipeline, Arc<Engine>, Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (p, engine, store) = reopen(&dir, hooks).await;
    (p, engine, store, dir)
}

/// A new engine and pipeline on the store in `dir` (a restart), not loaded yet.
async fn reopen(dir: &tempfile::TempDir, hooks: Hooks) -> (Pipeline, Arc<Engine>, Store) {
    let store = Store::open_on(&dir.path().join("v.db"), hooks.clock.clone())
        .await
        .expect("store");
    let engine = engine(Arc::new(hooks.clock.clone()));
    let p = Pipeline::new(engine.clone(), store.clone(), hooks);
    (p, engine, store)
}

/// The field violations of a bad request.
fn bad_request(e: Error) -> (Reason, Vec<FieldViolation>) {
    match e {
        Error::BadRequest { reason, violations } => (reason, violations),
        other => panic!("expected a bad request, got {other:?}"),
    }
}

/// Each commit runs the validator once (the engine's, counted by
/// `Engine::validations`): Apply, a commit of a staged revision, a rollback, a revert and
/// the load at start; Stage and a dry run once too. A refused Apply is validated once
/// and refused with what the check of the text and the engine's validation gave before
/// they were one (content::check validated, then the engine's prepare validated again):
/// the same reason and `FILE:LINE:COL` descriptions, compared with that older path run
/// by hand here.
#[tokio::test]
async fn a_commit_validates_once() {
    let clock = ManualClock::starting_now();
    let hooks = Hooks {
        clock: clock.clock(),
        ..Hooks::default()
    };
    let (p, engine, _store, dir) = pipeline(hooks.clone()).await;
    let counted = |before: u64| engine.validations() - before;

    let n = engine.validations();
    p.apply(checked(1), "me", "m", None, None, &mut None)
        .await
        .expect("commits");
    assert_eq!(counted(n), 1, "apply");
    let n = engine.validations();
    let (_, staged, _) = p.stage(checked(2), "me", "m", None).await.expect("stages");
    assert_eq!(counted(n), 1, "stage");
    let n = engine.validations();
    p.commit_staged("web", staged.number, None, None, &mut None)
        .await
        .expect("commits");
    assert_eq!(counted(n), 1, "commit of a staged revision");
    let n = engine.validations();
    p.rollback("web", 1, "me", "", None, &mut None)
        .await
        .expect("rolls back");
    assert_eq!(counted(n), 1, "rollback");
    let within = Duration::from_secs(60);
    p.apply(checked(3), "me", "m", Some(within), None, &mut None)
        .await
        .expect("commits");
    clock.advance(within);
    let n = engine.validations();
    assert_eq!(p.expire_confirms().await.expect("reverts"), 1);
    assert_eq!(counted(n), 1, "revert");
    let n = engine.validations();
    let dry = p.validate(checked(4)).await.expect("validates");
    assert!(dry.validated() && dry.valid());
    assert_eq!(counted(n), 1, "dry run");

    // Refused: a loop of jumps (validation), an extension not enforced.
    for (bad, reason) in [
        (
            "*filter\n:INPUT ACCEPT [0:0]\n:x - [0:0]\n:y - [0:0]\n-A INPUT -j x\n-A x -j y\n-A y -j x\nCOMMIT\n",
            Reason::InvalidRuleset,
        ),
        (
            "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m hashlimit --hashlimit-upto 10mb/s --hashlimit-name b -j ACCEPT\nCOMMIT\n",
            Reason::UnsupportedExtension,
        ),
    ] {
        let c = crate::control::content::check("web", 0, &input(bad.into())).expect("parses");
        // The older path: the check's validation of the text, placed in the request.
        let v = vallum_engine::validate::validate(&c.ruleset, Some(&*p.sets));
        let before = bad_request(c.clone().with_violations(&v).into_valid().unwrap_err());
        let n = engine.validations();
        let e = p.apply(c, "me", "m", None, None, &mut None).await;
        assert_eq!(counted(n), 1, "refused apply");
        let now = bad_request(e.expect_err("refused"));
        assert_eq!(now, before, "{bad}");
        assert_eq!(now.0, reason);
        assert!(
            now.1
                .iter()
                .all(|v| v.field == "source.text.content" && v.description.starts_with("t.rules:")),
            "{now:?}"
        );
    }

    // The load at start validates each active revision once.
    drop(p);
    let (p, engine, _store) = reopen(&dir, hooks).await;
    assert!(p.load().await.expect("loads").is_empty());
    assert_eq!(engine.validations(), 1, "load");
}

/// A text checked while its set existed, whose set is destroyed before the commit, is
/// refused by the commit's validation at its `FILE:LINE:COL`, before anything is stored
/// (no revision, no FAILED commit). Before, the check's validation passed, the revision
/// was stored, the engine's second validation refused it and the store was reverted: a
/// REJECTED revision 1 and a FAILED outcome.
#[tokio::test]
async fn a_set_destroyed_after_the_check_is_refused_before_the_store() {
    use vallum_engine::sets::{SetSpec, SetType};
    let (p, _engine, store, _dir) = pipeline(Hooks::default()).await;
    p.create_set(
        "blocked",
        SetSpec::new(SetType::HashIp, Family::Ipv4),
        false,
    )
    .await
    .expect("creates");
    let t =
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m set --match-set blocked src -j DROP\nCOMMIT\n";
    let c = crate::control::content::check("web", 0, &input(t.into())).expect("parses");
    assert!(p.validate(c.clone()).await.expect("validates").valid());
    p.destroy_set("blocked", None).await.expect("destroys");
    let mut events = p.subscribe();
    let e = p.apply(c, "me", "m", None, None, &mut None).await;
    let (reason, v) = bad_request(e.expect_err("refused"));
    assert_eq!(reason, Reason::InvalidRuleset);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].field, "source.text.content");
    assert!(v[0].description.starts_with("t.rules:3:"), "{v:?}");
    assert!(v[0].description.contains("blocked"), "{v:?}");
    assert!(store.get_ruleset("web").await.expect("reads").is_none());
    assert!(events.try_recv().is_err(), "no FAILED commit");
}

/// Records the last `on_active` per ruleset (what `vallum_active_revision` shows).
#[derive(Default)]
struct ActiveSeen(Mutex<BTreeMap<String, Option<u64>>>);

impl crate::control::hooks::Observer for ActiveSeen {
    fn on_active(&self, ruleset: &str, revision: Option<u64>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ruleset.to_string(), revision);
    }
}

/// The active revision of `web` as every reader sees it, asserting they agree: the
/// store's row, the pipeline (health, GetStatus, the fleet agent), the engine's number,
/// the observer (the metric) and the rules the engine runs (`rules` of that revision).
async fn readers_agree(p: &Pipeline, seen: &ActiveSeen) -> Option<u64> {
    let stored = p
        .store()
        .get_ruleset("web")
        .await
        .expect("reads")
        .and_then(|r| r.active_revision);
    let pipeline = p.active().get("web").map(|a| a.revision);
    let engine = p.engine().revision("web").map(|a| a.revision);
    let metric = seen
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get("web")
        .copied()
        .flatten();
    assert_eq!(
        [pipeline, engine, metric],
        [stored; 3],
        "pipeline, engine, metric vs the store"
    );
    if let Some(n) = stored {
        let rev = p.store().get_revision("web", n).await.expect("reads");
        let rules = rev.expect("stored").rule_count as usize;
        assert_eq!(p.engine().rulesets()["web"].rule_count(), rules);
    } else {
        assert!(!p.engine().rulesets().contains_key("web"));
    }
    stored
}

/// One owner of the active revision: after a commit, a publish that fails (another
/// commit reached the engine between prepare and publish: stale), a revert of an
/// unconfirmed commit, a restart and a delete, every reader names the same revision.
#[tokio::test]
async fn readers_agree_on_the_active_revision() {
    let clock = ManualClock::starting_now();
    let seen = Arc::new(ActiveSeen::default());
    let hooks = Hooks {
        clock: clock.clock(),
        ..Hooks::default()
    }
    .with_observer(seen.clone());
    let (p, engine, _store, dir) = pipeline(hooks.clone()).await;
    assert_eq!(readers_agree(&p, &seen).await, None);
    p.apply(checked(1), "me", "m", None, None, &mut None)
        .await
        .expect("commits");
    assert_eq!(readers_agree(&p, &seen).await, Some(1));

    // A failed publish: the store is reverted, the engine runs revision 1 still.
    BEFORE_PUBLISH.with(|h| {
        let engine = engine.clone();
        *h.borrow_mut() = Some(Box::new(move || {
            let other = crate::control::content::check("other", 0, &input(text(1)))
                .expect("checks")
                .ruleset;
            engine
                .commit(Change::Put(other), &vallum_engine::sets::NoSets)
                .expect("commits");
        }))
    });
    let e = p.apply(checked(2), "me", "m", None, None, &mut None).await;
    assert!(matches!(e, Err(Error::Commit(_))), "{e:?}");
    assert_eq!(readers_agree(&p, &seen).await, Some(1));
    assert_eq!(
        p.store()
            .get_revision("web", 2)
            .await
            .expect("reads")
            .map(|r| r.state),
        Some(RevisionState::Rejected)
    );
    engine
        .commit(Change::Remove("other".into()), &vallum_engine::sets::NoSets)
        .expect("removes");

    // A commit-confirmed, then its revert.
    let within = Duration::from_secs(60);
    let r = p
        .apply(checked(3), "me", "m", Some(within), None, &mut None)
        .await
        .expect("commits");
    assert_eq!(readers_agree(&p, &seen).await, Some(r.revision.number));
    clock.advance(within);
    assert_eq!(p.expire_confirms().await.expect("reverts"), 1);
    let reverted = readers_agree(&p, &seen).await.expect("active");
    assert!(reverted > r.revision.number);
    assert_eq!(p.engine().rulesets()["web"].rule_count(), 1);

    // A restart.
    drop(p);
    let seen = Arc::new(ActiveSeen::default());
    let (p, _engine, _store) = reopen(&dir, hooks.clone().with_observer(seen.clone())).await;
    assert!(p.load().await.expect("loads").is_empty());
    assert_eq!(readers_agree(&p, &seen).await, Some(reverted));

    // A delete.
    p.delete("web", None).await.expect("deletes");
    assert_eq!(readers_agree(&p, &seen).await, None);
}

/// A commit-confirmed is rolled back when its deadline passes on the injected clock and
/// not before, and a new pipeline on the same store (a restart) keeps the deadline: the
/// clock is advanced, nothing waits.
#[tokio::test]
async fn confirm_deadline_passes_on_the_injected_clock() {
    let clock = ManualClock::starting_now();
    let hooks = Hooks {
        clock: clock.clock(),
        ..Hooks::default()
    };
    let (p, _engine, store, dir) = pipeline(hooks.clone()).await;
    p.apply(checked(1), "me", "m", None, None, &mut None)
        .await
        .expect("commits");
    let within = Duration::from_secs(60);
    let r = p
        .apply(checked(2), "me", "m", Some(within), None, &mut None)
        .await
        .expect("commits");
    assert_eq!(r.revision.state, RevisionState::PendingConfirm);
    assert_eq!(r.confirm_deadline, Some(clock.unix_ns() + 60_000_000_000));
    clock.advance(within - Duration::from_secs(1));
    assert_eq!(p.expire_confirms().await.expect("checks"), 0);

    // Restart: a new engine and pipeline on the same database.
    drop(p);
    store.close().await;
    let store = Store::open_on(&dir.path().join("v.db"), hooks.clock.clone())
        .await
        .expect("store");
    let engine = engine(Arc::new(hooks.clock.clone()));
    let p = Pipeline::new(engine.clone(), store.clone(), hooks);
    assert!(p.load().await.expect("loads").is_empty());
    assert_eq!(p.expire_confirms().await.expect("checks"), 0);
    let rev = |n| {
        let store = store.clone();
        async move {
            store
                .get_revision("web", n)
                .await
                .expect("read")
                .expect("revision")
        }
    };
    assert_eq!(rev(2).await.state, RevisionState::PendingConfirm);
    assert_eq!(engine.rulesets()["web"].rule_count(), 2);

    let mut events = p.subscribe();
    clock.advance(Duration::from_secs(1));
    assert_eq!(p.expire_confirms().await.expect("checks"), 1);
    let ev = events.try_recv().expect("an event");
    assert_eq!((ev.revision, ev.outcome), (Some(3), Outcome::Reverted));
    let rs = store
        .get_ruleset("web")
        .await
        .expect("read")
        .expect("ruleset");
    assert_eq!(rs.active_revision, Some(3));
    assert_eq!(rev(2).await.state, RevisionState::Rejected);
    assert_eq!(rev(3).await.digest, rev(1).await.digest);
    assert_eq!(engine.rulesets()["web"].rule_count(), 1);
    // Once is enough.
    assert_eq!(p.expire_confirms().await.expect("checks"), 0);
}

/// One injected clock times a commit: the revision row, the commit event, the phase
/// total and a set's stored time all read the manual clock, and only advancing it moves
/// them (no other clock is read on the way).
#[tokio::test]
async fn a_commit_reads_only_the_injected_clock() {
    let clock = ManualClock::starting_now();
    let hooks = Hooks {
        clock: clock.clock(),
        ..Hooks::default()
    };
    let (p, _engine, store, _dir) = pipeline(hooks).await;
    let mut events = p.subscribe();
    let t0 = clock.unix_ns();
    let r = p
        .apply(checked(1), "me", "m", None, None, &mut None)
        .await
        .expect("commits");
    assert_eq!(r.revision.created_at, t0);
    assert_eq!(r.phases.total_ns, 0, "the manual clock did not move");
    assert_eq!(events.try_recv().expect("an event").time_ns, t0);

    let hour = Duration::from_secs(3600);
    clock.advance(hour);
    let t1 = t0 + 3_600_000_000_000;
    assert_eq!(clock.unix_ns(), t1);
    let r = p
        .apply(checked(2), "me", "m", Some(hour), None, &mut None)
        .await
        .expect("commits");
    assert_eq!(r.revision.created_at, t1);
    assert_eq!(r.confirm_deadline, Some(t1 + 3_600_000_000_000));
    assert_eq!(events.try_recv().expect("an event").time_ns, t1);
    let stored = store
        .get_revision("web", 2)
        .await
        .expect("read")
        .expect("revision 2");
    assert_eq!(stored.created_at, t1);
    let rs = store
        .get_ruleset("web")
        .await
        .expect("read")
        .expect("ruleset");
    assert_eq!(rs.updated_at, t1);
}

/// After an Apply that carries its texts, the pipeline keeps them with the model the
/// engine now runs (the same `Arc`); a delete forgets them; an Apply without texts keeps
/// nothing.
#[tokio::test]
async fn apply_keeps_the_parse_for_the_next_check() {
    let (p, engine, _store, _dir) = pipeline(Hooks::default()).await;
    let c = checked(3);
    assert!(c.sources.is_empty());
    p.apply(c, "me", "m", None, None, &mut None)
        .await
        .expect("commits");
    assert!(p.previous_parse("web").is_none());

    let mut c = checked(4);
    let text = Arc::new(String::from("the text"));
    let source = SourceText {
        family: Family::Ipv4,
        text,
        canonical: None,
    };
    c.sources = vec![source.clone()];
    p.apply(c, "me", "m", None, None, &mut None)
        .await
        .expect("commits");
    let kept = p.previous_parse("web").expect("kept");
    assert_eq!(kept.texts, [source]);
    let model = kept.model.upgrade().expect("the engine runs it");
    assert!(Arc::ptr_eq(&model, &engine.rulesets()["web"]));
    assert_eq!(model.rule_count(), 4);
    drop(model);

    p.delete("web", None).await.expect("deletes");
    assert!(p.previous_parse("web").is_none());
    assert!(kept.model.upgrade().is_none(), "the engine dropped it");
}

/// The content a commit published is kept for the next `--noflush` edit by revision number
/// (`Pipeline::active_content`): byte for byte the store's text of that revision, given for
/// no other number, replaced by the next commit (a rollback included), and forgotten when the
/// ruleset is deleted (one made again numbers its revisions anew).
#[tokio::test]
async fn the_published_content_is_kept_for_the_next_edit() {
    let (p, _engine, store, _dir) = pipeline(Hooks::default()).await;
    let stored = async |n: u64| {
        store
            .get_revision("web", n)
            .await
            .expect("reads")
            .expect("stored")
            .content
            .as_ref()
            .clone()
    };
    let mut numbers = Vec::new();
    for rules in [3, 4] {
        let r = p
            .apply(checked(rules), "me", "m", None, None, &mut None)
            .await
            .expect("commits");
        numbers.push(r.revision.number);
    }
    let (n1, n2) = (numbers[0], numbers[1]);
    assert!(p.active_content("web", n1).is_none(), "replaced by {n2}");
    let kept = p.active_content("web", n2).expect("kept");
    assert_eq!(*kept, stored(n2).await);
    assert_ne!(stored(n1).await, stored(n2).await);

    let back = p
        .rollback("web", n1, "me", "back", None, &mut None)
        .await
        .expect("rolls back");
    let n3 = back.revision.number;
    assert!(p.active_content("web", n2).is_none(), "replaced by {n3}");
    let kept = p.active_content("web", n3).expect("kept");
    assert_eq!(*kept, stored(n3).await);
    assert_eq!(*kept, stored(n1).await);

    p.delete("web", None).await.expect("deletes");
    assert!(p.active_content("web", n3).is_none());
    let again = p
        .apply(checked(5), "me", "m", None, None, &mut None)
        .await
        .expect("commits");
    let n = again.revision.number;
    let kept = p.active_content("web", n).expect("kept");
    assert_eq!(*kept, stored(n).await);
    assert_eq!(*kept, checked(5).content);
}

/// The audit record of an Apply is written in the commit's own transaction (the slot is
/// emptied); one refused before anything is stored is left to the caller to write.
#[tokio::test]
async fn apply_writes_its_audit_record_with_the_commit() {
    let mut hooks = Hooks::default();
    hooks.limits.max_rules_per_ruleset = 5;
    let (p, _engine, store, _dir) = pipeline(hooks).await;

    let mut audit = Some(entry());
    let c = checked(3);
    let r = p.apply(c, "me", "m", None, None, &mut audit).await;
    assert_eq!(r.expect("commits").revision.number, 1);
    assert!(audit.is_none(), "written with the commit");
    assert_eq!(store.audit_count().await.expect("count"), 1);
    // Same text again: the chunks are shared, the revision is new.
    let mut audit = Some(entry());
    let c = checked(3);
    let r = p.apply(c, "me", "m", None, None, &mut audit).await;
    assert_eq!(r.expect("commits").revision.number, 2);
    assert_eq!(store.audit_count().await.expect("count"), 2);

    // Over --max-rules: refused before the store; the record is still the caller's.
    let mut audit = Some(entry());
    let c = checked(6);
    assert!(p.apply(c, "me", "m", None, None, &mut audit).await.is_err());
    assert!(audit.is_some());
    assert_eq!(store.audit_count().await.expect("count"), 2);
    let rev = store
        .get_revision("web", 2)
        .await
        .expect("read")
        .expect("rev 2");
    assert!(
        rev.content.v4().contains("--dport 3 -j ACCEPT"),
        "{}",
        rev.content.v4()
    );
}
