use super::*;
use crate::control::content::Text;
use vallum_engine::model::Family;

/// Wall now, Unix ns.
fn now_ns() -> i64 {
    crate::clock::Clock::system().unix_ns()
}

/// A database at `path` migrated up to `until` only, as an older build left it.
fn old_db(path: &Path, until: i64) -> Connection {
    let mut conn = Connection::open(path).unwrap();
    conn.pragma_update(None, "foreign_keys", true).unwrap();
    migrate::run_to(&mut conn, until, crate::clock::Clock::system().unix_ns()).unwrap();
    conn
}

fn new_rev(name: &str, text: &str) -> NewRevision {
    NewRevision {
        ruleset: name.into(),
        priority: 0,
        content: Content::new(text.into(), String::new()),
        rule_count: 1,
        author: "test".into(),
        message: "m".into(),
    }
}

fn commit(name: &str, target: CommitTarget) -> PersistCommit {
    PersistCommit {
        ruleset: name.into(),
        target,
        state: RevisionState::Active,
        outcome: Outcome::Committed,
        previous_state: RevisionState::Superseded,
        confirm_deadline: None,
        expected_etag: None,
        started_at: now_ns(),
        validate_ns: 1,
        priority: None,
        audit: None,
    }
}

/// A store written before the texts moved to `revision_content` opens with every revision
/// and its text intact.
#[tokio::test]
async fn revision_texts_survive_the_content_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.db");
    {
        let conn = old_db(&path, 20261130070000);
        conn.execute(
                "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
                 VALUES ('a', 0, 'e', 2, 2, 1, 1)",
                [],
            )
            .unwrap();
        for (n, v4, state) in [
            (1, "*filter\n-A INPUT -j DROP\nCOMMIT\n", "SUPERSEDED"),
            (2, "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n", "ACTIVE"),
        ] {
            conn.execute(
                    "INSERT INTO revisions (ruleset, number, parent, digest, content_v4, content_v6, rule_count, author, message, state, created_at) \
                     VALUES ('a', ?1, NULL, 'd', ?2, '*filter\nCOMMIT\n', 1, 'me', 'm', ?3, 1)",
                    params![n, v4, state],
                )
                .unwrap();
        }
    }
    let store = Store::open(&path).await.unwrap();
    let r1 = store.get_revision("a", 1).await.unwrap().unwrap();
    assert_eq!(r1.content.v4(), "*filter\n-A INPUT -j DROP\nCOMMIT\n");
    assert_eq!(r1.content.v6(), "*filter\nCOMMIT\n");
    assert_eq!(r1.state, RevisionState::Superseded);
    let listed = store.list_revisions("a", 0, 10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        listed[1].content.v4(),
        "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"
    );
    let (rs, active) = store.active().await.unwrap().remove(0);
    assert_eq!((rs.name.as_str(), active.number), ("a", 2));
    assert_eq!(active.content.v4(), listed[1].content.v4());
    // The old texts became one chunk each (4 texts); deleting the ruleset frees them.
    assert_eq!(chunk_count(&store).await, (4, 4));
    assert!(store.delete_ruleset("a", None).await.unwrap());
    assert_eq!(chunk_count(&store).await, (0, 0));
}

/// A database made by the build before the store had one driver (sqlx ran its
/// migrations, chunk lists were comma-separated text with counts kept by hand; made by
/// `make_fixture` at cd75b4d, see tests/fixtures/README.md) opens in place: every revision
/// reads back byte-identical, with its rows, commits, sets, idempotency and load failure
/// marks, the chunk lists are rows SQLite checks, and it keeps working.
#[tokio::test]
async fn a_database_made_by_the_two_driver_store_migrates_in_place() {
    let text = |k: usize, fam: &str| {
        let mut s = String::from("*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n");
        for i in 0..1500 {
            let port = if i % 500 == 7 { 20_000 + k } else { i };
            s.push_str(&format!(
                "-A INPUT -s {fam}{}.0/24 -p tcp -m tcp --dport {port} -j ACCEPT\n",
                i % 200
            ));
        }
        s + "COMMIT\n"
    };
    let content = |k: usize| {
        Content::new(
            text(k, "10.0."),
            if k % 2 == 0 {
                text(k, "2001:db8:")
            } else {
                String::new()
            },
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.db");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store_two_drivers.db"),
        &path,
    )
    .unwrap();
    let store = Store::open(&path).await.unwrap().with_revisions_kept(4);
    let a = store.list_revisions("a", 0, 100).await.unwrap();
    // Six commits and a stage, four kept: 4, 5 (replaced), 6 (active), 7 (staged).
    assert_eq!(a.iter().map(|r| r.number).collect::<Vec<_>>(), [4, 5, 6, 7]);
    for r in &a {
        let k = r.number as usize - 1;
        assert_eq!(*r.content, content(k), "a/{}", r.number);
        assert_eq!(r.digest, r.content.digest());
        assert_eq!(
            (r.author.clone(), r.message.clone()),
            (format!("author{k}"), format!("message {k}"))
        );
        assert_eq!(r.rule_count, 1500);
    }
    let states: Vec<RevisionState> = a.iter().map(|r| r.state).collect();
    use RevisionState::*;
    assert_eq!(states, [Superseded, Superseded, Active, Staged]);
    let b = store.get_revision("b", 1).await.unwrap().unwrap();
    assert_eq!(
        ((*b.content).clone(), b.state),
        (content(2), PendingConfirm)
    );
    let c = store.get_revision("c", 1).await.unwrap().unwrap();
    assert_eq!(*c.content, Content::default());
    let rs = store.get_ruleset("a").await.unwrap().unwrap();
    assert_eq!(
        (rs.priority, rs.active_revision, rs.latest_revision),
        (5, Some(6), 7)
    );
    let commits = store.commits("a").await.unwrap();
    assert_eq!(commits.len(), 6);
    assert!(
        commits
            .iter()
            .all(|c| c.phases.total_ns == 99 && c.outcome == Outcome::Committed)
    );
    assert_eq!(store.pending_confirms().await.unwrap()[0].ruleset, "b");
    assert_eq!(store.audit_count().await.unwrap(), 9);
    let kept = Store::open(&path).await.unwrap().with_retention(Retention {
        idempotency_ttl: None,
        ..Retention::default()
    });
    let call = kept.idempotent_get("req-1", now_ns()).await;
    assert_eq!(call.unwrap().unwrap().1.response, b"\x01\x02resp");
    drop(kept);
    assert_eq!(store.load_failures().await.unwrap()[0].error, "boom");
    let sets = store.load_sets(0).await.unwrap();
    assert_eq!((sets[0].name.as_str(), sets[0].elements.len()), ("s4", 2));
    assert_refs_exact(&store).await;
    // sqlx's bookkeeping became ours.
    assert_eq!(
        count(&store, "SELECT COUNT(*) FROM schema_migrations").await,
        migrate::MIGRATIONS.len() as i64
    );
    assert_eq!(
        count(
            &store,
            "SELECT COUNT(*) FROM sqlite_master WHERE name = '_sqlx_migrations'"
        )
        .await,
        0
    );
    // It keeps working: a commit shares the stored chunks, pruning frees the old ones.
    let p = store
        .persist_commit(commit(
            "a",
            CommitTarget::New(NewRevision {
                content: content(3),
                ..new_rev("a", "")
            }),
        ))
        .await
        .unwrap();
    assert_eq!(p.revision.number, 8);
    assert_eq!(
        *store.get_revision("a", 8).await.unwrap().unwrap().content,
        content(3)
    );
    assert_refs_exact(&store).await;
    for name in ["a", "b", "c"] {
        assert!(store.delete_ruleset(name, None).await.unwrap());
    }
    assert_eq!(chunk_count(&store).await, (0, 0));
    drop(store);
    // And opens again.
    assert!(
        Store::open(&path)
            .await
            .unwrap()
            .list_rulesets()
            .await
            .unwrap()
            .is_empty()
    );
}

