//! The event bus end to end: the real `chorus dev`, a chain of three
//! `test-handler` processes (`a`, `b` after `a`, `c` after `b`) over real
//! sockets, and handlers killed with SIGKILL and restarted while the events
//! flow. Every handler must get every event, first in sequence order, never
//! before the handler it is after has acked it.

use std::{
    collections::BTreeSet,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use chorus_proto::eventbus::{
    GetHandlerRequest, HandlerStats, NewEvent, PublishBatchRequest, event_bus_client::EventBusClient,
};
use chorus_tests::{
    ReadyProcess, Sandbox, TestHandlerBuilder,
    handler::{Handled, read_log},
    test_handler,
};
use tokio::time::Instant;
use tonic::transport::Channel;

type Client = EventBusClient<Channel>;

const NS: &str = "e2e";
const EVENTS: u64 = 10_000;
const BATCH: u64 = 100;
/// Fewest handler processes killed while the events flow.
const MIN_KILLS: usize = 5;
/// Pauses before the kills, in turn, in milliseconds.
const PAUSES_MS: [u64; 5] = [300, 650, 450, 700, 350];
/// Which handler of the chain is killed, in turn: mostly `b`, in the middle.
const VICTIMS: [usize; 3] = [1, 1, 0];
/// Deliveries each handler holds at once: larger batches mean fewer claims
/// and acks for the bus (and more duplicates after a crash).
const MAX_IN_FLIGHT: u32 = 250;
/// How often the handlers' progress is read while waiting.
const POLL: Duration = Duration::from_millis(250);
/// How long the handlers may take to finish every event once publishing
/// has ended: 30,000 deliveries, in a debug build, on a small machine.
const FINISH_DEADLINE: Duration = Duration::from_secs(120);

/// Publishes events 1..=EVENTS (the payload is the number, which is also the
/// sequence the bus must assign), then sets `published`.
async fn publish_all(client: &mut Client, published: &AtomicBool) {
    for first in (1..=EVENTS).step_by(BATCH as usize) {
        let numbers = first..first + BATCH;
        let event = |n: u64| NewEvent {
            r#type: "test.event".to_owned(),
            source: "eventbus-e2e".to_owned(),
            payload: n.to_string().into_bytes(),
            ..NewEvent::default()
        };
        let request = PublishBatchRequest { namespace: NS.to_owned(), events: numbers.clone().map(event).collect() };
        let response = client.publish_batch(request).await.expect("publish a batch").into_inner();
        let sequences: Vec<u64> = response.results.iter().map(|result| result.sequence).collect();
        assert_eq!(sequences, numbers.collect::<Vec<_>>(), "the events' sequences");
    }
    published.store(true, Ordering::Release);
}

/// Kills a handler process (SIGKILL) and starts it again, in turn, until
/// everything is published and at least [`MIN_KILLS`] were killed; returns
/// the kills per handler of the chain.
async fn crash_handlers(
    chain: &[TestHandlerBuilder],
    running: &mut [ReadyProcess],
    published: &AtomicBool,
) -> Vec<usize> {
    let mut kills = vec![0; chain.len()];
    let mut round = 0;
    while !published.load(Ordering::Acquire) || kills.iter().sum::<usize>() < MIN_KILLS {
        tokio::time::sleep(Duration::from_millis(PAUSES_MS[round % PAUSES_MS.len()])).await;
        let victim = VICTIMS[round % VICTIMS.len()];
        running[victim].kill().await;
        running[victim] = chain[victim].start().await;
        kills[victim] += 1;
        round += 1;
    }
    kills
}

async fn stats(client: &mut Client, handler: &str) -> HandlerStats {
    let request = GetHandlerRequest { namespace: NS.to_owned(), name: handler.to_owned() };
    let handler = client.get_handler(request).await.expect("get handler").into_inner();
    handler.stats.expect("a handler has stats")
}

/// Waits until every handler has finished every event, failing when one of
/// their processes exits or [`FINISH_DEADLINE`] passes.
async fn wait_until_finished(client: &mut Client, chain: &[TestHandlerBuilder], running: &mut [ReadyProcess]) {
    let deadline = Instant::now() + FINISH_DEADLINE;
    loop {
        let mut all = Vec::new();
        for handler in chain {
            all.push((handler.handler(), stats(client, handler.handler()).await));
        }
        if all.iter().all(|(_, stats)| stats.finished_through_sequence == EVENTS && stats.lag == 0) {
            return;
        }
        for process in running.iter_mut() {
            process.assert_running().await;
        }
        if Instant::now() >= deadline {
            panic!("the handlers did not finish {EVENTS} events within {FINISH_DEADLINE:?}: {all:#?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Checks one handler's log: every event, first received in sequence
/// order, never before its dependency acked it. Returns how many lines
/// repeat a sequence already logged.
fn check_log(handler: &str, log: &[Handled]) -> usize {
    let violations: Vec<u64> = log.iter().filter(|handled| !handled.in_order).map(|handled| handled.sequence).collect();
    assert!(
        violations.is_empty(),
        "{handler} received {} events before its dependency acked them; the first: {:?}",
        violations.len(),
        &violations[..violations.len().min(20)]
    );
    let mut seen = BTreeSet::new();
    let mut previous = 0;
    for handled in log {
        if seen.insert(handled.sequence) {
            assert!(handled.sequence > previous, "{handler} first received {} after {previous}", handled.sequence);
            previous = handled.sequence;
        }
    }
    let missing: Vec<u64> = (1..=EVENTS).filter(|sequence| !seen.contains(sequence)).take(20).collect();
    assert!(missing.is_empty(), "{handler} never logged these events (the first 20): {missing:?}");
    assert_eq!(seen.last(), Some(&EVENTS), "{handler} logged events that were never published");
    log.len() - seen.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_crashing_handlers_gets_every_event_in_order() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let chain = [
        test_handler!(sandbox, server.url(), NS, "a").max_in_flight(MAX_IN_FLIGHT),
        test_handler!(sandbox, server.url(), NS, "b").after(&["a"]).max_in_flight(MAX_IN_FLIGHT),
        test_handler!(sandbox, server.url(), NS, "c").after(&["b"]).max_in_flight(MAX_IN_FLIGHT),
    ];
    // One after the other: an `after` naming a handler not yet registered
    // holds nothing.
    let mut running = Vec::new();
    for handler in &chain {
        running.push(handler.start().await);
    }
    let mut client = server.event_bus().await;

    let started = Instant::now();
    let published = AtomicBool::new(false);
    let mut publisher = client.clone();
    let ((), kills) =
        tokio::join!(publish_all(&mut publisher, &published), crash_handlers(&chain, &mut running, &published));
    let killed = started.elapsed();
    wait_until_finished(&mut client, &chain, &mut running).await;
    let finished = started.elapsed();

    let mut duplicates = Vec::new();
    for handler in &chain {
        let log = read_log(&handler.log_path());
        duplicates.push(format!("{}={}", handler.handler(), check_log(handler.handler(), &log)));
    }
    let kills: Vec<String> =
        chain.iter().zip(&kills).map(|(handler, n)| format!("{}={n}", handler.handler())).collect();
    eprintln!(
        "eventbus e2e: {EVENTS} events; duplicates {}; kills {}; published and killed in {killed:.1?}, \
         all finished after {finished:.1?}",
        duplicates.join(" "),
        kills.join(" ")
    );
}
