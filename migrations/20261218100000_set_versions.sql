-- Set etags (issue #21): every SetService call that changes a set bumps its version in the
-- same transaction; the etag is the row id and the version, so a set destroyed and made
-- again, or a name that a swap moved to the other row, has another etag.

ALTER TABLE sets ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
