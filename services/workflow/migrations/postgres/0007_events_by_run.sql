-- A run's events are only ever read, and deleted, by run (WatchRun reads
-- those after a cursor; purging deletes a run's whole history), so the key
-- that leads with the run is the only index they need. Keyed by the id
-- alone, every event went into two indexes (the key and the run's); keyed
-- by (run_id, id) it goes into one, which steps, writing two or three
-- events each, do on every write.
ALTER TABLE workflow_run_events DROP CONSTRAINT workflow_run_events_pkey;
DROP INDEX workflow_run_events_run;
ALTER TABLE workflow_run_events ADD PRIMARY KEY (run_id, id);
