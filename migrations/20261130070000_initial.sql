-- Vallum store, first schema. Times are Unix nanoseconds (INTEGER), durations nanoseconds.
-- Forward-only: later changes go into new, later-timestamped files.

CREATE TABLE rulesets (
    name            TEXT PRIMARY KEY NOT NULL,
    priority        INTEGER NOT NULL,
    etag            TEXT NOT NULL,
    -- The revision the engine runs; NULL when none. Changed only in the transaction that is
    -- durable before the engine publishes (see server/src/pipeline.rs).
    active_revision INTEGER,
    latest_revision INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);

CREATE TABLE revisions (
    ruleset     TEXT NOT NULL REFERENCES rulesets(name) ON DELETE CASCADE,
    number      INTEGER NOT NULL,
    parent      INTEGER,
    -- sha256 (hex) of the combined canonical text (IPv4, separator, IPv6).
    digest      TEXT NOT NULL,
    content_v4  TEXT NOT NULL,
    content_v6  TEXT NOT NULL,
    rule_count  INTEGER NOT NULL,
    author      TEXT NOT NULL,
    message     TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN
                    ('STAGED', 'ACTIVE', 'SUPERSEDED', 'REJECTED', 'PENDING_CONFIRM')),
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (ruleset, number)
);

CREATE TABLE commits (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    ruleset          TEXT NOT NULL,
    revision         INTEGER NOT NULL,
    -- The revision active before this commit (NULL: none); a confirm timeout restores it.
    previous         INTEGER,
    outcome          TEXT NOT NULL CHECK (outcome IN
                         ('COMMITTED', 'FAILED', 'ROLLED_BACK', 'CONFIRMED')),
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
    -- superseded or rolled back.
    confirm_deadline INTEGER
);
CREATE INDEX commits_by_ruleset ON commits (ruleset, id);
CREATE INDEX commits_pending ON commits (confirm_deadline) WHERE confirm_deadline IS NOT NULL;

CREATE TABLE audit (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    at             INTEGER NOT NULL,
    caller         TEXT NOT NULL,
    method         TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    outcome        TEXT NOT NULL
);

CREATE TABLE idempotency (
    method     TEXT NOT NULL,
    request_id TEXT NOT NULL,
    -- The encoded protobuf response of the first call.
    response   BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (method, request_id)
);
