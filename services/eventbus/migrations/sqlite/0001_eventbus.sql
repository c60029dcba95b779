-- The event bus's tables. Times are microseconds since the Unix epoch.

-- The latest sequence of each namespace's log. Publishers lock their
-- namespace's row until they commit, so sequences commit in order.
CREATE TABLE eventbus_heads (
    namespace TEXT   PRIMARY KEY,
    head      BIGINT NOT NULL
);

CREATE TABLE eventbus_events (
    namespace       TEXT   NOT NULL,
    sequence        BIGINT NOT NULL,
    type            TEXT   NOT NULL,
    source          TEXT   NOT NULL,
    subject         TEXT   NOT NULL,
    payload         BLOB   NOT NULL,
    content_type    TEXT   NOT NULL,
    attributes      TEXT   NOT NULL,
    idempotency_key TEXT,
    time            BIGINT NOT NULL,
    published_at    BIGINT NOT NULL,
    PRIMARY KEY (namespace, sequence)
);

CREATE UNIQUE INDEX eventbus_events_idempotency ON eventbus_events (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE eventbus_handlers (
    namespace             TEXT   NOT NULL,
    name                  TEXT   NOT NULL,
    event_types           TEXT   NOT NULL,
    after_handlers        TEXT   NOT NULL,
    failure_policy        TEXT   NOT NULL,
    max_attempts          BIGINT NOT NULL,
    initial_backoff_ms    BIGINT NOT NULL,
    max_backoff_ms        BIGINT NOT NULL,
    visibility_timeout_ms BIGINT NOT NULL,
    start_sequence        BIGINT NOT NULL,
    created_at            BIGINT NOT NULL,
    updated_at            BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- One row per (handler, type pattern); `matcher` is the pattern in the
-- backend's own syntax (GLOB here), so publishing fans out in one statement.
CREATE TABLE eventbus_handler_types (
    namespace TEXT NOT NULL,
    handler   TEXT NOT NULL,
    matcher   TEXT NOT NULL,
    PRIMARY KEY (namespace, handler, matcher)
);

CREATE TABLE eventbus_deliveries (
    namespace       TEXT   NOT NULL,
    sequence        BIGINT NOT NULL,
    handler         TEXT   NOT NULL,
    state           TEXT   NOT NULL,
    attempt         BIGINT NOT NULL DEFAULT 0,
    consumer_id     TEXT,
    visible_until   BIGINT,
    next_attempt_at BIGINT,
    last_error      TEXT,
    skip_handler    TEXT,
    skip_message    TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    finished_at     BIGINT,
    PRIMARY KEY (namespace, sequence, handler)
);

-- A handler's deliveries that are not done yet, in log order: what claims
-- scan, what its statistics and dead letters count, and where the reaper
-- finds leases that ran out. The only index besides the key: every state
-- change rewrites the index entries of its row.
CREATE INDEX eventbus_deliveries_unfinished ON eventbus_deliveries (namespace, handler, sequence)
    WHERE state IN ('pending', 'in_flight', 'failed', 'dead_lettered');
