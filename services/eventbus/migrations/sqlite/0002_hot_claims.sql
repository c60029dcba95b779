-- The open deliveries' index keys on `finished_at IS NULL`, as on
-- PostgreSQL (where it makes claims HOT updates); a dead letter stays open
-- and its dead-lettering time is its `updated_at`.
UPDATE eventbus_deliveries SET finished_at = NULL WHERE state = 'dead_lettered';

DROP INDEX eventbus_deliveries_unfinished;

CREATE INDEX eventbus_deliveries_open ON eventbus_deliveries (namespace, handler, sequence)
    WHERE finished_at IS NULL;
