-- Each consumer's latest stream. Opening a stream numbers it one past the
-- consumer's previous stream, which can claim nothing from then on: a
-- stream left behind by a crashed consumer (its server side not yet aware
-- the client went away) would otherwise lease deliveries after the new
-- stream took back the old leases, and nobody would get them until their
-- lease ran out, after the events that followed them.
CREATE TABLE eventbus_consumers (
    namespace   TEXT   NOT NULL,
    handler     TEXT   NOT NULL,
    consumer_id TEXT   NOT NULL,
    stream      BIGINT NOT NULL,
    PRIMARY KEY (namespace, handler, consumer_id)
);
