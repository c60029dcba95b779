//! Inbox streams fed straight from sends (hand-offs): order, the in-flight
//! limit, filters, leases, and what a stream that goes away leaves behind.

use std::{collections::BTreeMap, time::Duration};

use chorus_hub::{
    domain::{Audience, HandOff, InboxFilter, Lease, Message, MessageKind},
    error::HubError,
    repository::{HubRepository, Take, Taken, sql::SqlHubRepository},
    service::Inbox,
};
use chorus_runtime::{storage::Backend, time::now_micros};
use futures_util::{Stream, StreamExt as _};

use crate::harness::{Harness, NS, conformance, outgoing, types_of};

conformance!(
    a_stream_gets_every_message_once_in_order_within_its_limit,
    a_stream_gets_only_what_its_filter_takes,
    a_message_handed_to_a_stream_that_went_away_comes_back,
    a_new_stream_of_a_consumer_replaces_its_previous_one,
    a_take_by_a_replaced_stream_leases_nothing,
    a_send_hands_nothing_to_a_replaced_stream,
);

fn inbox(max_in_flight: u32, filter: InboxFilter) -> Inbox {
    Inbox {
        namespace: NS.into(),
        agent_id: "b".into(),
        consumer_id: "b-1".into(),
        filter,
        ack_timeout: Duration::from_secs(30),
        max_in_flight,
        after: None,
    }
}

type Messages = std::pin::Pin<Box<dyn Stream<Item = chorus_hub::error::Result<Message>> + Send>>;

async fn next(stream: &mut Messages) -> Message {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("a message within 5 s")
        .expect("the stream goes on")
        .expect("a message, not an error")
}

async fn quiet(stream: &mut Messages) {
    if let Ok(extra) = tokio::time::timeout(Duration::from_millis(400), stream.next()).await {
        panic!("nothing more was due, got {extra:?}");
    }
}

async fn open(h: &Harness, inbox: Inbox) -> Messages {
    Box::pin(h.hub.stream_inbox(inbox).await.expect("stream"))
}

async fn a_stream_gets_every_message_once_in_order_within_its_limit(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let mut stream = open(&h, inbox(2, InboxFilter::default())).await;
    // Caught up (nothing waiting): what comes next is handed over, leased.
    quiet(&mut stream).await;
    let first = h.direct("a", "b", "m0").await;
    let m0 = next(&mut stream).await;
    assert_eq!((m0.id.as_str(), m0.attempt), (first.message_id.as_str(), 1));
    assert!(m0.ack_deadline.is_some_and(|until| until > m0.sent_at), "{m0:?}");
    let other = h.receive("b", InboxFilter::default(), false, Duration::ZERO).await;
    assert!(other.messages.is_empty(), "leased to the stream: {:?}", types_of(&other.messages));
    // Sent one after another past the limit of 2: the rest waits for acks and
    // comes in order, nothing overtaking what waits in the inbox.
    for n in 1..5 {
        h.direct("a", "b", &format!("m{n}")).await;
    }
    let mut seen = vec![m0, next(&mut stream).await];
    quiet(&mut stream).await;
    while seen.len() < 5 {
        let oldest = seen[seen.len() - 2].id.clone();
        h.hub.ack(NS, "b", &[oldest]).await.unwrap();
        seen.push(next(&mut stream).await);
    }
    assert_eq!(types_of(&seen), ["m0", "m1", "m2", "m3", "m4"]);
    let acked: Vec<String> = seen[3..].iter().map(|m| m.id.clone()).collect();
    h.hub.ack(NS, "b", &acked).await.unwrap();
    // Caught up again: handed over at once.
    h.direct("a", "b", "m5").await;
    assert_eq!(next(&mut stream).await.content.message_type, "m5");
    quiet(&mut stream).await;
    assert!(h.drain("b").await.is_empty());
}

