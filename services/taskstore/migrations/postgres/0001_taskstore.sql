-- The task store's tables. Times are microseconds since the Unix epoch;
-- messages, artifacts and metadata are JSON text.

CREATE TABLE taskstore_tasks (
    namespace          TEXT   NOT NULL,
    id                 TEXT   NOT NULL,
    context_id         TEXT   NOT NULL,
    agent_id           TEXT   NOT NULL,
    state              TEXT   NOT NULL,
    status_message     TEXT,
    status_timestamp   BIGINT NOT NULL,
    metadata           TEXT,
    parent_id          TEXT,
    owner_kind         TEXT,
    owner_id           TEXT,
    depth              BIGINT NOT NULL,
    spawn_context      TEXT   NOT NULL,
    prompt_fingerprint TEXT   NOT NULL,
    request_message_id TEXT   NOT NULL,
    trace_context      TEXT   NOT NULL,
    attempt            BIGINT NOT NULL DEFAULT 0,
    max_retries        BIGINT NOT NULL DEFAULT 0,
    worker_id          TEXT,
    lease_id           TEXT,
    lease_expires_at   BIGINT,
    history_count      BIGINT NOT NULL DEFAULT 0,
    created_at         BIGINT NOT NULL,
    PRIMARY KEY (namespace, id)
);

-- A retried create (same first message id) finds the task it made.
CREATE UNIQUE INDEX taskstore_tasks_request ON taskstore_tasks (namespace, request_message_id);
CREATE INDEX taskstore_tasks_claimable ON taskstore_tasks (namespace, agent_id, created_at, id)
    WHERE state = 'submitted';
-- A task is leased while it has a worker; lease_id outlives the lease as the
-- task's last lease.
CREATE INDEX taskstore_tasks_leases ON taskstore_tasks (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
CREATE INDEX taskstore_tasks_worker ON taskstore_tasks (namespace, worker_id) WHERE worker_id IS NOT NULL;
CREATE INDEX taskstore_tasks_recent ON taskstore_tasks (namespace, status_timestamp DESC, id DESC);
CREATE INDEX taskstore_tasks_children ON taskstore_tasks (namespace, parent_id, created_at)
    WHERE parent_id IS NOT NULL;

CREATE TABLE taskstore_history (
    namespace TEXT   NOT NULL,
    task_id   TEXT   NOT NULL,
    position  BIGINT NOT NULL,
    message   TEXT   NOT NULL,
    PRIMARY KEY (namespace, task_id, position)
);

CREATE TABLE taskstore_artifacts (
    namespace   TEXT   NOT NULL,
    task_id     TEXT   NOT NULL,
    artifact_id TEXT   NOT NULL,
    position    BIGINT NOT NULL,
    artifact    TEXT   NOT NULL,
    PRIMARY KEY (namespace, task_id, artifact_id)
);

-- The outbox: every change, in commit order. A reader orders by (tx_id, id)
-- and reads only below the oldest transaction still running, so a row that
-- commits late is never skipped.
CREATE TABLE taskstore_events (
    id         BIGSERIAL PRIMARY KEY,
    tx_id      BIGINT NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    namespace  TEXT   NOT NULL,
    task_id    TEXT   NOT NULL,
    context_id TEXT   NOT NULL,
    agent_id   TEXT   NOT NULL,
    kind       TEXT   NOT NULL,
    payload    TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX taskstore_events_log ON taskstore_events (namespace, tx_id, id);
CREATE INDEX taskstore_events_task ON taskstore_events (namespace, task_id, tx_id, id);

CREATE TABLE taskstore_inbox (
    id             BIGSERIAL PRIMARY KEY,
    namespace      TEXT   NOT NULL,
    owner_kind     TEXT   NOT NULL,
    owner_id       TEXT   NOT NULL,
    task_id        TEXT   NOT NULL,
    parent_task_id TEXT,
    kind           TEXT   NOT NULL,
    message        TEXT,
    task_state     TEXT,
    created_at     BIGINT NOT NULL,
    read_at        BIGINT
);

-- A child's completion reaches its owner exactly once.
CREATE UNIQUE INDEX taskstore_inbox_one_completion ON taskstore_inbox (namespace, task_id)
    WHERE kind = 'completion';
CREATE INDEX taskstore_inbox_unread ON taskstore_inbox (namespace, owner_kind, owner_id, id)
    WHERE read_at IS NULL;

CREATE TABLE taskstore_push_configs (
    namespace        TEXT   NOT NULL,
    task_id          TEXT   NOT NULL,
    id               TEXT   NOT NULL,
    url              TEXT   NOT NULL,
    token            TEXT,
    auth_scheme      TEXT,
    auth_credentials TEXT,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (namespace, task_id, id)
);
