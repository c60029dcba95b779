-- ListTasks by context (a conversation's tasks, newest first) reads this
-- index instead of every task of the namespace, and counts by it.
CREATE INDEX taskstore_tasks_context ON taskstore_tasks (namespace, context_id, status_timestamp DESC, id DESC);
