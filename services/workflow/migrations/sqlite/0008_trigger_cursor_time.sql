-- A trigger cursor names the last event judged by its sequence alone, so a
-- bus log that started over (its database reset or restored) and had grown
-- past that sequence again by the time the engine read it looked like the
-- same log, and the events between were never judged. The cursor now keeps
-- that event's publication time too (µs), which the engine checks against
-- the event of that sequence before it reads on. NULL: saved before this
-- version, not checked.
ALTER TABLE workflow_trigger_cursors ADD COLUMN published_at BIGINT;
