-- An artifact whose last chunk was written takes no more appends: 1 once a
-- chunk said it was the last, 0 while more may come. NULL on artifacts
-- written before this version, which stay open, as they were.
ALTER TABLE taskstore_artifacts ADD COLUMN closed BIGINT;