/// A store written before outcomes were one vocabulary: the confirm timer's ROLLED_BACK
/// rows (a deactivation, an automatic rollback) become REVERTED, a deliberate rollback
/// stays ROLLED_BACK; every outcome can be written afterwards.
#[tokio::test]
async fn confirm_timeouts_become_reverted_in_the_outcome_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.db");
    {
        let conn = old_db(&path, 20261201140000);
        conn.execute(
                "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
                 VALUES ('a', 0, 'e', 4, 4, 1, 1)",
                [],
            )
            .unwrap();
        for (n, author, message) in [
            (1, "me", "m"),
            (2, "me", "rollback to revision 1"),
            (3, "me", "m"),
            (
                4,
                "vallumd",
                "automatic rollback: revision 3 was not confirmed in time",
            ),
        ] {
            conn.execute(
                    "INSERT INTO revisions (ruleset, number, parent, digest, rule_count, author, message, state, created_at) \
                     VALUES ('a', ?1, NULL, 'd', 0, ?2, ?3, 'SUPERSEDED', 1)",
                    params![n, author, message],
                )
                .unwrap();
        }
        for (revision, previous, outcome) in [
            (1, None, "COMMITTED"),
            (2, Some(1), "ROLLED_BACK"),
            (3, Some(2), "COMMITTED"),
            (4, Some(3), "ROLLED_BACK"),
            (5, Some(5), "ROLLED_BACK"),
        ] {
            conn.execute(
                "INSERT INTO commits (ruleset, revision, previous, outcome, started_at) \
                     VALUES ('a', ?1, ?2, ?3, 1)",
                params![revision, previous, outcome],
            )
            .unwrap();
        }
    }
    let store = Store::open(&path).await.unwrap();
    let outcomes: Vec<Outcome> = store
        .commits("a")
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.outcome)
        .collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Committed,
            Outcome::RolledBack,
            Outcome::Committed,
            Outcome::Reverted,
            Outcome::Reverted,
        ]
    );
    for o in Outcome::ALL {
        store
            .writer
            .run(move |tx| {
                tx.execute(
                    "INSERT INTO commits (ruleset, revision, previous, outcome, started_at) \
                         VALUES ('b', 1, NULL, ?1, 1)",
                    [o.as_str()],
                )?;
                Ok(())
            })
            .await
            .unwrap_or_else(|e| panic!("{o}: {e}"));
    }
    assert_eq!(store.commits("b").await.unwrap().len(), Outcome::ALL.len());
}

/// `SELECT COUNT(*)`-style query of one integer.
async fn count(store: &Store, sql: &'static str) -> i64 {
    store
        .readers
        .run(move |tx| Ok(tx.query_row(sql, [], |r| r.get(0))?))
        .await
        .unwrap()
}

/// Rows of `chunks` and `chunk_texts`.
async fn chunk_count(store: &Store) -> (i64, i64) {
    (
        count(store, "SELECT COUNT(*) FROM chunks").await,
        count(store, "SELECT COUNT(*) FROM chunk_texts").await,
    )
}

/// Every stored chunk is named by some list entry or edit, its count is the number of
/// entries and edits naming it, and it has its text; every entry and edit names a stored
/// chunk; every list's positions run 0.. without a gap; every revision names a stored list,
/// every list is named and counts the revisions naming it; SQLite finds no foreign key
/// violation.
async fn assert_refs_exact(store: &Store) {
    let unnamed = count(
        store,
        "SELECT COUNT(*) FROM chunks c WHERE NOT EXISTS \
             (SELECT 1 FROM chunk_list_entries l WHERE l.chunk = c.id) AND NOT EXISTS \
             (SELECT 1 FROM revision_chunk_edits e WHERE e.chunk = c.id)",
    )
    .await;
    assert_eq!(unnamed, 0, "chunks no list names");
    let miscounted = count(
        store,
        "SELECT COUNT(*) FROM chunks c WHERE c.refs <> \
             (SELECT COUNT(*) FROM chunk_list_entries l WHERE l.chunk = c.id) + \
             (SELECT COUNT(*) FROM revision_chunk_edits e WHERE e.chunk = c.id)",
    )
    .await;
    assert_eq!(
        miscounted, 0,
        "chunks whose count is not their entries and edits"
    );
    let dangling = count(
        store,
        "SELECT COUNT(*) FROM (SELECT chunk FROM chunk_list_entries UNION ALL \
             SELECT chunk FROM revision_chunk_edits WHERE chunk IS NOT NULL) l \
             WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.id = l.chunk)",
    )
    .await;
    assert_eq!(dangling, 0, "entries or edits naming no chunk");
    let gaps = count(
        store,
        "SELECT COUNT(*) FROM (SELECT list, family FROM chunk_list_entries \
             GROUP BY list, family HAVING MAX(position) + 1 <> COUNT(*))",
    )
    .await;
    assert_eq!(gaps, 0, "lists with gaps");
    let lists = count(
        store,
        "SELECT COUNT(*) FROM chunk_lists k WHERE k.refs = 0 OR k.refs <> \
             (SELECT COUNT(*) FROM revisions r WHERE r.chunk_list = k.id)",
    )
    .await;
    assert_eq!(lists, 0, "lists unnamed or miscounted");
    let listless = count(
        store,
        "SELECT COUNT(*) FROM revisions r WHERE NOT EXISTS \
             (SELECT 1 FROM chunk_lists k WHERE k.id = r.chunk_list)",
    )
    .await;
    assert_eq!(listless, 0, "revisions without a list");
    let violations = store
        .readers
        .run(|tx| {
            Ok(tx
                .prepare("PRAGMA foreign_key_check")?
                .query_map([], |_| Ok(()))?
                .count())
        })
        .await
        .unwrap();
    assert_eq!(violations, 0, "foreign key violations");
    let (c, t) = chunk_count(store).await;
    assert_eq!(c, t);
}

