-- Whom a message went to, as its idempotency key's retries are compared:
-- `agent:<id>`, `everyone:<agent type, or nothing>` or `topic:<topic>`.
-- Another recipient under a used key is another message, refused; without
-- this, a send to carol under the key of one to bob was answered as its
-- duplicate and reached no one. Empty on messages sent before it.
ALTER TABLE hub_messages ADD COLUMN audience TEXT;
