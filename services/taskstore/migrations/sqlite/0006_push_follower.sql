-- Each unfinished config is followed by one gateway among the replicas on
-- this store: `follower` names it, and it holds the config until
-- `follower_until` (micros) unless it renews that lease. A config without a
-- follower, or whose lease ran out, is claimed by the first gateway that
-- asks; a follower that no longer holds its config may not advance it.
-- Both NULL: no follower (configs stored before this version, and those of
-- clients that name none), claimable at once.
ALTER TABLE taskstore_push_configs ADD COLUMN follower TEXT;
ALTER TABLE taskstore_push_configs ADD COLUMN follower_until BIGINT;

-- Claims look for unowned and lapsed leases; renewals and hand-backs for a
-- follower's configs. Only unfinished configs are ever followed.
CREATE INDEX taskstore_push_configs_lease ON taskstore_push_configs (follower_until)
    WHERE finished_at IS NULL;
CREATE INDEX taskstore_push_configs_follower ON taskstore_push_configs (follower)
    WHERE finished_at IS NULL;
