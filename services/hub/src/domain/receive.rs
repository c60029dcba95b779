//! Which of an agent's queued messages a receive takes.

use super::model::{InboxFilter, Message};

/// The outcome of looking at an inbox for a receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Take these (oldest first).
    Take(Vec<i64>),
    /// `require_all` and these senders have sent nothing matching yet.
    Missing(Vec<String>),
}

/// Picks up to `max` messages matching `filter` from `available` (oldest
/// first). With `require_all`, every sender in the filter must have a match,
/// else nothing is taken; the oldest match of each sender comes first.
pub fn select(available: &[Message], filter: &InboxFilter, require_all: bool, max: usize) -> Selection {
    let matching: Vec<&Message> = available.iter().filter(|message| filter.matches(message)).collect();
    if !require_all {
        return Selection::Take(matching.iter().take(max).map(|message| message.sequence).collect());
    }
    let missing: Vec<String> = filter
        .senders
        .iter()
        .filter(|sender| !matching.iter().any(|message| &message.sender == *sender))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Selection::Missing(missing);
    }
    let mut taken: Vec<i64> = filter
        .senders
        .iter()
        .filter_map(|sender| matching.iter().find(|message| &message.sender == sender).map(|m| m.sequence))
        .collect();
    taken.sort_unstable();
    taken.dedup();
    for message in &matching {
        if taken.len() >= max.max(filter.senders.len()) {
            break;
        }
        if !taken.contains(&message.sequence) {
            taken.push(message.sequence);
        }
    }
    taken.sort_unstable();
    Selection::Take(taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Content, MessageKind};

    fn message(sequence: i64, sender: &str, message_type: &str) -> Message {
        Message {
            id: format!("m{sequence}"),
            sequence,
            kind: MessageKind::Direct,
            sender: sender.into(),
            recipient: "me".into(),
            topic: None,
            content: Content { message_type: message_type.into(), payload: vec![], content_type: String::new() },
            correlation_id: None,
            sent_at: 0,
            expires_at: 0,
            attempt: 0,
            ack_deadline: None,
        }
    }

    fn filter(senders: &[&str], types: &[&str]) -> InboxFilter {
        InboxFilter {
            senders: senders.iter().map(|s| (*s).to_owned()).collect(),
            types: types.iter().map(|t| (*t).to_owned()).collect(),
            ..InboxFilter::default()
        }
    }

    #[test]
    fn filters_by_sender_and_type_oldest_first() {
        let inbox = [message(1, "a", "x"), message(2, "b", "y"), message(3, "a", "y"), message(4, "c", "y")];
        assert_eq!(select(&inbox, &filter(&["a", "b"], &["y"]), false, 10), Selection::Take(vec![2, 3]));
        assert_eq!(select(&inbox, &filter(&[], &[]), false, 2), Selection::Take(vec![1, 2]));
    }

    #[test]
    fn require_all_takes_nothing_until_every_sender_has_sent() {
        let inbox = [message(1, "a", "x"), message(2, "a", "x")];
        assert_eq!(select(&inbox, &filter(&["a", "b"], &[]), true, 10), Selection::Missing(vec!["b".into()]));
        let inbox = [message(1, "a", "x"), message(2, "a", "x"), message(3, "b", "x"), message(4, "c", "x")];
        // The oldest from each sender first, then more up to the limit.
        assert_eq!(select(&inbox, &filter(&["a", "b"], &[]), true, 2), Selection::Take(vec![1, 3]));
        assert_eq!(select(&inbox, &filter(&["a", "b"], &[]), true, 10), Selection::Take(vec![1, 2, 3]));
    }
}
