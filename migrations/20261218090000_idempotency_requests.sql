-- Idempotency keys that also compare the request (issue #21): the sha256 (hex) of the
-- request's encoding is kept with the key, and a retry whose request differs is refused. Rows
-- written before this migration have an empty digest and are not compared. Keys expire after
-- vallumd's --idempotency-ttl; the age indexes serve the store's pruning of both tables
-- (--idempotency-ttl, --audit-retention, --audit-max-rows).

ALTER TABLE idempotency ADD COLUMN request_digest TEXT NOT NULL DEFAULT '';
CREATE INDEX idempotency_by_age ON idempotency (created_at);
CREATE INDEX audit_by_age ON audit (at);
