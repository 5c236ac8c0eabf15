-- Revision texts are stored as content-addressed chunks (runs of whole lines, cut where a
-- line's hash says so; see server/src/store/chunks.rs), each chunk once, shared by every
-- revision that contains it. A commit that changes a few rules of a 10k-rule ruleset used to
-- write its whole ~0.5 MB text again (and pruning deleted as much): now it writes the one or
-- two chunks that changed and a list of chunk ids, and 100 kept revisions of a ruleset cost
-- about one copy of its text instead of 100.
--
-- `chunks` holds the small columns (digest for lookup, reference count), `chunk_texts` the
-- texts: SQLite rewrites a whole row on UPDATE, so counting references must not touch texts.
CREATE TABLE chunks (
    id     INTEGER PRIMARY KEY,
    -- sha256 of the text; NULL for the whole texts moved here by this migration.
    digest BLOB UNIQUE,
    -- How many (revision, family) chunk lists name this chunk (once per list, however often).
    refs   INTEGER NOT NULL
);

CREATE TABLE chunk_texts (
    id   INTEGER PRIMARY KEY,
    text TEXT NOT NULL
);

-- Chunk ids of a revision's IPv4 and IPv6 text, in order, comma-separated ('' = no text).
CREATE TABLE revision_chunks (
    ruleset   TEXT NOT NULL,
    number    INTEGER NOT NULL,
    chunks_v4 TEXT NOT NULL,
    chunks_v6 TEXT NOT NULL,
    PRIMARY KEY (ruleset, number)
);

-- Existing texts become one chunk each (ids derived from the old rowid: even for IPv4, odd
-- for IPv6).
INSERT INTO chunks (id, digest, refs)
    SELECT rowid * 2, NULL, 1 FROM revision_content WHERE content_v4 <> '';
INSERT INTO chunk_texts (id, text)
    SELECT rowid * 2, content_v4 FROM revision_content WHERE content_v4 <> '';
INSERT INTO chunks (id, digest, refs)
    SELECT rowid * 2 + 1, NULL, 1 FROM revision_content WHERE content_v6 <> '';
INSERT INTO chunk_texts (id, text)
    SELECT rowid * 2 + 1, content_v6 FROM revision_content WHERE content_v6 <> '';
INSERT INTO revision_chunks (ruleset, number, chunks_v4, chunks_v6)
    SELECT ruleset, number,
           CASE WHEN content_v4 = '' THEN '' ELSE CAST(rowid * 2 AS TEXT) END,
           CASE WHEN content_v6 = '' THEN '' ELSE CAST(rowid * 2 + 1 AS TEXT) END
    FROM revision_content;

DROP TABLE revision_content;
