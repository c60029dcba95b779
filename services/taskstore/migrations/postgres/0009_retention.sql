-- Retention (`taskstore.retention_ms`): finished task trees are deleted once
-- every task in them finished longer ago than that. The purge looks for
-- finished roots in the order they finished, and deletes a tree's inbox
-- rows by the task they are about.
CREATE INDEX taskstore_tasks_finished_roots ON taskstore_tasks (status_timestamp, namespace, id)
    WHERE parent_id IS NULL AND state IN ('completed', 'failed', 'canceled', 'rejected');
CREATE INDEX taskstore_inbox_task ON taskstore_inbox (namespace, task_id);
