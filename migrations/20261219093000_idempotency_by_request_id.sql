-- Idempotency keys are one namespace across methods (issue #28, as AIP-155: the key names
-- the request): a call looks its request_id up whatever method stored it, which this index
-- serves (the primary key starts with the method).

CREATE INDEX idempotency_by_request_id ON idempotency (request_id, created_at);
