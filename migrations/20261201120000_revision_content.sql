-- Revision texts move out of `revisions` into their own table. SQLite stores a row's columns
-- in order, with long values in overflow pages: with the texts inside the row, reading
-- `state` (which comes after them) walked every revision's text, and changing a revision's
-- state rewrote its whole text. A 10k-rule Apply spent ~40 ms scanning the kept revisions'
-- texts while pruning, and rewrote the previous revision's ~0.5 MB to mark it SUPERSEDED.
-- `revisions` now holds only the small columns; the texts are written once and read only
-- when a caller asks for them.
CREATE TABLE revision_content (
    ruleset    TEXT NOT NULL,
    number     INTEGER NOT NULL,
    content_v4 TEXT NOT NULL,
    content_v6 TEXT NOT NULL,
    PRIMARY KEY (ruleset, number)
);

INSERT INTO revision_content (ruleset, number, content_v4, content_v6)
    SELECT ruleset, number, content_v4, content_v6 FROM revisions;

ALTER TABLE revisions DROP COLUMN content_v4;
ALTER TABLE revisions DROP COLUMN content_v6;