/// Revisions that alternate between two texts (as an orchestrator re-applying a ruleset
/// with one rule toggled does): each commit adds one chunk list and prunes another in the
/// same transaction, so most chunks gain and lose a reference at once (net zero, not
/// written) and the toggled chunk falls to zero and is deleted, or is named again. The
/// counts stay exact through it all.
#[tokio::test]
async fn alternating_revisions_keep_counts_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db"))
        .await
        .unwrap()
        .with_revisions_kept(2);
    let text = |k: usize| {
        let mut s = String::from("*filter\n:INPUT DROP [0:0]\n");
        for i in 0..2000 {
            let port = if i == 700 { 10_000 + k } else { i };
            s.push_str(&format!(
                "-A INPUT -s 10.1.{}.0/24 -p udp -m udp --dport {port} -j ACCEPT\n",
                i % 256
            ));
        }
        s + "COMMIT\n"
    };
    // a, b, a, b, then c (the toggled chunk of a and b falls out), then a again.
    for (n, k) in [0, 1, 0, 1, 2, 3, 0].into_iter().enumerate() {
        store
            .persist_commit(commit("a", CommitTarget::New(new_rev("a", &text(k)))))
            .await
            .unwrap();
        assert_refs_exact(&store).await;
        let kept = store.list_revisions("a", 0, 100).await.unwrap();
        assert_eq!(kept.len(), (n + 1).min(2));
        assert_eq!(kept.last().unwrap().content.v4(), text(k));
    }
    // Exactly the chunks of the two kept texts are stored.
    let kept = store.list_revisions("a", 0, 100).await.unwrap();
    let all: std::collections::HashSet<&str> = kept
        .iter()
        .flat_map(|r| chunks::split(r.content.v4()))
        .collect();
    assert_eq!(chunk_count(&store).await.0, all.len() as i64);
    assert!(store.delete_ruleset("a", None).await.unwrap());
    assert_eq!(chunk_count(&store).await, (0, 0));
}

/// Revisions that differ in a few rules share their other chunks; pruning and deleting
/// release exactly the chunks no kept revision names, and every kept text reads back
/// byte for byte.
#[tokio::test]
async fn revisions_share_chunks_and_release_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db"))
        .await
        .unwrap()
        .with_revisions_kept(3);
    let text = |k: usize| {
        let mut s = String::from("*filter\n:INPUT DROP [0:0]\n");
        for i in 0..3000 {
            let port = if i == 1500 { 10_000 + k } else { i };
            s.push_str(&format!(
                "-A INPUT -s 10.0.{}.0/24 -p tcp -m tcp --dport {port} -j ACCEPT\n",
                i % 256
            ));
        }
        s + "COMMIT\n"
    };
    let mut texts = Vec::new();
    for k in 0..6 {
        let mut rev = new_rev("a", &text(k));
        // The IPv6 text is the same in every revision: all its chunks are shared.
        rev.content.set(
            Family::Ipv6,
            Text::new(text(0).replace("10.0.", "2001:db8::")),
        );
        texts.push(rev.content.clone());
        store
            .persist_commit(commit("a", CommitTarget::New(rev)))
            .await
            .unwrap();
    }
    let kept = store.list_revisions("a", 0, 100).await.unwrap();
    assert_eq!(kept.iter().map(|r| r.number).collect::<Vec<_>>(), [4, 5, 6]);
    for r in &kept {
        assert_eq!(*r.content, texts[r.number as usize - 1]);
        assert_eq!(r.digest, r.content.digest());
    }
    // One copy of each text plus the changed chunk of each kept revision.
    let one = chunks::split(texts[0].v4()).len() as i64 + chunks::split(texts[0].v6()).len() as i64;
    let (c, t) = chunk_count(&store).await;
    assert_eq!(c, t);
    assert!(
        c >= one && c <= one + 2 * 3,
        "{c} chunks for {one} per revision"
    );
    // Storage in proportion to the change: the kept revisions share the first revision's
    // key frame (one full list, kept though revision 1 was pruned) and each adds an edit row
    // or two (its changed chunk; two when the change moved a boundary).
    assert_eq!(
        count(&store, "SELECT COUNT(DISTINCT chunk_list) FROM revisions").await,
        1
    );
    assert_eq!(
        count(&store, "SELECT COUNT(*) FROM chunk_list_entries").await,
        one
    );
    let edits = count(&store, "SELECT COUNT(*) FROM revision_chunk_edits").await;
    assert!((3..=3 * 3).contains(&edits), "{edits} edit rows");
    assert_refs_exact(&store).await;
    assert!(store.delete_ruleset("a", None).await.unwrap());
    assert_eq!(chunk_count(&store).await, (0, 0));
}

/// A revision read while the writer deletes and re-creates its ruleset is either there
/// with its own text or absent, never half (its chunk lists read, its chunks freed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_see_a_revision_whole_while_it_is_deleted() {
    fn text(tag: u64) -> String {
        let mut s = String::from("*filter\n");
        for i in 0..300 {
            s.push_str(&format!(
                "-A INPUT -s 10.{}.{}.0/24 -m comment --comment r{tag} -j ACCEPT\n",
                i / 256 % 256,
                i % 256
            ));
        }
        s + "COMMIT\n"
    }
    fn rev(tag: u64) -> NewRevision {
        NewRevision {
            author: tag.to_string(),
            ..new_rev("a", &text(tag))
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db")).await.unwrap();
    store.stage(rev(0), None).await.unwrap();
    let w = store.clone();
    let writer = tokio::spawn(async move {
        for tag in 1..150u64 {
            w.delete_ruleset("a", None).await.unwrap();
            w.stage(rev(tag), None).await.unwrap();
        }
    });
    let mut whole = 0;
    while !writer.is_finished() {
        if let Some(r) = store.get_revision("a", 1).await.unwrap() {
            let tag: u64 = r.author.parse().unwrap();
            assert_eq!(r.content.v4(), text(tag));
            whole += 1;
        }
        for r in store.list_revisions("a", 0, 10).await.unwrap() {
            assert_eq!(r.content.v4(), text(r.author.parse().unwrap()));
        }
    }
    writer.await.unwrap();
    assert!(whole > 0);
}

/// A commit's questions about the ruleset's pending confirms (clear their deadlines; which
/// revisions the prune must keep) cost the same after a long history as after a short one:
/// SQLite's virtual machine steps for them, with 20 commits behind and with 1,020, differ by
/// no more than noise (before `20261221090000_pending_by_ruleset`, they read every commit row
/// of the ruleset: ~50x more steps at 1,020).
#[tokio::test]
async fn a_commit_does_not_read_the_ruleset_s_commit_history() {
    use rusqlite::StatementStatus::VmStep;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db"))
        .await
        .unwrap()
        .with_revisions_kept(5);
    let text = |k: usize| {
        format!("*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport {k} -j ACCEPT\nCOMMIT\n")
    };
    let commits = async |from: usize, n: usize| {
        for k in from..from + n {
            store
                .persist_commit(commit("a", CommitTarget::New(new_rev("a", &text(k)))))
                .await
                .unwrap();
        }
    };
    // The steps of each statement in one more commit.
    let steps = async |k: usize| -> Vec<i32> {
        let sqls = [writer::CLEAR_DEADLINES, writer::HELD_REVISIONS];
        let reset = move |tx: &writer::Tx<'_>| -> Result<Vec<i32>> {
            sqls.iter()
                .map(|sql| Ok(tx.prepare_cached(sql)?.reset_status(VmStep)))
                .collect()
        };
        store.writer.run(reset).await.unwrap();
        commits(k, 1).await;
        store.writer.run(reset).await.unwrap()
    };
    commits(0, 20).await;
    let early = steps(20).await;
    commits(21, 1_000).await;
    let late = steps(1_021).await;
    assert_eq!(store.commits("a").await.unwrap().len(), 1_022);
    for (e, l) in early.iter().zip(&late) {
        assert!(*e > 0, "the statements ran: {early:?}");
        assert!(
            *l <= e + e / 4 + 8,
            "steps with 20 commits behind: {early:?}, with 1,020: {late:?}"
        );
    }
}

