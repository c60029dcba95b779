-- Each consumer's open stream, by a number drawn at random when it opens.
-- A stream the consumer has since replaced can claim nothing: one left
-- behind by a crashed consumer (its server side not yet aware the client
-- went away) would otherwise lease deliveries after the new stream took
-- back the old leases, and nobody would get them until their lease ran out,
-- after the events that followed them. A stream's row goes when it ends.
CREATE TABLE eventbus_consumers (
    namespace   TEXT   NOT NULL,
    handler     TEXT   NOT NULL,
    consumer_id TEXT   NOT NULL,
    stream      BIGINT NOT NULL,
    PRIMARY KEY (namespace, handler, consumer_id)
);
