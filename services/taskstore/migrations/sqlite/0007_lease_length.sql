-- A lease remembers how long it was granted for (µs): a renewal that names
-- no length extends it by as much again. NULL on leases granted before this
-- version, which a plain renewal extends by the server's default, as before.
ALTER TABLE taskstore_tasks ADD COLUMN lease_length BIGINT;
