-- A task a worker handed back for the others: until `not_before`, only the
-- worker `held_from` names is kept from claiming it, and any other may.
-- NULL: `not_before` keeps every worker from it.
ALTER TABLE taskstore_tasks ADD COLUMN held_from TEXT;
