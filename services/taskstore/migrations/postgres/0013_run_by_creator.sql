-- Who runs a task's turns. 0: a worker of its agent, which claims it; every
-- write the agent makes (status, artifacts, agent messages, questions,
-- spawns) then needs the claim's lease, so a caller without one cannot move
-- a queued task out of the queue. 1: its creator (a gateway's built-in,
-- workflow and remote agents), which writes without a lease; no worker
-- claims such a task.
ALTER TABLE taskstore_tasks ADD COLUMN run_by_creator BIGINT NOT NULL DEFAULT 0;

-- An unfinished task a gateway follows (a workflow or remote agent's) is
-- run by its creator.
UPDATE taskstore_tasks SET run_by_creator = 1 WHERE turn_follower IS NOT NULL;
