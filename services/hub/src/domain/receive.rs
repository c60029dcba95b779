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

/// What a message costs in a receive's answer besides its payload: its ids,
/// names and fixed fields, each id at most 200 bytes.
pub const MESSAGE_OVERHEAD_BYTES: usize = 2048;

impl Message {
    /// At least the bytes this message takes in a receive's answer.
    pub fn answer_bytes(&self) -> usize {
        self.content.payload.len() + MESSAGE_OVERHEAD_BYTES
    }
}

/// Picks up to `max` messages matching `filter` from `available` (oldest
/// first), together within `max_bytes` (the first always, however large).
/// With `require_all`, every sender in the filter must have a match, else
/// nothing is taken; the oldest match of each sender comes first, all of
/// them whatever their size, and more only within the budget.
pub fn select(
    available: &[Message],
    filter: &InboxFilter,
    require_all: bool,
    max: usize,
    max_bytes: usize,
) -> Selection {
    let matching: Vec<&Message> = available.iter().filter(|message| filter.matches(message)).collect();
    if !require_all {
        let mut budget = Budget::new(max_bytes);
        let taken = matching.iter().take(max).take_while(|message| budget.fits(message)).map(|m| m.sequence);
        return Selection::Take(taken.collect());
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
    let mut firsts: Vec<&Message> = filter
        .senders
        .iter()
        .filter_map(|sender| matching.iter().find(|message| &message.sender == sender).copied())
        .collect();
    firsts.sort_unstable_by_key(|message| message.sequence);
    firsts.dedup_by_key(|message| message.sequence);
    let mut budget = Budget::new(max_bytes);
    firsts.iter().for_each(|message| budget.charge(message));
    let mut taken: Vec<i64> = firsts.iter().map(|message| message.sequence).collect();
    for message in &matching {
        if taken.len() >= max.max(filter.senders.len()) {
            break;
        }
        if !taken.contains(&message.sequence) {
            if !budget.fits(message) {
                break;
            }
            taken.push(message.sequence);
        }
    }
    taken.sort_unstable();
    Selection::Take(taken)
}

/// The bytes left for a receive's answer.
struct Budget {
    left: usize,
    first: bool,
}

impl Budget {
    fn new(max_bytes: usize) -> Self {
        Self { left: max_bytes, first: true }
    }

    /// Charges `message` when it fits, or when it is the first.
    fn fits(&mut self, message: &Message) -> bool {
        if message.answer_bytes() > self.left && !self.first {
            return false;
        }
        self.charge(message);
        true
    }

    /// Charges `message` whatever its size.
    fn charge(&mut self, message: &Message) {
        self.first = false;
        self.left = self.left.saturating_sub(message.answer_bytes());
    }
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

    const ANY: usize = usize::MAX;

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
        assert_eq!(select(&inbox, &filter(&["a", "b"], &["y"]), false, 10, ANY), Selection::Take(vec![2, 3]));
        assert_eq!(select(&inbox, &filter(&[], &[]), false, 2, ANY), Selection::Take(vec![1, 2]));
    }

    #[test]
    fn require_all_takes_nothing_until_every_sender_has_sent() {
        let inbox = [message(1, "a", "x"), message(2, "a", "x")];
        assert_eq!(select(&inbox, &filter(&["a", "b"], &[]), true, 10, ANY), Selection::Missing(vec!["b".into()]));
        let inbox = [message(1, "a", "x"), message(2, "a", "x"), message(3, "b", "x"), message(4, "c", "x")];
        // The oldest from each sender first, then more up to the limit.
        assert_eq!(select(&inbox, &filter(&["a", "b"], &[]), true, 2, ANY), Selection::Take(vec![1, 3]));
        assert_eq!(select(&inbox, &filter(&["a", "b"], &[]), true, 10, ANY), Selection::Take(vec![1, 2, 3]));
    }

    #[test]
    fn a_take_stays_within_the_bytes_of_one_answer_taking_at_least_one() {
        let sized = |sequence, sender, bytes: usize| Message {
            content: Content { payload: vec![0; bytes], ..message(sequence, sender, "x").content },
            ..message(sequence, sender, "x")
        };
        let inbox = [sized(1, "a", 3_000), sized(2, "b", 3_000), sized(3, "a", 100), sized(4, "c", 100)];
        let room_for_two = 2 * (3_000 + MESSAGE_OVERHEAD_BYTES) + 10;
        assert_eq!(select(&inbox, &filter(&[], &[]), false, 10, room_for_two), Selection::Take(vec![1, 2]));
        assert_eq!(select(&inbox, &filter(&[], &[]), false, 10, 1), Selection::Take(vec![1]), "the first goes alone");
        // Each sender's first is taken whatever its size; more only within the budget.
        assert_eq!(select(&inbox, &filter(&["a", "b"], &[]), true, 10, 1), Selection::Take(vec![1, 2]));
        assert_eq!(
            select(&inbox, &filter(&["a", "b"], &[]), true, 10, room_for_two + MESSAGE_OVERHEAD_BYTES + 100),
            Selection::Take(vec![1, 2, 3])
        );
    }
}
