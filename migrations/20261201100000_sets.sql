-- ipset-style sets (SetService; issue #4). Times are Unix nanoseconds (INTEGER).
-- The engine's SetManager is the live copy; these rows are what vallumd restores at start,
-- before it loads the active revisions (which may reference the sets). Every SetService call
-- that changes a set changes these rows in one transaction that is durable before the engine
-- publishes the change (see server/src/pipeline/sets.rs).

CREATE TABLE sets (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    -- `ipset swap` exchanges two rows' names (the contents and options travel together).
    name       TEXT NOT NULL UNIQUE,
    type       TEXT NOT NULL CHECK (type IN ('hash:ip', 'hash:net', 'hash:ip,port', 'hash:net,port')),
    family     TEXT NOT NULL CHECK (family IN ('inet', 'inet6')),
    hashsize   INTEGER NOT NULL,
    maxelem    INTEGER NOT NULL,
    -- Default element timeout, seconds; NULL: the set has no timeouts.
    timeout    INTEGER,
    counters   INTEGER NOT NULL CHECK (counters IN (0, 1)),
    created_at INTEGER NOT NULL
);

CREATE TABLE set_elements (
    set_id     INTEGER NOT NULL REFERENCES sets(id) ON DELETE CASCADE,
    -- The element in `ipset save` syntax, canonical (one element, CIDRs/ranges expanded).
    element    TEXT NOT NULL,
    -- Absolute wall-clock expiry, Unix ns (so a restart does not extend a timeout); NULL:
    -- never expires.
    expires_at INTEGER,
    PRIMARY KEY (set_id, element)
) WITHOUT ROWID;

CREATE INDEX set_elements_expiry ON set_elements (expires_at) WHERE expires_at IS NOT NULL;
