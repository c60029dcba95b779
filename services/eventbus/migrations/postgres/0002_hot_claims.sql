-- A claim (pending -> in_flight) becomes a HOT update: no column it changes
-- is indexed or in an index predicate, and pages keep room for the new
-- version. The open deliveries' index now keys on `finished_at IS NULL`
-- instead of the state; a dead letter stays open (a replay may still take
-- it) and its dead-lettering time is its `updated_at`.
ALTER TABLE eventbus_deliveries SET (fillfactor = 70);

UPDATE eventbus_deliveries SET finished_at = NULL WHERE state = 'dead_lettered';

DROP INDEX eventbus_deliveries_unfinished;

CREATE INDEX eventbus_deliveries_open ON eventbus_deliveries (namespace, handler, sequence)
    WHERE finished_at IS NULL;
