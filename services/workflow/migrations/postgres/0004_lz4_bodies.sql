-- A run's body is rewritten whole by every step (a few KB of JSON), and
-- PostgreSQL compresses it on each write. lz4 does that about three times
-- faster than the default pglz, at much the same size. Rows written before
-- keep pglz until their next write. A server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE workflow_runs ALTER COLUMN body SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'lz4 is not available; workflow run bodies stay compressed with pglz';
END
$$;
