-- Fewer indexes for every write to maintain. (The log's id is SQLite's rowid,
-- which has no index of its own: it stays as it is.)

-- A task has a lease end exactly while it has a worker, so the reaper finds
-- the expired leases among the live ones through taskstore_tasks_worker (it
-- holds only leased tasks).
DROP INDEX taskstore_tasks_leases;
