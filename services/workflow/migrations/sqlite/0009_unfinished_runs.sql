-- The engines count the unfinished runs by state, and how long the least
-- recently changed of each state has stood, every few seconds
-- (chorus_workflow_runs_unfinished, chorus_workflow_runs_idle_seconds): read
-- through this index, those counts cost the unfinished runs, not every run
-- kept. It holds `state` alone, which a run's step writes leave as it is, so
-- they stay heap-only updates.
CREATE INDEX workflow_runs_unfinished ON workflow_runs (state) WHERE state IN ('pending', 'running', 'waiting');
