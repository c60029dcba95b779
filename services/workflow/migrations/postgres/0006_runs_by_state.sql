-- Lists of runs in some states (`chorus run list --state waiting`, the gates
-- waiting for a decision) read only those runs, newest first, instead of
-- every run of the namespace: on 200,000 finished runs and 50 waiting, such a
-- list read the whole table (150 ms) and now reads the 50 (1 ms). A run's
-- state changes only with its claim (when it starts, waits or ends), an
-- update that rewrites the row's index entries anyway.
CREATE INDEX workflow_runs_state ON workflow_runs (namespace, state, created_at DESC, id DESC);
