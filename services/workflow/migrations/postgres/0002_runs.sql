-- Workflow runs. A run's input, step records, gate decisions and signals change
-- together, under the run's row lock, so they are one JSON document (`body`).
-- Times are microseconds since the Unix epoch.

CREATE TABLE workflow_runs (
    id                TEXT    PRIMARY KEY,
    namespace         TEXT    NOT NULL,
    workflow          TEXT    NOT NULL,
    version           BIGINT  NOT NULL,
    state             TEXT    NOT NULL,
    idempotency_key   TEXT,
    concurrency_key   TEXT,
    concurrency_limit BIGINT,
    body              TEXT    NOT NULL,
    created_at        BIGINT  NOT NULL,
    updated_at        BIGINT  NOT NULL,
    finished_at       BIGINT,
    -- When an engine must look at the run next; NULL: only an outside change will.
    due_at            BIGINT,
    -- The engine driving the run, and the claim it holds (fences stale drivers).
    lease_owner       TEXT,
    lease_token       BIGINT  NOT NULL DEFAULT 0,
    lease_until       BIGINT,
    retention         BIGINT,
    purge_at          BIGINT
);

CREATE UNIQUE INDEX workflow_runs_idempotency ON workflow_runs (namespace, idempotency_key);
CREATE INDEX workflow_runs_recent ON workflow_runs (namespace, created_at DESC, id DESC);
CREATE INDEX workflow_runs_due ON workflow_runs (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX workflow_runs_owner ON workflow_runs (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE INDEX workflow_runs_group ON workflow_runs (namespace, workflow, concurrency_key, state)
    WHERE concurrency_limit IS NOT NULL;
CREATE INDEX workflow_runs_purge ON workflow_runs (purge_at) WHERE purge_at IS NOT NULL;

-- Every committed change of a run, for WatchRun; the id is the cursor.
CREATE TABLE workflow_run_events (
    id         BIGSERIAL PRIMARY KEY,
    run_id     TEXT   NOT NULL,
    body       TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX workflow_run_events_run ON workflow_run_events (run_id, id);

-- How far each namespace's event triggers have read the event bus.
CREATE TABLE workflow_trigger_cursors (
    namespace      TEXT   PRIMARY KEY,
    after_sequence BIGINT NOT NULL
);