/// The phase columns of commits that finish together are all written once every call has
/// returned, in fewer transactions than calls when they queue behind one (a row queued behind
/// a transaction on its way is written by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phases_of_commits_that_finish_together_share_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db")).await.unwrap();
    let mut ids = Vec::new();
    for k in 0..40 {
        let name = format!("r{k}");
        let p = store
            .persist_commit(commit(
                &name,
                CommitTarget::New(new_rev(&name, "*filter\nCOMMIT\n")),
            ))
            .await
            .unwrap();
        ids.push((name, p.commit_id));
    }
    let phases = |i: u64| Phases {
        total_ns: 1_000 + i,
        persist_ns: i,
        ..Phases::default()
    };
    let before = store.writer.written();
    let calls = (0u64..).zip(&ids).map(|(i, (_, id))| {
        let store = store.clone();
        let id = *id;
        async move { store.finish_commit(id, &phases(i)).await }
    });
    for r in futures_util::future::join_all(calls).await {
        r.unwrap();
    }
    let transactions = store.writer.written() - before;
    for (i, (name, id)) in (0u64..).zip(&ids) {
        let rows = store.commits(name).await.unwrap();
        let row = rows.iter().find(|c| c.id == *id).unwrap();
        assert_eq!(row.phases, phases(i), "commit {id}");
    }
    // Joined in one task: every call after the first queues behind a transaction on its way
    // unless that one already took the rows; far fewer transactions than calls.
    assert!(
        (1..ids.len() as u64).contains(&transactions),
        "{transactions} transactions for {} calls",
        ids.len()
    );
}

#[tokio::test]
async fn prunes_old_revisions_but_never_active_pending_or_restore_target() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db"))
        .await
        .unwrap()
        .with_revisions_kept(2);
    let text = "*filter\nCOMMIT\n";
    let numbers = |store: Store| async move {
        let mut out = Vec::new();
        for n in 1..=6 {
            if store.get_revision("a", n).await.unwrap().is_some() {
                out.push(n);
            }
        }
        out
    };
    store
        .persist_commit(commit("a", CommitTarget::New(new_rev("a", text))))
        .await
        .unwrap();
    // Revision 2 waits for confirmation; 1 is what a timeout would restore.
    store
        .persist_commit(PersistCommit {
            state: RevisionState::PendingConfirm,
            confirm_deadline: Some(i64::MAX),
            ..commit("a", CommitTarget::New(new_rev("a", text)))
        })
        .await
        .unwrap();
    store.stage(new_rev("a", text), None).await.unwrap();
    assert_eq!(numbers(store.clone()).await, vec![1, 2, 3]);
    store.stage(new_rev("a", text), None).await.unwrap();
    assert_eq!(numbers(store.clone()).await, vec![1, 2, 4]);
    // A plain commit settles the pending one: only it and the replaced active one stay.
    store
        .persist_commit(commit("a", CommitTarget::New(new_rev("a", text))))
        .await
        .unwrap();
    assert_eq!(numbers(store.clone()).await, vec![2, 5]);
}

#[tokio::test]
async fn stage_commit_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/v.db");
    let store = Store::open(&path).await.unwrap();
    let (rs, r1) = store
        .stage(new_rev("a", "*filter\nCOMMIT\n"), None)
        .await
        .unwrap();
    assert_eq!(r1.number, 1);
    assert_eq!(r1.state, RevisionState::Staged);
    assert!(matches!(
        store.stage(new_rev("a", "x"), Some("nope")).await,
        Err(Error::EtagMismatch { .. })
    ));
    let p = store
        .persist_commit(commit("a", CommitTarget::Staged(1)))
        .await
        .unwrap();
    assert_eq!(p.ruleset.active_revision, Some(1));
    assert_ne!(p.ruleset.etag, rs.etag);
    // Committing it again is refused.
    assert!(matches!(
        store
            .persist_commit(commit("a", CommitTarget::Staged(1)))
            .await,
        Err(Error::Precondition { .. })
    ));
    // The audit record goes in with the commit.
    let p2 = store
        .persist_commit(PersistCommit {
            audit: Some(AuditEntry {
                caller: "me".into(),
                method: "Apply".into(),
                request_digest: "d".into(),
                outcome: "OK".into(),
            }),
            ..commit("a", CommitTarget::New(new_rev("a", "y")))
        })
        .await
        .unwrap();
    assert_eq!(store.audit_count().await.unwrap(), 1);
    assert_eq!(p2.revision.number, 2);
    assert_eq!(p2.previous, Some((1, RevisionState::Active)));
    store
        .finish_commit(p2.commit_id, &Phases::default())
        .await
        .unwrap();
    store.close().await;

    let store = Store::open(&path).await.unwrap();
    let active = store.active().await.unwrap();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].1.number, 2);
    assert_eq!(
        store.get_revision("a", 1).await.unwrap().unwrap().state,
        RevisionState::Superseded
    );
    assert_eq!(store.commits("a").await.unwrap().len(), 2);
    store
        .revert_commit(&p2, "boom", "COMMIT_FAILED")
        .await
        .unwrap();
    let id = p2.audit_id.expect("audit id");
    let outcome: String = store
        .readers
        .run(move |tx| {
            Ok(
                tx.query_row("SELECT outcome FROM audit WHERE id = ?1", [id], |r| {
                    r.get(0)
                })?,
            )
        })
        .await
        .unwrap();
    assert_eq!(outcome, "COMMIT_FAILED");
    assert_eq!(
        store
            .get_ruleset("a")
            .await
            .unwrap()
            .unwrap()
            .active_revision,
        Some(1)
    );
    assert!(store.delete_ruleset("a", None).await.unwrap());
    assert!(store.list_rulesets().await.unwrap().is_empty());
}

