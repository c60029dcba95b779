-- Fewer indexes for every write to maintain and for every statement to open.

-- The log is read in (tx_id, id) order and never by id alone: that order is
-- its primary key, so one index serves both the key and the relay's reads.
DROP INDEX taskstore_events_commit;
ALTER TABLE taskstore_events DROP CONSTRAINT taskstore_events_pkey, ADD PRIMARY KEY (tx_id, id);

-- A task has a lease end exactly while it has a worker, so the reaper finds
-- the expired leases among the live ones through taskstore_tasks_worker (it
-- holds only leased tasks), and a renewal changes no indexed column.
DROP INDEX taskstore_tasks_leases;
