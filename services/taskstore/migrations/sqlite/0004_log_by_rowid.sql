-- Every event's tx_id is 0 on SQLite (one writer: ids commit in order), so
-- the log in (tx_id, id) order is the table in rowid order. The relay reads
-- it by rowid, and this index only cost every event an insertion.
DROP INDEX taskstore_events_commit;
