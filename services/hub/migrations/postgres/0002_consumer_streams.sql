-- Each consumer's open inbox stream, by a number drawn at random when it
-- opens. A stream the consumer has since replaced takes nothing: one left
-- behind by a consumer that crashed or lost its connection (its server side
-- not yet aware the client went away) would otherwise lease messages after
-- the new stream took back the old leases, and nobody would get them until
-- their lease ran out. A stream's row goes when it ends.
CREATE TABLE hub_consumers (
    namespace   TEXT   NOT NULL,
    agent_id    TEXT   NOT NULL,
    consumer_id TEXT   NOT NULL,
    stream      BIGINT NOT NULL,
    PRIMARY KEY (namespace, agent_id, consumer_id)
);
