-- One vocabulary of commit outcomes (server/src/outcome.rs): a deliberate Rollback stays
-- ROLLED_BACK; a commit-confirmed whose deadline passed, ROLLED_BACK until now, is REVERTED;
-- REFUSED (a request refused by validation) joins the list. SQLite cannot change a CHECK in
-- place: the table is rebuilt (nothing references it) and its indexes made again.

CREATE TABLE commits_new (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    ruleset          TEXT NOT NULL,
    revision         INTEGER NOT NULL,
    -- The revision active before this commit (NULL: none); a confirm timeout restores it.
    previous         INTEGER,
    outcome          TEXT NOT NULL CHECK (outcome IN
                         ('COMMITTED', 'CONFIRMED', 'ROLLED_BACK', 'REVERTED', 'REFUSED',
                          'FAILED')),
    error            TEXT,
    validate_ns      INTEGER NOT NULL DEFAULT 0,
    compile_ns       INTEGER NOT NULL DEFAULT 0,
    persist_ns       INTEGER NOT NULL DEFAULT 0,
    publish_ns       INTEGER NOT NULL DEFAULT 0,
    quiesce_ns       INTEGER NOT NULL DEFAULT 0,
    carry_ns         INTEGER NOT NULL DEFAULT 0,
    total_ns         INTEGER NOT NULL DEFAULT 0,
    cores_waited     INTEGER NOT NULL DEFAULT 0,
    started_at       INTEGER NOT NULL,
    -- Set while a commit-confirmed waits for ConfirmCommit; cleared when confirmed,
    -- superseded or reverted.
    confirm_deadline INTEGER
);

-- The confirm timer's rows: a deactivation (revision = previous) or a commit of a revision
-- the timer wrote (author vallumd, message "automatic rollback: ...").
INSERT INTO commits_new (id, ruleset, revision, previous, outcome, error, validate_ns,
                         compile_ns, persist_ns, publish_ns, quiesce_ns, carry_ns, total_ns,
                         cores_waited, started_at, confirm_deadline)
    SELECT c.id, c.ruleset, c.revision, c.previous,
           CASE WHEN c.outcome = 'ROLLED_BACK' AND (
                    c.revision = c.previous
                    OR EXISTS (SELECT 1 FROM revisions r
                               WHERE r.ruleset = c.ruleset AND r.number = c.revision
                                 AND r.author = 'vallumd'
                                 AND r.message LIKE 'automatic rollback:%'))
                THEN 'REVERTED' ELSE c.outcome END,
           c.error, c.validate_ns, c.compile_ns, c.persist_ns, c.publish_ns, c.quiesce_ns,
           c.carry_ns, c.total_ns, c.cores_waited, c.started_at, c.confirm_deadline
    FROM commits c;

DROP TABLE commits;
ALTER TABLE commits_new RENAME TO commits;
CREATE INDEX commits_by_ruleset ON commits (ruleset, id);
CREATE INDEX commits_pending ON commits (confirm_deadline) WHERE confirm_deadline IS NOT NULL;
