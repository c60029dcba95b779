-- A task whose turns a gateway runs itself (a workflow or remote agent's,
-- which no worker claims) is followed by one gateway under a lease:
-- `turn_follower` names it, and it holds the task until
-- `turn_follower_until` (micros) unless it renews that lease. Once the lease
-- ran out (the gateway died), another gateway claims the task and catches
-- it up with the run or remote task behind it. NULL: no gateway follows it.
ALTER TABLE taskstore_tasks ADD COLUMN turn_follower TEXT;
ALTER TABLE taskstore_tasks ADD COLUMN turn_follower_until BIGINT;

-- Claims look for lapsed leases; only followed tasks are in the index.
CREATE INDEX taskstore_tasks_turn_lease ON taskstore_tasks (turn_follower_until)
    WHERE turn_follower IS NOT NULL;