#[tokio::test]
async fn confirm_and_idempotency() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db")).await.unwrap();
    let mut c = commit("a", CommitTarget::New(new_rev("a", "x")));
    c.state = RevisionState::PendingConfirm;
    c.confirm_deadline = Some(now_ns() + 1_000_000_000);
    store.persist_commit(c).await.unwrap();
    assert_eq!(store.pending_confirms().await.unwrap().len(), 1);
    assert!(store.confirm("a", 1).await.unwrap().is_some());
    assert!(store.confirm("a", 1).await.unwrap().is_none());
    assert!(store.pending_confirms().await.unwrap().is_empty());
    let call = |r: &[u8]| IdempotentCall {
        request_digest: "d".into(),
        response: r.to_vec(),
    };
    let now = now_ns();
    store
        .idempotent_put("Apply", "r1", call(b"one"), now)
        .await
        .unwrap();
    store
        .idempotent_put("Apply", "r1", call(b"two"), now)
        .await
        .unwrap();
    let first = store.idempotent_get("r1", now).await.unwrap().unwrap();
    assert_eq!(first.1.response, b"one", "the first one wins");
    // One namespace: the key is found whatever method asks, with its method.
    assert_eq!(first.0, "Apply");
}

/// `n` distinct rule lines that each end a chunk (so a text of `k` of them is `k` chunks).
fn boundary_lines(n: usize, tag: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < n {
        let l = format!("-A INPUT -m comment --comment {tag}{i} -j ACCEPT\n");
        if chunks::split(&format!("{l}x\n")).len() == 2 {
            out.push(l);
        }
        i += 1;
    }
    out
}

/// Chunk lists across the lookup batch size (0, 1, 63, 64, 65, 128, 129, 130 distinct
/// chunks), with chunks repeated inside a text, shared by the IPv4 and IPv6 lists and by
/// two rulesets, staged and committed, pruned and deleted: the counts stay exact and
/// every kept text reads back.
#[tokio::test]
async fn chunk_batches_and_sharing_keep_counts_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db"))
        .await
        .unwrap()
        .with_revisions_kept(2);
    let lines = boundary_lines(140, "c");
    let text = |k: usize, rep: usize| -> String {
        lines[..k]
            .iter()
            .flat_map(|l| std::iter::repeat_n(l, rep))
            .cloned()
            .collect()
    };
    let mut step = 0;
    for k in [0, 1, 63, 64, 65, 128, 129, 130] {
        for (name, rep) in [("a", 1), ("b", 2)] {
            step += 1;
            let mut rev = new_rev(name, &text(k, rep));
            // The IPv6 text: the same chunks, a few more, or none.
            let v6 = match step % 3 {
                0 => text(k, 1),
                1 => text((k + 70).min(140), 1),
                _ => String::new(),
            };
            rev.content.set(Family::Ipv6, Text::new(v6));
            let content = rev.content.clone();
            let p = if step % 4 == 0 {
                store.stage(rev, None).await.unwrap().1
            } else {
                store
                    .persist_commit(commit(name, CommitTarget::New(rev)))
                    .await
                    .unwrap()
                    .revision
            };
            assert_refs_exact(&store).await;
            let back = store.get_revision(name, p.number).await.unwrap().unwrap();
            assert_eq!(*back.content, content, "{name} k={k}");
            for r in store.list_revisions(name, 0, 100).await.unwrap() {
                assert_eq!(r.digest, r.content.digest());
            }
        }
    }
    assert!(store.delete_ruleset("a", None).await.unwrap());
    assert_refs_exact(&store).await;
    for r in store.list_revisions("b", 0, 100).await.unwrap() {
        assert_eq!(r.digest, r.content.digest());
    }
    assert!(store.delete_ruleset("b", None).await.unwrap());
    assert_eq!(chunk_count(&store).await, (0, 0));
}

/// A write transaction that fails after storing chunks leaves no chunk and no pending
/// count behind; one that releases a revision's chunks and stores the same text again
/// keeps them with exact counts.
#[tokio::test]
async fn a_failed_transaction_leaves_no_chunks_or_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db")).await.unwrap();
    let lines = boundary_lines(100, "f");
    let text: String = lines.concat();
    store
        .stage(new_rev("a", &text[..text.len() / 2]), None)
        .await
        .unwrap();
    let before = chunk_count(&store).await;
    let t = text.clone();
    let r = store
        .writer
        .run(move |tx| {
            let rs = writer::existing_ruleset(tx, "a")?;
            writer::insert_revision(tx, &rs, new_rev("a", &t), RevisionState::Staged, 1)?;
            Err::<(), _>(Error::invariant("boom"))
        })
        .await;
    assert!(r.is_err());
    assert_eq!(chunk_count(&store).await, before);
    assert_refs_exact(&store).await;
    // The next transaction starts from no pending change.
    store.stage(new_rev("a", &text), None).await.unwrap();
    assert_refs_exact(&store).await;
    // Released and put again in one transaction.
    let t = text.clone();
    store
        .writer
        .run(move |tx| {
            writer::delete_revisions(tx, "a", Some(2))?;
            let rs = writer::existing_ruleset(tx, "a")?;
            writer::insert_revision(tx, &rs, new_rev("a", &t), RevisionState::Staged, 1)?;
            Ok(())
        })
        .await
        .unwrap();
    assert_refs_exact(&store).await;
    assert_eq!(
        store
            .get_revision("a", 3)
            .await
            .unwrap()
            .unwrap()
            .content
            .v4(),
        text
    );
}

/// A chunk stored by a transaction and released again in it (a revision added and
/// deleted at once) is deleted with it, not left behind with no reference.
#[tokio::test]
async fn a_chunk_stored_and_released_in_one_transaction_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db")).await.unwrap();
    store
        .stage(new_rev("a", "*filter\nCOMMIT\n"), None)
        .await
        .unwrap();
    store
        .writer
        .run(|tx| {
            let rs = writer::existing_ruleset(tx, "a")?;
            let text = "*filter\n-A INPUT -j DROP\nCOMMIT\n";
            writer::insert_revision(tx, &rs, new_rev("a", text), RevisionState::Staged, 1)?;
            writer::delete_revisions(tx, "a", Some(2))?;
            Ok(())
        })
        .await
        .unwrap();
    assert_refs_exact(&store).await;
}

