-- Active revisions that did not load at start (server/src/pipeline.rs, Pipeline::load): the
-- ruleset still names them active, the engine does not run them. A row stays until the
-- ruleset gets another active revision, is deleted, or its revision loads at a later start.
CREATE TABLE load_failures (
    ruleset  TEXT PRIMARY KEY NOT NULL REFERENCES rulesets(name) ON DELETE CASCADE,
    revision INTEGER NOT NULL,
    -- Why it did not load (parse, validation or store error).
    error    TEXT NOT NULL,
    at       INTEGER NOT NULL
);
