-- Every commit asks two questions of the ruleset it commits: which of its commits still wait
-- for a ConfirmCommit (to clear their deadlines, and so that the prune keeps the revision a
-- timeout would restore), and which of its revisions are PENDING_CONFIRM (also kept by the
-- prune). With only `commits_by_ruleset (ruleset, id)` and the revisions' primary key, SQLite
-- answered them by reading every commit row the ruleset ever made (one more per commit, never
-- pruned: the commit history) and every kept revision row. These partial indexes hold only
-- the rows that answer yes (usually none), so a commit's cost no longer grows with its
-- ruleset's history (server/src/control/store/writer.rs: `clear_deadlines`,
-- `prune_revisions`).
CREATE INDEX commits_pending_by_ruleset ON commits (ruleset) WHERE confirm_deadline IS NOT NULL;
CREATE INDEX revisions_pending_by_ruleset ON revisions (ruleset) WHERE state = 'PENDING_CONFIRM';