/// A store written with the chunk index (before the counts) opens with exact counts and
/// every text intact, and keeps them exact through the next commits.
#[tokio::test]
async fn chunk_lists_get_their_counts_in_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.db");
    {
        let conn = old_db(&path, 20261216090000);
        conn.execute_batch(
                "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
                 VALUES ('a', 0, 'e', 2, 2, 1, 1);
                 INSERT INTO revisions (ruleset, number, parent, digest, rule_count, author, message, state, created_at) \
                 VALUES ('a', 1, NULL, 'd1', 1, 't', 'm', 'SUPERSEDED', 1), \
                        ('a', 2, 1, 'd2', 1, 't', 'm', 'ACTIVE', 1);
                 INSERT INTO chunks (id, digest) VALUES (1, x'01'), (2, x'02'), (3, x'03');
                 INSERT INTO chunk_texts (id, text) VALUES (1, 'one\n'), (2, 'two\n'), (3, 'three\n');
                 INSERT INTO revision_chunk_list (ruleset, number, family, position, chunk) \
                 VALUES ('a', 1, 4, 0, 1), ('a', 1, 4, 1, 2), ('a', 1, 4, 2, 1), \
                        ('a', 2, 4, 0, 1), ('a', 2, 4, 1, 3), ('a', 2, 6, 0, 3);",
            )
            .unwrap();
    }
    let store = Store::open(&path).await.unwrap().with_revisions_kept(2);
    assert_refs_exact(&store).await;
    let refs: String = store
        .readers
        .run(|tx| {
            Ok(tx.query_row(
                "SELECT group_concat(refs, ',') FROM (SELECT refs FROM chunks ORDER BY id)",
                [],
                |r| r.get(0),
            )?)
        })
        .await
        .unwrap();
    assert_eq!(refs, "3,1,2");
    let r1 = store.get_revision("a", 1).await.unwrap().unwrap();
    assert_eq!(r1.content.v4(), "one\ntwo\none\n");
    let r2 = store.get_revision("a", 2).await.unwrap().unwrap();
    assert_eq!(
        (r2.content.v4(), r2.content.v6()),
        ("one\nthree\n", "three\n")
    );
    // The next commit (a new chunk: the old digests are not sha256) prunes revision 1:
    // chunk 2 goes, 1 and 3 stay.
    store
        .persist_commit(commit("a", CommitTarget::New(new_rev("a", "one\n"))))
        .await
        .unwrap();
    assert_refs_exact(&store).await;
    assert_eq!(chunk_count(&store).await.0, 3);
    assert_eq!(
        count(&store, "SELECT COUNT(*) FROM chunks WHERE id = 2").await,
        0
    );
}

/// SQLite itself refuses a list row naming no stored chunk, deleting a chunk a list
/// names, and changing a list row (which would bypass the counts).
#[tokio::test]
async fn sqlite_enforces_the_chunk_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db")).await.unwrap();
    let p = store
        .persist_commit(commit(
            "a",
            CommitTarget::New(new_rev("a", "*filter\n-A INPUT -j DROP\nCOMMIT\n")),
        ))
        .await
        .unwrap();
    let n = i64_of(p.revision.number);
    for sql in [
        "INSERT INTO revision_chunk_edits (ruleset, number, family, seq, at, removed, chunk) \
             VALUES ('a', ?1, 6, 0, 0, 0, 999999)",
        "INSERT INTO chunk_list_entries (list, family, position, chunk) \
             VALUES ((SELECT chunk_list FROM revisions WHERE number = ?1), 6, 0, 999999)",
        "DELETE FROM chunks WHERE id = (SELECT chunk FROM chunk_list_entries \
             WHERE list = (SELECT chunk_list FROM revisions WHERE number = ?1))",
        "UPDATE chunk_list_entries SET chunk = chunk \
             WHERE list = (SELECT chunk_list FROM revisions WHERE number = ?1)",
        "UPDATE chunks SET refs = -1 WHERE id = (SELECT chunk FROM chunk_list_entries \
             WHERE list = (SELECT chunk_list FROM revisions WHERE number = ?1))",
        "DELETE FROM chunk_lists WHERE id = (SELECT chunk_list FROM revisions WHERE number = ?1)",
    ] {
        let r = store.writer.run(move |tx| Ok(tx.execute(sql, [n])?)).await;
        assert!(r.is_err(), "{sql} was allowed");
    }
    assert_refs_exact(&store).await;
}

/// Idempotency keys expire after the TTL (at injected times): a lookup after it finds
/// nothing, a new call replaces the row, and the digest comes back as stored.
#[tokio::test]
async fn idempotency_keys_expire_after_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let hour = std::time::Duration::from_secs(3600);
    let store = Store::open(&dir.path().join("v.db"))
        .await
        .unwrap()
        .with_retention(Retention {
            idempotency_ttl: Some(hour),
            ..Retention::default()
        });
    let h = i64::try_from(hour.as_nanos()).unwrap();
    let t0 = 1_000 * h;
    let call = |d: &str, r: &[u8]| IdempotentCall {
        request_digest: d.into(),
        response: r.to_vec(),
    };
    store
        .idempotent_put("Apply", "k", call("d1", b"one"), t0)
        .await
        .unwrap();
    let got = store.idempotent_get("k", t0 + h).await.unwrap();
    assert_eq!(
        got,
        Some(("Apply".into(), call("d1", b"one"))),
        "still live at exactly the TTL"
    );
    assert_eq!(store.idempotent_get("k", t0 + h + 1).await.unwrap(), None);
    // An expired key of another method is replaced by the new one.
    store
        .idempotent_put("Rollback", "k", call("d2", b"two"), t0 + 2 * h)
        .await
        .unwrap();
    let got = store.idempotent_get("k", t0 + 2 * h).await.unwrap();
    assert_eq!(got, Some(("Rollback".into(), call("d2", b"two"))));
    assert_eq!(store.idempotency_count().await.unwrap(), 1);
}

