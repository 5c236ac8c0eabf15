-- A revision's chunk list is stored as a shared full list plus the revision's edits to it,
-- instead of ~150 list rows per revision (one per chunk of a 10k-rule text). A one-rule edit
-- now writes its revision row and one or two edit rows; every KEYFRAME_EVERY revisions (or
-- when the edits outgrow a fraction of the list) the store writes a new full list, which the
-- following revisions are stored against (as a video's key frame and the frames after it).
-- Pruning the oldest revision deletes its row and its edit rows; the full list goes when the
-- last revision naming it goes (server/src/control/store/chunks.rs).
--
-- What SQLite enforces, as before for the list rows: every list entry and edit names a stored
-- chunk (insert triggers), `chunks.refs` counts the entries and edits naming a chunk and a
-- chunk it counts cannot be deleted; `chunk_lists.refs` counts the revisions naming a list
-- (triggers on `revisions`) and a list a revision names cannot be deleted; entries go with
-- their list, edits with their revision (foreign keys). Rows of entries and edits are never
-- updated. Revision digests are computed again by the migration's second step, in the server
-- (store/migrate.rs): a digest is now the root of the content's digest tree (sha256 over the
-- chunk digests, server/src/control/content/tree.rs), not the sha256 of the whole text.
CREATE TABLE chunk_lists (
    -- AUTOINCREMENT: an id is never used again, so the writer's memory of a list by id
    -- cannot name another list later.
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    -- How many revisions name this list (kept by triggers on `revisions`).
    refs INTEGER NOT NULL DEFAULT 0 CHECK (refs >= 0)
);
-- The lists no revision names (deleted at the end of the transaction that released them).
CREATE INDEX chunk_lists_unused ON chunk_lists (id) WHERE refs = 0;

CREATE TABLE chunk_list_entries (
    list     INTEGER NOT NULL REFERENCES chunk_lists(id) ON DELETE CASCADE,
    -- 4: the IPv4 text, 6: the IPv6 text.
    family   INTEGER NOT NULL CHECK (family IN (4, 6)),
    -- From 0; the list's text is the chunks' texts in this order.
    position INTEGER NOT NULL CHECK (position >= 0),
    -- A `chunks.id` (checked by `chunk_list_entries_count`).
    chunk    INTEGER NOT NULL,
    PRIMARY KEY (list, family, position)
) WITHOUT ROWID;

-- A revision's edits to its list, applied in `seq` order: keep the list's entries up to
-- position `at` (from where the previous edit stopped), skip `removed` entries, then add
-- `chunk` (NULL: nothing).
CREATE TABLE revision_chunk_edits (
    ruleset TEXT NOT NULL,
    number  INTEGER NOT NULL,
    family  INTEGER NOT NULL CHECK (family IN (4, 6)),
    seq     INTEGER NOT NULL CHECK (seq >= 0),
    at      INTEGER NOT NULL CHECK (at >= 0),
    removed INTEGER NOT NULL CHECK (removed >= 0),
    chunk   INTEGER,
    PRIMARY KEY (ruleset, number, family, seq),
    FOREIGN KEY (ruleset, number) REFERENCES revisions(ruleset, number) ON DELETE CASCADE
) WITHOUT ROWID;

ALTER TABLE revisions ADD COLUMN chunk_list INTEGER REFERENCES chunk_lists(id);
CREATE INDEX revisions_by_chunk_list ON revisions (chunk_list);

-- Every existing revision gets its own full list: its rows of `revision_chunk_list`. The
-- chunks' counts stay right: each old list row becomes one entry.
INSERT INTO chunk_lists (id, refs) SELECT rowid, 1 FROM revisions;
UPDATE revisions SET chunk_list = rowid;
INSERT INTO chunk_list_entries (list, family, position, chunk)
    SELECT r.rowid, l.family, l.position, l.chunk
    FROM revision_chunk_list l JOIN revisions r ON r.ruleset = l.ruleset AND r.number = l.number;

DROP TRIGGER revision_chunk_list_count;
DROP TRIGGER revision_chunk_list_uncount;
DROP TRIGGER revision_chunk_list_fixed;
DROP TABLE revision_chunk_list;

CREATE TRIGGER chunk_list_entries_count AFTER INSERT ON chunk_list_entries
BEGIN
    UPDATE chunks SET refs = refs + 1 WHERE id = NEW.chunk;
    SELECT RAISE(ABORT, 'FOREIGN KEY constraint failed: chunk_list_entries names no stored chunk')
        WHERE changes() = 0;
END;
CREATE TRIGGER chunk_list_entries_uncount AFTER DELETE ON chunk_list_entries
BEGIN
    UPDATE chunks SET refs = refs - 1 WHERE id = OLD.chunk;
END;
CREATE TRIGGER chunk_list_entries_fixed BEFORE UPDATE ON chunk_list_entries
BEGIN
    SELECT RAISE(ABORT, 'chunk_list_entries rows are not updated (the chunk counts follow inserts and deletes)');
END;

CREATE TRIGGER revision_chunk_edits_count AFTER INSERT ON revision_chunk_edits
    WHEN NEW.chunk IS NOT NULL
BEGIN
    UPDATE chunks SET refs = refs + 1 WHERE id = NEW.chunk;
    SELECT RAISE(ABORT, 'FOREIGN KEY constraint failed: revision_chunk_edits names no stored chunk')
        WHERE changes() = 0;
END;
CREATE TRIGGER revision_chunk_edits_uncount AFTER DELETE ON revision_chunk_edits
    WHEN OLD.chunk IS NOT NULL
BEGIN
    UPDATE chunks SET refs = refs - 1 WHERE id = OLD.chunk;
END;
CREATE TRIGGER revision_chunk_edits_fixed BEFORE UPDATE ON revision_chunk_edits
BEGIN
    SELECT RAISE(ABORT, 'revision_chunk_edits rows are not updated (the chunk counts follow inserts and deletes)');
END;

CREATE TRIGGER revisions_list_count AFTER INSERT ON revisions
    WHEN NEW.chunk_list IS NOT NULL
BEGIN
    UPDATE chunk_lists SET refs = refs + 1 WHERE id = NEW.chunk_list;
END;
CREATE TRIGGER revisions_list_uncount AFTER DELETE ON revisions
    WHEN OLD.chunk_list IS NOT NULL
BEGIN
    UPDATE chunk_lists SET refs = refs - 1 WHERE id = OLD.chunk_list;
END;
CREATE TRIGGER revisions_list_recount AFTER UPDATE OF chunk_list ON revisions
BEGIN
    UPDATE chunk_lists SET refs = refs - 1 WHERE id = OLD.chunk_list;
    UPDATE chunk_lists SET refs = refs + 1 WHERE id = NEW.chunk_list;
END;
CREATE TRIGGER chunk_lists_in_use BEFORE DELETE ON chunk_lists WHEN OLD.refs > 0
BEGIN
    SELECT RAISE(ABORT, 'FOREIGN KEY constraint failed: a revision names this chunk list');
END;
