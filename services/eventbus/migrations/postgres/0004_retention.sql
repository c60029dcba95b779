-- Retention (`eventbus.retention_ms`): events are deleted, with their
-- deliveries, once older than that and finished by every handler. The
-- purge looks for them in the order they were published.
CREATE INDEX eventbus_events_published ON eventbus_events (published_at, namespace, sequence);