/// Pruning deletes audit records older than the retention, then the oldest beyond the
/// row bound, and expired idempotency keys; counts before and after (injected times).
#[tokio::test]
async fn prune_deletes_by_age_and_by_rows() {
    let dir = tempfile::tempdir().unwrap();
    let min = 60_000_000_000_i64;
    let clock = crate::clock::ManualClock::starting_now();
    let store = Store::open_on(&dir.path().join("v.db"), clock.clock())
        .await
        .unwrap()
        .with_retention(Retention {
            idempotency_ttl: Some(std::time::Duration::from_secs(60)),
            audit_max_age: Some(std::time::Duration::from_secs(600)),
            audit_max_rows: Some(3),
        });
    // Ten records, one a minute, the oldest 10 minutes before `now` (the store stamps each
    // with its clock).
    for i in 0..10 {
        store
            .audit(AuditEntry {
                caller: "me".into(),
                method: format!("M{i}"),
                request_digest: "d".into(),
                outcome: "OK".into(),
            })
            .await
            .unwrap();
        clock.advance(std::time::Duration::from_secs(60));
    }
    let now = clock.unix_ns();
    for (k, at) in [("old", now - 2 * min), ("new", now - min / 2)] {
        let call = IdempotentCall {
            request_digest: "d".into(),
            response: Vec::new(),
        };
        store.idempotent_put("Apply", k, call, at).await.unwrap();
    }
    assert_eq!(store.audit_count().await.unwrap(), 10);
    let p = store.prune(now).await.unwrap();
    // By age none (the oldest is exactly 10 minutes old: kept); by rows 7 of the 10.
    assert_eq!(
        p,
        Pruned {
            audit: 7,
            idempotency: 1
        }
    );
    assert_eq!(store.audit_count().await.unwrap(), 3);
    let methods: Vec<String> = store
        .readers
        .run(|tx| {
            Ok(tx
                .prepare("SELECT method FROM audit ORDER BY id")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?)
        })
        .await
        .unwrap();
    assert_eq!(methods, ["M7", "M8", "M9"], "the newest stay");
    assert_eq!(store.idempotency_count().await.unwrap(), 1);
    // Later, by age alone: the records are now older than 10 minutes.
    let p = store.prune(now + 9 * min).await.unwrap();
    assert_eq!(
        p,
        Pruned {
            audit: 2,
            idempotency: 1
        }
    );
    assert_eq!(store.audit_count().await.unwrap(), 1);
    // Nothing left to prune.
    assert_eq!(store.prune(now + 9 * min).await.unwrap(), Pruned::default());
    // No bounds: nothing is ever pruned.
    let keep = Store::open(&dir.path().join("v.db"))
        .await
        .unwrap()
        .with_retention(Retention {
            idempotency_ttl: None,
            audit_max_age: None,
            audit_max_rows: None,
        });
    assert_eq!(keep.prune(i64::MAX).await.unwrap(), Pruned::default());
}

/// `--sync normal`: a write answers without an fsync (it is in the WAL: another connection
/// reads it at once); one fsync then puts every write so far on disk, and `close` does it.
#[tokio::test]
async fn normal_writes_wait_for_no_fsync_and_share_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.db");
    let store = Store::open(&path)
        .await
        .unwrap()
        .with_durability(Durability::Normal);
    assert_eq!(store.fsyncs(), 0);
    for i in 0..20 {
        let name = format!("r{i}");
        store
            .persist_commit(commit(&name, CommitTarget::New(new_rev(&name, "one"))))
            .await
            .unwrap();
    }
    assert_eq!(store.fsyncs(), 0, "a normal write waited for an fsync");
    // Committed: a new connection (another process would see the same) reads every one.
    let other = Connection::open(&path).unwrap();
    let n: i64 = other
        .query_row("SELECT count(*) FROM revisions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 20);
    // One mark per committed transaction.
    let mark = store.written();
    assert_eq!(mark, 20);
    store.sync(mark).await.unwrap();
    assert_eq!(store.fsyncs(), 1, "20 writes, one fsync");
    // Nothing new: no fsync.
    store.sync(mark).await.unwrap();
    assert_eq!(store.fsyncs(), 1);
    store
        .persist_commit(commit("r0", CommitTarget::New(new_rev("r0", "two"))))
        .await
        .unwrap();
    store.close().await;
    assert_eq!(store.fsyncs(), 2, "close fsyncs what is not on disk yet");
}

/// `--sync full` (the default): a write is on disk when it answers; concurrent writers each
/// get their own transaction, so one that fails (a stale etag) changes nothing of the others'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_writes_are_fsynced_and_a_failing_caller_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db")).await.unwrap();
    assert_eq!(store.durability(), Durability::Full);
    let (_, first) = store.stage(new_rev("s", "one"), None).await.unwrap();
    assert!(store.fsyncs() >= 1, "a full write answered before an fsync");
    assert_eq!(first.number, 1);
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let name = format!("c{i}");
                let mut c = commit(&name, CommitTarget::New(new_rev(&name, "x")));
                if i % 8 == 0 {
                    // Never the etag of a new ruleset: refused.
                    c.expected_etag = Some("stale".into());
                }
                let r = store.persist_commit(c).await;
                // persist_commit leaves the wait to the pipeline: wait as it does.
                store.sync(store.written()).await.unwrap();
                (i, r)
            })
        })
        .collect();
    for t in tasks {
        let (i, r) = t.await.unwrap();
        let name = format!("c{i}");
        let stored = store.get_ruleset(&name).await.unwrap();
        if i % 8 == 0 {
            assert!(matches!(r, Err(Error::EtagMismatch { .. })), "{i}: {r:?}");
            assert_eq!(stored, None, "{i}: a refused caller left its ruleset");
        } else {
            assert_eq!(r.unwrap().revision.number, 1);
            assert_eq!(stored.unwrap().active_revision, Some(1));
        }
    }
    // Every write so far is on disk: nothing left to fsync.
    let fsyncs = store.fsyncs();
    store.sync(store.written()).await.unwrap();
    assert_eq!(store.fsyncs(), fsyncs);
}

/// An fsync of the WAL that fails is not retried: that wait and every later one fail, naming
/// the fsync (here the WAL file is gone, so opening it for the fsync fails).
#[tokio::test]
async fn a_failed_fsync_fails_every_later_wait() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.db");
    let store = Store::open(&path)
        .await
        .unwrap()
        .with_durability(Durability::Normal);
    store.stage(new_rev("s", "one"), None).await.unwrap();
    std::fs::remove_file(dir.path().join("v.db-wal")).unwrap();
    let e = store.sync(store.written()).await.unwrap_err();
    assert!(e.to_string().contains("fsync of"), "{e}");
    // Sticky: a wait for a mark already asked for, and one after a new write, both fail.
    let e = store.sync(1).await.unwrap_err();
    assert!(e.to_string().contains("fsync of"), "{e}");
    let full = store.clone().with_durability(Durability::Full);
    let e = full.stage(new_rev("t", "two"), None).await.unwrap_err();
    assert!(e.to_string().contains("restart vallumd"), "{e}");
}

