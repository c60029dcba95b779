-- A run's row is rewritten by every step. PostgreSQL can write the new
-- version beside the old one without touching the table's six indexes (a
-- heap-only update) only when the page has room for it; packed full, as
-- rows are by default, four updates in ten went into every index. Pages
-- filled to half leave that room. Existing pages keep their layout until
-- rewritten.
ALTER TABLE workflow_runs SET (fillfactor = 50);
