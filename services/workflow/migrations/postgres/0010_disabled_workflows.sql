-- Workflows an operator disabled: no trigger, schedule or start makes a run of
-- one until it is enabled again (runs already started go on). A row per
-- disabled workflow, for all its versions; enabling deletes it. Times are
-- microseconds since the Unix epoch.
CREATE TABLE workflow_disabled (
    namespace       TEXT   NOT NULL,
    name            TEXT   NOT NULL,
    disabled_by     TEXT   NOT NULL,
    disabled_reason TEXT   NOT NULL,
    disabled_at     BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);
