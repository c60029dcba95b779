-- The hub's tables. Times are microseconds since the Unix epoch.

CREATE TABLE hub_agents (
    namespace     TEXT   NOT NULL,
    id            TEXT   NOT NULL,
    agent_type    TEXT   NOT NULL,
    capabilities  TEXT   NOT NULL,
    agent_card    TEXT,
    metadata      TEXT   NOT NULL,
    announce      BIGINT NOT NULL,
    registered_at BIGINT NOT NULL,
    last_seen_at  BIGINT NOT NULL,
    PRIMARY KEY (namespace, id)
);

CREATE TABLE hub_subscriptions (
    namespace     TEXT   NOT NULL,
    topic         TEXT   NOT NULL,
    agent_id      TEXT   NOT NULL,
    subscribed_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, topic, agent_id)
);

CREATE INDEX hub_subscriptions_agent ON hub_subscriptions (namespace, agent_id);

-- Message sequences: increasing across the hub, so within every namespace.
CREATE TABLE hub_message_sequence (
    id    BIGINT PRIMARY KEY,
    value BIGINT NOT NULL
);

INSERT INTO hub_message_sequence (id, value) VALUES (1, 0);

-- A message once, whatever its number of recipients.
CREATE TABLE hub_messages (
    namespace       TEXT   NOT NULL,
    id              TEXT   NOT NULL,
    sequence        BIGINT NOT NULL,
    kind            TEXT   NOT NULL,
    sender          TEXT   NOT NULL,
    topic           TEXT,
    type            TEXT   NOT NULL,
    payload         BLOB   NOT NULL,
    content_type    TEXT   NOT NULL,
    correlation_id  TEXT,
    sent_at         BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    idempotency_key TEXT,
    recipients      BIGINT NOT NULL,
    PRIMARY KEY (namespace, id)
);

CREATE UNIQUE INDEX hub_messages_idempotency ON hub_messages (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX hub_messages_expiry ON hub_messages (expires_at);

-- One row per (recipient, message) until acked or expired; the filter
-- columns are copied from the message so receives read one table.
CREATE TABLE hub_inbox (
    namespace      TEXT   NOT NULL,
    recipient      TEXT   NOT NULL,
    sequence       BIGINT NOT NULL,
    message_id     TEXT   NOT NULL,
    kind           TEXT   NOT NULL,
    sender         TEXT   NOT NULL,
    type           TEXT   NOT NULL,
    topic          TEXT,
    correlation_id TEXT,
    expires_at     BIGINT NOT NULL,
    consumer_id    TEXT,
    ack_deadline   BIGINT,
    attempt        BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, recipient, sequence)
);

CREATE UNIQUE INDEX hub_inbox_message ON hub_inbox (namespace, message_id, recipient);
CREATE INDEX hub_inbox_expiry ON hub_inbox (expires_at);

-- Delegate calls waiting for (or holding) their reply.
CREATE TABLE hub_delegations (
    namespace      TEXT   NOT NULL,
    correlation_id TEXT   NOT NULL,
    sender         TEXT   NOT NULL,
    recipient      TEXT   NOT NULL,
    expires_at     BIGINT NOT NULL,
    reply_id       TEXT,
    reply_sequence BIGINT,
    reply_type     TEXT,
    reply_payload  BLOB,
    reply_content_type TEXT,
    replied_at     BIGINT,
    PRIMARY KEY (namespace, correlation_id)
);

CREATE INDEX hub_delegations_expiry ON hub_delegations (expires_at);

-- Shared state. A deleted or expired key keeps its row (change 'deleted' or
-- 'expired', no value) so that its version never restarts.
CREATE TABLE hub_state (
    namespace    TEXT   NOT NULL,
    key          TEXT   NOT NULL,
    value        BLOB,
    content_type TEXT   NOT NULL,
    version      BIGINT NOT NULL,
    change       TEXT   NOT NULL,
    updated_by   TEXT   NOT NULL,
    updated_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    PRIMARY KEY (namespace, key)
);

CREATE INDEX hub_state_expiry ON hub_state (expires_at) WHERE change = 'set' AND expires_at IS NOT NULL;
