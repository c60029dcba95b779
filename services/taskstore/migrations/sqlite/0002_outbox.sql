-- The outbox relay publishes every namespace's events to the event bus in
-- commit order, so it reads the log by (tx_id, id) alone.
CREATE INDEX taskstore_events_commit ON taskstore_events (tx_id, id);

-- One row per relay: its cursor (the last event it published) and its lease.
-- With several replicas on one database, only the lease holder relays and
-- moves the cursor; another takes over once lease_until (µs) has passed.
CREATE TABLE taskstore_outbox (
    name        TEXT   PRIMARY KEY,
    cursor_tx   BIGINT NOT NULL DEFAULT 0,
    cursor_id   BIGINT NOT NULL DEFAULT 0,
    owner       TEXT   NOT NULL,
    lease_until BIGINT NOT NULL
);
