-- A task a worker failed with `retry_after` goes back to the queue at once
-- but is not claimed before `not_before` (micros): a worker can back off
-- from an upstream that is briefly down instead of spending every attempt
-- within milliseconds. NULL (or a time passed): claimable now.
ALTER TABLE taskstore_tasks ADD COLUMN not_before BIGINT;
