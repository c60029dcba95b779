//! The bus's records: events, handlers, deliveries.

use std::{collections::BTreeMap, fmt, str::FromStr, time::Duration};

use super::pattern::{EventType, Pattern};

/// An event to append; the bus assigns its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub event_type: EventType,
    pub source: String,
    pub subject: String,
    pub payload: Vec<u8>,
    pub content_type: String,
    pub attributes: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    /// When it happened; `None` means when it is published.
    pub time: Option<i64>,
}

/// An event in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub namespace: String,
    pub sequence: i64,
    pub event_type: String,
    pub source: String,
    pub subject: String,
    pub payload: Vec<u8>,
    pub content_type: String,
    pub attributes: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    pub time: i64,
    pub published_at: i64,
}

/// The outcome of appending one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub sequence: i64,
    /// The idempotency key matched an event already in the log.
    pub duplicate: bool,
    pub published_at: i64,
}

/// A page of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPage {
    pub events: Vec<Event>,
    pub next_after: i64,
    pub head: i64,
}

/// What [`crate::repository::EventRepository::read_events`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    pub namespace: String,
    pub after: i64,
    /// Empty: every type.
    pub types: Vec<Pattern>,
    pub limit: u32,
}

/// What a handler's failure means for the handlers after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Dependents' deliveries of the failed event are skipped.
    Fail,
    /// Dependents proceed as if the handler had succeeded.
    Ignore,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Ignore => "ignore",
        }
    }
}

impl FromStr for FailurePolicy {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "fail" => Ok(Self::Fail),
            "ignore" => Ok(Self::Ignore),
            other => Err(format!("unknown failure policy {other:?}")),
        }
    }
}

/// Retries of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts before dead-lettering, the first included; at least 1.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub visibility_timeout: Duration,
}

impl RetryPolicy {
    /// The delay after failed attempt number `attempt` (1-based): the initial
    /// backoff doubled for each attempt after the first, capped.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        self.initial_backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// A handler as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handler {
    pub namespace: String,
    pub name: String,
    pub event_types: Vec<Pattern>,
    pub after: Vec<String>,
    pub failure_policy: FailurePolicy,
    pub retry: RetryPolicy,
    pub start_sequence: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Handler {
    pub fn takes(&self, event_type: &str) -> bool {
        self.event_types.iter().any(|pattern| pattern.matches(event_type))
    }
}

/// A registration: a new handler, or a new definition of an existing one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerSpec {
    pub namespace: String,
    pub name: String,
    pub event_types: Vec<Pattern>,
    pub after: Vec<String>,
    pub failure_policy: FailurePolicy,
    pub retry: RetryPolicy,
    /// For a new handler: take events after this sequence (0: the whole
    /// log); `None`: only events published after the registration.
    pub start_after: Option<i64>,
}

/// A handler with what the bus knows of its progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerView {
    pub handler: Handler,
    /// Names in `after` that are not registered.
    pub unresolved_after: Vec<String>,
    pub stats: HandlerStats,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandlerStats {
    pub finished_through: i64,
    pub lag: i64,
    pub pending: u64,
    pub in_flight: u64,
    pub failed: u64,
    pub dead_lettered: u64,
    pub consumers: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeliveryState {
    Pending,
    InFlight,
    Acked,
    Failed,
    Skipped,
    DeadLettered,
}

impl DeliveryState {
    pub const ALL: [Self; 6] =
        [Self::Pending, Self::InFlight, Self::Acked, Self::Failed, Self::Skipped, Self::DeadLettered];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InFlight => "in_flight",
            Self::Acked => "acked",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::DeadLettered => "dead_lettered",
        }
    }

    /// Acked, skipped or dead-lettered: nothing more happens on its own.
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Acked | Self::Skipped | Self::DeadLettered)
    }
}

impl FromStr for DeliveryState {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|state| state.as_str() == value).ok_or_else(|| format!("unknown state {value:?}"))
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A delivery's identity: one event for one handler. Written
/// `<sequence>:<handler>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeliveryId {
    pub sequence: i64,
    pub handler: String,
}

impl fmt::Display for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.sequence, self.handler)
    }
}

impl FromStr for DeliveryId {
    type Err = ();