async fn a_stream_gets_only_what_its_filter_takes(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let wanted = InboxFilter { types: vec!["wanted".into()], ..InboxFilter::default() };
    let mut stream = open(&h, inbox(10, wanted)).await;
    quiet(&mut stream).await;
    h.direct("a", "b", "other").await;
    h.direct("a", "b", "wanted").await;
    assert_eq!(next(&mut stream).await.content.message_type, "wanted");
    quiet(&mut stream).await;
    assert_eq!(types_of(&h.drain("b").await), ["other"], "left in the inbox for others");
}

async fn a_message_handed_to_a_stream_that_went_away_comes_back(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let mut stream = open(&h, inbox(10, InboxFilter::default())).await;
    quiet(&mut stream).await;
    let sent = h.direct("a", "b", "m0").await;
    assert_eq!(next(&mut stream).await.id, sent.message_id);
    drop(stream);
    // Dropped unacked: the consumer's next stream gets it again.
    let mut stream = open(&h, inbox(10, InboxFilter::default())).await;
    let again = next(&mut stream).await;
    assert_eq!((again.id.as_str(), again.attempt), (sent.message_id.as_str(), 2));
    // And a stream gone before the hand-off reached it leaves the message
    // to whoever takes the inbox once the lease runs out.
    drop(stream);
    let short = Inbox {
        consumer_id: "b-2".into(),
        ack_timeout: Duration::from_millis(300),
        ..inbox(10, InboxFilter::default())
    };
    let mut stream = open(&h, short).await;
    quiet(&mut stream).await;
    let sent = h.direct("a", "b", "m1").await;
    assert_eq!(next(&mut stream).await.id, sent.message_id);
    drop(stream);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taken = h.receive("b", InboxFilter::default(), false, Duration::from_secs(2)).await.messages;
    assert!(taken.iter().any(|m| m.id == sent.message_id), "{:?}", types_of(&taken));
}

/// A consumer that opens a stream while its previous one still runs (a
/// process restarted, or reconnected, before the hub saw the old connection
/// go) gets every message on the new one: the old one takes no hand-off, and
/// ends with `StreamSuperseded` at its next take, having taken nothing.
async fn a_new_stream_of_a_consumer_replaces_its_previous_one(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let mut old = open(&h, inbox(10, InboxFilter::default())).await;
    quiet(&mut old).await;
    let first = stream_number(&h).await;
    let mut new = open(&h, inbox(10, InboxFilter::default())).await;
    // Sent as soon as the new stream is open, most likely before the old
    // one's next take (it polls every 200 ms here) would end it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while stream_number(&h).await == first {
        assert!(tokio::time::Instant::now() < deadline, "the new stream opens");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for message_type in ["m0", "m1"] {
        let sent = h.direct("a", "b", message_type).await;
        assert_eq!(next(&mut new).await.id, sent.message_id, "the new stream gets {message_type}");
    }
    let ended = tokio::time::timeout(Duration::from_secs(5), old.next()).await.expect("the old stream ends");
    assert!(matches!(ended, Some(Err(HubError::StreamSuperseded(_)))), "{ended:?}");
    assert!(old.next().await.is_none());
    quiet(&mut new).await;
}

async fn stream_number(h: &Harness) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT stream FROM hub_consumers WHERE namespace = $1 AND agent_id = 'b' AND consumer_id = 'b-1'",
    )
    .bind(NS)
    .fetch_optional(&mut *h.db.acquire().await.expect("a connection"))
    .await
    .expect("the consumer's stream")
}

/// A take of `b`'s inbox by its consumer's stream numbered `stream`.
fn take_for(lease: &Lease, stream: i64, now: i64) -> Take {
    Take {
        namespace: NS.into(),
        agent_id: "b".into(),
        filter: InboxFilter::default(),
        require_all: false,
        max: 10,
        max_bytes: usize::MAX,
        lease: lease.clone(),
        hold_limit: Some(10),
        stream: Some(stream),
        now,
    }
}

/// The types of the messages a take leased.
fn taken(outcome: chorus_hub::error::Result<Taken>) -> Vec<String> {
    match outcome.expect("a take") {
        Taken::Messages(messages) => types_of(&messages).into_iter().map(str::to_owned).collect(),
        Taken::Missing(senders) => panic!("missing {senders:?}"),
    }
}

