//! A message step's fields: where it goes (a hub topic or agent, a webhook,
//! a bus event), and what it says.

use super::{ExprKind, Fields, Node, Scope, position, top::Placed};
use crate::domain::{MessageStep, MessageTarget, Severity, Trigger};

impl Scope<'_, '_, '_, '_> {
    pub(super) fn message(&mut self, body: &Node<'_>) -> Option<MessageStep> {
        const FIELDS: &[&str] = &["topic", "to", "webhook", "event", "text", "data", "type", "retry"];
        let fields = self.reader.mapping(body, self.field, FIELDS)?;
        let to = match self.exactly_one(&fields, &["topic", "to", "webhook", "event"]) {
            Some("topic") => self.literal(&fields, "topic").map(MessageTarget::Topic),
            Some("to") => self.template(&fields, "to", ExprKind::Template).map(MessageTarget::Agent),
            Some("webhook") => self.webhook(&fields),
            Some(_) => self.event(&fields),
            None => None,
        };
        if !fields.has("data") {
            self.reader.required(&fields, self.field, "text", "the message text (a template), or its `data`");
        }
        let text = fields.has("text").then(|| self.template(&fields, "text", ExprKind::Template));
        let data = self.templated_value(&fields, "data");
        let message_type = self.literal(&fields, "type");
        if let (Some(MessageTarget::Event(_)), Some(node)) = (&to, fields.get("type")) {
            let message = "`type` is ignored: an event's type is its `event`".to_owned();
            self.reader.report(Severity::Warning, Some(node), &self.path("type"), "unused_field", message);
        }
        let retry = self.retry(&fields);
        let text = match text {
            Some(None) => return None,
            Some(text) => text,
            None => None,
        };
        Some(MessageStep { to: to?, text, data, message_type, retry })
    }

    fn webhook(&mut self, fields: &Fields<'_, '_>) -> Option<MessageTarget> {
        let url = self.literal(fields, "webhook")?;
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            let node = fields.get("webhook");
            self.reader.error(
                node,
                &self.path("webhook"),
                "bad_url",
                format!("expected an http(s) URL, found `{url}`"),
            );
            return None;
        }
        let (line, column) = fields.get("webhook").map(position).unwrap_or_default();
        self.walk.webhooks.push((url.clone(), Placed { field: self.path("webhook"), line, column }));
        Some(MessageTarget::Webhook(url))
    }

    /// A bus event's type: one the bus takes, and not one that starts this
    /// workflow, each of whose runs would then start another.
    fn event(&mut self, fields: &Fields<'_, '_>) -> Option<MessageTarget> {
        let event_type = self.literal(fields, "event")?;
        let (node, field) = (fields.get("event"), self.path("event"));
        if let Err(violation) = chorus_runtime::validate::event_type(&field, &event_type, false) {
            self.reader.error(node, &field, "bad_event_type", format!("`{event_type}` {}", violation.reason));
            return None;
        }
        if let Some(Trigger::Event { event_type: listened, filter, condition }) = &self.walk.trigger
            && chorus_runtime::glob::matches(listened, &event_type)
        {
            let message = format!(
                "this workflow's trigger listens for `{listened}`, so each run that publishes `{event_type}` \
                 starts another"
            );
            if filter.is_empty() && condition.is_none() {
                self.reader.error(node, &field, "self_trigger", message);
                return None;
            }
            let message = format!("{message}, unless the trigger's filter or condition tells them apart");
            self.reader.report(Severity::Warning, node, &field, "self_trigger", message);
        }
        Some(MessageTarget::Event(event_type))
    }
}
