-- Workflow definitions: every version kept. Times are microseconds since the Unix epoch.

CREATE TABLE workflow_definitions (
    namespace     TEXT   NOT NULL,
    name          TEXT   NOT NULL,
    version       BIGINT NOT NULL,
    description   TEXT   NOT NULL,
    triggers      TEXT   NOT NULL,
    source        TEXT   NOT NULL,
    file          TEXT   NOT NULL,
    source_sha256 TEXT   NOT NULL,
    created_by    TEXT   NOT NULL,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (namespace, name, version)
);
