-- The log orders events by their transaction's id, and transaction ids
-- belong to the PostgreSQL server (the cluster), not to the database: a dump
-- restored on another server (a new one after a disaster, a major upgrade by
-- dump and restore) keeps its events' ids while that server's counter may be
-- far behind, so every new event sorted before the restored cursors and was
-- never published nor seen. An event's tx_id is now its transaction's id
-- plus `xid_offset`, which the task store raises at start-up when it finds
-- the log ahead of the server (and writes into tx_id's default with it).
CREATE TABLE taskstore_clock (
    only_row   BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    xid_offset BIGINT  NOT NULL
);

INSERT INTO taskstore_clock (xid_offset) VALUES (0);
