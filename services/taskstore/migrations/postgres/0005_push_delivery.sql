-- Push deliveries outlive the gateway that follows them: each config keeps
-- the cursor of the last change it was delivered (or, before any, of the
-- change it starts after; NULL: it starts with the task's first) and when it
-- finished (the task ended). A restarted gateway resumes every config not
-- finished, after its cursor.
ALTER TABLE taskstore_push_configs ADD COLUMN delivered_tx BIGINT;
ALTER TABLE taskstore_push_configs ADD COLUMN delivered_id BIGINT;
ALTER TABLE taskstore_push_configs ADD COLUMN finished_at BIGINT;

-- Configs stored before this version kept no cursor: they are not resumed,
-- as before (their followers ended with the gateway that ran them).
UPDATE taskstore_push_configs SET finished_at = created_at;

CREATE INDEX taskstore_push_configs_pending ON taskstore_push_configs (namespace, task_id, id)
    WHERE finished_at IS NULL;
