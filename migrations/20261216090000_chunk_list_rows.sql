-- Chunk lists become rows (one per chunk of a revision's text, with its position) with
-- foreign keys, instead of comma-separated ids in `revision_chunks` and reference counts in
-- `chunks.refs` kept by hand: SQLite now enforces that a list names only stored chunks
-- (a chunk a list names cannot be deleted), that a list belongs to a revision (deleted with
-- it), and that a text belongs to a chunk (deleted with it). A chunk no list names is
-- deleted by the store in the transaction that released it (server/src/store/chunks.rs).
-- The counts go (the rows say it now). `chunks` is rebuilt rather than altered: SQLite's
-- DROP COLUMN cannot cut `refs` out of a definition with comments in it.
CREATE TABLE chunks_new (
    id     INTEGER PRIMARY KEY,
    -- sha256 of the text; NULL for the whole texts moved here by 20261201140000.
    digest BLOB UNIQUE
);
INSERT INTO chunks_new (id, digest) SELECT id, digest FROM chunks;
DROP TABLE chunks;
ALTER TABLE chunks_new RENAME TO chunks;

CREATE TABLE revision_chunk_list (
    ruleset  TEXT NOT NULL,
    number   INTEGER NOT NULL,
    -- 4: the IPv4 text, 6: the IPv6 text.
    family   INTEGER NOT NULL CHECK (family IN (4, 6)),
    -- From 0; the text is the chunks' texts in this order.
    position INTEGER NOT NULL CHECK (position >= 0),
    chunk    INTEGER NOT NULL REFERENCES chunks(id),
    PRIMARY KEY (ruleset, number, family, position),
    FOREIGN KEY (ruleset, number) REFERENCES revisions(ruleset, number) ON DELETE CASCADE
) WITHOUT ROWID;
-- Finding whether any list still names a chunk (and the foreign key check on deleting one).
CREATE INDEX revision_chunk_list_by_chunk ON revision_chunk_list (chunk);

-- The comma-separated lists, split ('' is an empty list).
INSERT INTO revision_chunk_list (ruleset, number, family, position, chunk)
WITH RECURSIVE split (ruleset, number, family, position, rest, chunk) AS (
    SELECT c.ruleset, c.number, 4, -1,
           CASE WHEN c.chunks_v4 = '' THEN '' ELSE c.chunks_v4 || ',' END, NULL
    FROM revision_chunks c
    UNION ALL
    SELECT c.ruleset, c.number, 6, -1,
           CASE WHEN c.chunks_v6 = '' THEN '' ELSE c.chunks_v6 || ',' END, NULL
    FROM revision_chunks c
    UNION ALL
    SELECT ruleset, number, family, position + 1,
           substr(rest, instr(rest, ',') + 1),
           CAST(substr(rest, 1, instr(rest, ',') - 1) AS INTEGER)
    FROM split WHERE rest <> ''
)
SELECT ruleset, number, family, position, chunk FROM split WHERE position >= 0;

DROP TABLE revision_chunks;

-- Texts get their foreign key (SQLite cannot add one in place: the table is rebuilt).
CREATE TABLE chunk_texts_new (
    id   INTEGER PRIMARY KEY REFERENCES chunks(id) ON DELETE CASCADE,
    text TEXT NOT NULL
);
INSERT INTO chunk_texts_new (id, text) SELECT id, text FROM chunk_texts;
DROP TABLE chunk_texts;
ALTER TABLE chunk_texts_new RENAME TO chunk_texts;