    fn from_str(value: &str) -> Result<Self, ()> {
        let (sequence, handler) = value.split_once(':').ok_or(())?;
        let sequence: i64 = sequence.parse().map_err(|_| ())?;
        if sequence < 1 || handler.is_empty() {
            return Err(());
        }
        Ok(Self { sequence, handler: handler.to_owned() })
    }
}

/// Why a delivery was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipReason {
    /// The FAIL-policy handler whose failure caused the skip.
    pub handler: String,
    pub message: String,
}

/// One event for one handler, across all its attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub namespace: String,
    pub id: DeliveryId,
    pub state: DeliveryState,
    pub attempt: u32,
    pub consumer_id: Option<String>,
    pub visible_until: Option<i64>,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub skip_reason: Option<SkipReason>,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
    pub event: Option<Event>,
}

/// What a consumer asks of [`crate::repository::EventRepository::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    pub namespace: String,
    pub handler: String,
    pub consumer_id: String,
    /// The consumer's stream claiming, as [`OpenedStream`] numbered it: a
    /// claim by a stream the consumer has since replaced fails.
    pub stream: i64,
    /// Most deliveries the consumer may hold at once.
    pub max_in_flight: u32,
    pub now: i64,
}

/// A consumer's new stream: its number, and the deliveries still leased to
/// the consumer that it sends again first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenedStream {
    pub stream: i64,
    pub resent: Vec<Delivery>,
}

/// Deliveries leased by a claim; when the handler next has work due without
/// any further write (a retry falling due); the handlers whose progress
/// can make the next delivery in its line ready (the dependencies it waits
/// for, which may be further up than those it names: through handlers that
/// do not take the event);
/// and how many deliveries whose last lease had run out it dead-lettered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    pub deliveries: Vec<Delivery>,
    pub next_due: Option<i64>,
    pub waits_on: Vec<String>,
    pub dead_lettered: u64,
}

/// What settling leases that ran out did: the namespaces it touched, and
/// how many deliveries it dead-lettered (their attempts spent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expired {
    pub namespaces: Vec<String>,
    pub dead_lettered: u64,
}

/// A failed attempt, as a consumer reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    pub error: String,
    /// Instead of the retry policy's backoff.
    pub retry_delay: Option<Duration>,
    pub dead_letter: bool,
    /// The attempt being failed; `None`: the current one.
    pub attempt: Option<u32>,
}

/// What [`crate::repository::EventRepository::list_deliveries`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryQuery {
    pub namespace: String,
    pub handler: Option<String>,
    pub sequence: Option<i64>,
    /// Empty: every state.
    pub states: Vec<DeliveryState>,
    pub include_events: bool,
    pub after: Option<DeliveryId>,
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryPage {
    pub deliveries: Vec<Delivery>,
    /// The last delivery returned, when more may follow.
    pub next: Option<DeliveryId>,
}

/// The event a purge examined last: the next batch starts after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeCursor {
    pub published_at: i64,
    pub namespace: String,
    pub sequence: i64,
}

/// One batch of a purge: the events it deleted, and where the next batch
/// starts (`None`: no event old enough is left to examine).
#[derive(Debug, Clone, Default)]
pub struct Purged {
    pub events: u64,
    pub next: Option<PurgeCursor>,
}

/// What a dead-letter replay changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    pub replayed: u64,
    /// Dependents' deliveries moved from skipped back to pending.
    pub rearmed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_ids_round_trip_and_reject_garbage() {
        let id = DeliveryId { sequence: 42, handler: "audit-logger".into() };
        assert_eq!(id.to_string(), "42:audit-logger");
        assert_eq!("42:audit-logger".parse::<DeliveryId>(), Ok(id));
        for bad in ["", "42", ":a", "x:a", "0:a", "-1:a", "42:"] {
            assert!(bad.parse::<DeliveryId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_ceiling() {
        let retry = RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            visibility_timeout: Duration::from_secs(1),
        };
        assert_eq!(retry.backoff(1), Duration::from_millis(100));
        assert_eq!(retry.backoff(2), Duration::from_millis(200));
        assert_eq!(retry.backoff(3), Duration::from_millis(350));
        assert_eq!(retry.backoff(100), Duration::from_millis(350));
    }
}
