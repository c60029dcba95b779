-- Every write of a run counts up its revision, so the engine holding the run
-- can write it again without reading it first: its write lands only when the
-- revision (and its claim) are still the ones it last wrote.
ALTER TABLE workflow_runs ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;