/// Agents `a` and `b`, and two streams `b`'s consumer `b-1` opened in turn
/// through the repository: `first`, replaced by `second`.
struct Replaced {
    repository: SqlHubRepository,
    now: i64,
    lease: Lease,
    first: i64,
    second: i64,
}

async fn replaced_stream(h: &Harness) -> Replaced {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let repository = SqlHubRepository::new(h.db.clone());
    let now = now_micros();
    let lease = Lease { consumer_id: "b-1".into(), until: now + 60_000_000 };
    let first = repository.open_stream(NS, "b", &lease, None, now).await.expect("open").stream;
    let second = repository.open_stream(NS, "b", &lease, None, now).await.expect("open again").stream;
    Replaced { repository, now, lease, first, second }
}

/// A send handed to a stream its consumer has since replaced (in another
/// process: this one's streams cannot know) queues its copy unleased, for
/// the new stream to take; handed to the latest stream, it goes leased.
async fn a_send_hands_nothing_to_a_replaced_stream(h: Harness) {
    let Replaced { repository, now, lease, first, second } = replaced_stream(&h).await;
    let send = |text: &str| outgoing("a", Audience::Agent("b".into()), MessageKind::Direct, text);
    let to = |stream: i64| BTreeMap::from([("b".to_owned(), HandOff { lease: lease.clone(), stream })]);
    let stale = repository.send(&send("m0"), &to(first), 100, now).await.expect("a send");
    assert_eq!((stale.recipients, stale.handed_off), (vec!["b".to_owned()], Vec::new()), "queued, not leased");
    let current = repository.send(&send("m1"), &to(second), 100, now).await.expect("a send");
    assert_eq!(current.handed_off, ["b"]);
    assert_eq!(taken(repository.take(&take_for(&lease, second, now)).await), ["m0"], "m1 is the stream's already");
}

/// The repository's fence: a take under a stream number the consumer has
/// since replaced fails and leases nothing; closing a replaced stream
/// changes nothing, closing the open one lifts the fence. On PostgreSQL, a
/// take that waited for a stream being opened sees the new number.
async fn a_take_by_a_replaced_stream_leases_nothing(h: Harness) {
    let Replaced { repository, now, lease, first, second } = replaced_stream(&h).await;
    let take = |stream: i64| take_for(&lease, stream, now);
    h.direct("a", "b", "m0").await;
    let stale = repository.take(&take(first)).await;
    assert!(matches!(stale, Err(HubError::StreamSuperseded(_))), "{stale:?}");
    assert_eq!(taken(repository.take(&take(second)).await), ["m0"], "the replaced stream leased nothing");
    repository.close_stream(NS, "b", "b-1", first).await.expect("close the replaced one");
    assert!(repository.take(&take(first)).await.is_err(), "still replaced");
    if h.db.backend() == Backend::Postgres {
        h.direct("a", "b", "m1").await;
        // A stream being opened holds the row's lock until it commits.
        let mut opening = h.db.begin().await.expect("begin");
        sqlx::query("UPDATE hub_consumers SET stream = 42 WHERE namespace = $1 AND agent_id = 'b'")
            .bind(NS)
            .execute(&mut *opening)
            .await
            .expect("replace the number");
        let waiting = {
            let (repository, take) = (repository.clone(), take(second));
            tokio::spawn(async move { repository.take(&take).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "the take waits for the opening");
        opening.commit().await.expect("commit");
        let late = waiting.await.expect("join");
        assert!(matches!(late, Err(HubError::StreamSuperseded(_))), "{late:?}");
        assert_eq!(taken(repository.take(&take(42)).await), ["m1"], "the late take leased nothing");
    }
    repository
        .close_stream(NS, "b", "b-1", if h.db.backend() == Backend::Postgres { 42 } else { second })
        .await
        .expect("close");
    assert_eq!(taken(repository.take(&take(first)).await), Vec::<String>::new(), "no open stream: no fence");
}