/// A database written by the build before key frames (every migration up to
/// `20261219093000`, revisions stored the old way: one list row per chunk, digest the sha256
/// of the whole combined text) migrates: every old revision reads back byte for byte with
/// its digest now the tree's root, the counts are exact, and the next commits store edits
/// against a key frame and prune the old revisions.
#[tokio::test]
async fn old_chunk_lists_migrate_to_key_frames() {
    use sha2::{Digest, Sha256};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.db");
    let text = |k: usize, fam: &str| {
        let mut s = String::from("*filter\n:INPUT DROP [0:0]\n");
        for i in 0..2500 {
            let port = if i == 100 * k { 30_000 + k } else { i };
            s.push_str(&format!(
                "-A INPUT -s {fam}{}.0/24 -p tcp -m tcp --dport {port} -j ACCEPT\n",
                i % 250
            ));
        }
        s + "COMMIT\n"
    };
    let contents: Vec<Content> = (0..6)
        .map(|k| {
            let v6 = if k % 2 == 0 {
                text(k, "2001:db8:")
            } else {
                String::new()
            };
            Content::new(text(k, "10.9."), v6)
        })
        .collect();
    {
        let mut conn = old_db(&path, 20261219093000);
        let tx = conn.transaction().unwrap();
        tx.execute(
            "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
             VALUES ('a', 0, 'e', 6, 6, 1, 1)",
            [],
        )
        .unwrap();
        for (i, c) in contents.iter().enumerate() {
            let n = i as i64 + 1;
            // The old digest: sha256 of the combined text.
            let old: String = Sha256::digest(c.combined().as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let state = if n == 6 { "ACTIVE" } else { "SUPERSEDED" };
            tx.execute(
                "INSERT INTO revisions (ruleset, number, parent, digest, rule_count, author, message, state, created_at) \
                 VALUES ('a', ?1, NULL, ?2, 2500, 't', 'm', ?3, 1)",
                params![n, old, state],
            )
            .unwrap();
            // The old `put`: each chunk once by sha256, one list row per chunk.
            for (family, t) in [(4, &c.v4()), (6, &c.v6())] {
                for (pos, chunk) in chunks::split(t).into_iter().enumerate() {
                    let d = Sha256::digest(chunk.as_bytes()).to_vec();
                    let id: Option<i64> = tx
                        .query_row("SELECT id FROM chunks WHERE digest = ?1", [&d], |r| {
                            r.get(0)
                        })
                        .optional()
                        .unwrap();
                    let id = match id {
                        Some(id) => id,
                        None => {
                            tx.execute("INSERT INTO chunks (digest) VALUES (?1)", [&d])
                                .unwrap();
                            let id = tx.last_insert_rowid();
                            tx.execute(
                                "INSERT INTO chunk_texts (id, text) VALUES (?1, ?2)",
                                params![id, chunk],
                            )
                            .unwrap();
                            id
                        }
                    };
                    tx.execute(
                        "INSERT INTO revision_chunk_list (ruleset, number, family, position, chunk) \
                         VALUES ('a', ?1, ?2, ?3, ?4)",
                        params![n, family, pos as i64, id],
                    )
                    .unwrap();
                }
            }
        }
        tx.commit().unwrap();
    }
    let store = Store::open(&path).await.unwrap().with_revisions_kept(6);
    assert_refs_exact(&store).await;
    let back = store.list_revisions("a", 0, 100).await.unwrap();
    assert_eq!(back.len(), 6);
    for r in &back {
        let c = &contents[r.number as usize - 1];
        assert_eq!(
            (r.content.v4().as_bytes(), r.content.v6().as_bytes()),
            (c.v4().as_bytes(), c.v6().as_bytes()),
            "revision {}",
            r.number
        );
        assert_eq!(
            r.digest,
            Content::new(c.v4().into(), c.v6().into()).digest()
        );
    }
    // The next commits: a key frame, then edits against it; the migrated revisions are
    // pruned one by one with their own lists.
    for k in 6..12 {
        store
            .persist_commit(commit(
                "a",
                CommitTarget::New(NewRevision {
                    content: Content::new(text(k, "10.9."), String::new()),
                    ..new_rev("a", "")
                }),
            ))
            .await
            .unwrap();
        assert_refs_exact(&store).await;
    }
    let back = store.list_revisions("a", 0, 100).await.unwrap();
    assert_eq!(
        back.iter().map(|r| r.number).collect::<Vec<_>>(),
        (7..=12).collect::<Vec<u64>>()
    );
    for r in &back {
        assert_eq!(r.content.v4(), text(r.number as usize - 1, "10.9."));
        assert_eq!(r.digest, r.content.digest());
    }
    assert_eq!(
        count(&store, "SELECT COUNT(DISTINCT chunk_list) FROM revisions").await,
        1
    );
}

/// Storage in proportion to the change: one-rule commits to a 10k-rule ruleset (200 chunks),
/// with the oldest of 5 kept revisions pruned by each, change a few dozen rows each (the
/// revision, commit and ruleset rows, the new chunk, an edit row or two, the prune's, and
/// the count triggers' updates), not one list row per chunk as a full list did (~4 rows per
/// chunk with its trigger and its prune: ~800). Every kept revision reads back.
#[tokio::test]
async fn a_one_rule_commit_writes_rows_in_proportion_to_the_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("v.db"))
        .await
        .unwrap()
        .with_revisions_kept(5);
    let text = |k: usize| {
        let mut s = String::from("*filter\n:INPUT DROP [0:0]\n");
        for i in 0..10_000 {
            // Revision k changes rule 37 * k (spread over the text).
            let port = if i == 37 * k { 40_000 + k } else { i % 60_000 };
            s.push_str(&format!(
                "-A INPUT -s 10.{}.{}.0/24 -p tcp -m tcp --dport {port} -j ACCEPT\n",
                i / 256 % 256,
                i % 256
            ));
        }
        s + "COMMIT\n"
    };
    let changes = async || -> u64 { store.writer.run(|tx| Ok(tx.total_changes())).await.unwrap() };
    let chunks_per_text = chunks::split(&text(0)).len() as u64;
    assert!(chunks_per_text > 100, "{chunks_per_text} chunks");
    let mut per_commit = Vec::new();
    for k in 0..30 {
        let before = changes().await;
        store
            .persist_commit(commit("a", CommitTarget::New(new_rev("a", &text(k)))))
            .await
            .unwrap();
        per_commit.push(changes().await - before);
    }
    // The first wrote the key frame: at least a row per chunk.
    assert!(per_commit[0] >= chunks_per_text, "{per_commit:?}");
    let edits = &per_commit[1..];
    assert!(
        edits.iter().all(|n| *n <= 40),
        "rows changed per one-rule commit: {edits:?} ({chunks_per_text} chunks)"
    );
    eprintln!("rows changed per one-rule commit: {edits:?} ({chunks_per_text} chunks)");
    assert_refs_exact(&store).await;
    for r in store.list_revisions("a", 0, 100).await.unwrap() {
        assert_eq!(r.content.v4(), text(r.number as usize - 1));
        assert_eq!(r.digest, r.content.digest());
    }
}
