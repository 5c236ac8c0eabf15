-- How many list rows name a chunk is counted by SQLite in `chunks.refs` (triggers on
-- `revision_chunk_list`), instead of being found through an index on
-- `revision_chunk_list (chunk)`. That index ordered the list rows by chunk (one 10k-rule
-- ruleset with 100 kept revisions: ~15,000 entries), so the ~150 rows a commit adds and the
-- ~150 its prune deletes landed all over it: ~80 dirty pages written to the WAL per commit,
-- against ~13 with the count (server/src/store/chunks.rs has the numbers).
--
-- What SQLite enforces now: a list row names a stored chunk (the insert trigger refuses one
-- that does not exist, as the foreign key did), the count is the number of list rows naming
-- the chunk (kept by the insert and delete triggers, never written by the server; list rows
-- are never updated), a chunk a list names cannot be deleted, and a list belongs to a
-- revision (foreign key, deleted with it). The store deletes the chunks whose count is zero
-- at the end of each write transaction (`chunks_unused` finds them).
--
-- The list table is rebuilt to drop its foreign key to `chunks`: with no index on `chunk`,
-- SQLite would scan every list row to check each deleted chunk.
CREATE TABLE revision_chunk_list_new (
    ruleset  TEXT NOT NULL,
    number   INTEGER NOT NULL,
    -- 4: the IPv4 text, 6: the IPv6 text.
    family   INTEGER NOT NULL CHECK (family IN (4, 6)),
    -- From 0; the text is the chunks' texts in this order.
    position INTEGER NOT NULL CHECK (position >= 0),
    -- A `chunks.id` (checked by `revision_chunk_list_count`).
    chunk    INTEGER NOT NULL,
    PRIMARY KEY (ruleset, number, family, position),
    FOREIGN KEY (ruleset, number) REFERENCES revisions(ruleset, number) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO revision_chunk_list_new (ruleset, number, family, position, chunk)
    SELECT ruleset, number, family, position, chunk FROM revision_chunk_list;
DROP TABLE revision_chunk_list;
ALTER TABLE revision_chunk_list_new RENAME TO revision_chunk_list;

ALTER TABLE chunks ADD COLUMN refs INTEGER NOT NULL DEFAULT 0 CHECK (refs >= 0);
UPDATE chunks SET refs = n.n
    FROM (SELECT chunk, COUNT(*) AS n FROM revision_chunk_list GROUP BY chunk) AS n
    WHERE n.chunk = chunks.id;
-- The chunks no list names (deleted at the end of the transaction that released them).
CREATE INDEX chunks_unused ON chunks (id) WHERE refs = 0;

CREATE TRIGGER revision_chunk_list_count AFTER INSERT ON revision_chunk_list
BEGIN
    UPDATE chunks SET refs = refs + 1 WHERE id = NEW.chunk;
    SELECT RAISE(ABORT, 'FOREIGN KEY constraint failed: revision_chunk_list names no stored chunk')
        WHERE changes() = 0;
END;
CREATE TRIGGER revision_chunk_list_uncount AFTER DELETE ON revision_chunk_list
BEGIN
    UPDATE chunks SET refs = refs - 1 WHERE id = OLD.chunk;
END;
CREATE TRIGGER revision_chunk_list_fixed BEFORE UPDATE ON revision_chunk_list
BEGIN
    SELECT RAISE(ABORT, 'revision_chunk_list rows are not updated (the chunk counts follow inserts and deletes)');
END;
CREATE TRIGGER chunks_in_use BEFORE DELETE ON chunks WHEN OLD.refs > 0
BEGIN
    SELECT RAISE(ABORT, 'FOREIGN KEY constraint failed: a chunk list names this chunk');
END;
