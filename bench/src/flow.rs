//! What the event-bus run and the NATS JetStream run share: publishers that
//! stamp each event with its send time, a bounded backlog, consumers that
//! check the order they receive in, and the figures both report.
//!
//! Publishers keep at most `backlog` events published but not yet finished
//! by the last consumer, so a run measures the rate the pipeline sustains,
//! not a queue growing. When the window ends the publishers stop, the
//! consumers drain what was published, and then they stop too.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tokio::{sync::Semaphore, task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    cpu::{CpuSnapshot, CpuUsage},
    load::Window,
    stats::LatencySummary,
};

/// How long the consumers get to finish what was published once the
/// publishers have stopped: longer means the pipeline stalled.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How a run loads the system under test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlowPlan {
    pub(crate) publishers: usize,
    /// Events per publish call.
    pub(crate) batch: u32,
    /// Most events published and not yet finished by the last consumer.
    pub(crate) backlog: usize,
    /// Most unacked deliveries one consumer holds.
    pub(crate) max_in_flight: u32,
    /// Most deliveries acked in one call.
    pub(crate) ack_batch: usize,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
}

/// The payload of every event and message: its send time.
#[derive(Debug, Serialize, Deserialize)]
struct Stamp {
    /// Microseconds since the run's [`Flow`] started.
    sent_us: u64,
}

/// A payload carrying `sent_us`.
pub(crate) fn stamp(sent_us: u64) -> Vec<u8> {
    serde_json::to_vec(&Stamp { sent_us }).unwrap_or_default()
}

/// The send time a payload carries.
pub(crate) fn sent_us(payload: &[u8]) -> anyhow::Result<u64> {
    let stamp: Stamp = serde_json::from_slice(payload).context("a payload without its send time")?;
    Ok(stamp.sent_us)
}

/// Follows the sequences one consumer receives: each should be the one
/// after the last (every consumer takes every event, in order).
#[derive(Debug, Default)]
pub(crate) struct SequenceCheck {
    last: u64,
}

impl SequenceCheck {
    /// The highest sequence received so far (0 before any).
    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// Records `sequence`; false when it is not the one expected.
    pub(crate) fn next(&mut self, sequence: u64) -> bool {
        let expected = self.last + 1;
        self.last = self.last.max(sequence);
        sequence == expected
    }
}

/// What went wrong in delivery, counted rather than failing the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Anomalies {
    /// Deliveries whose sequence was not the one after the consumer's
    /// previous one: gaps, redeliveries or reordering. Where the consumer
    /// tells repeats apart ([`repeated`](Self::repeated)), first deliveries
    /// that came after a later one.
    pub(crate) out_of_order: u64,
    /// Deliveries of a message the consumer had received before (counted
    /// by the hub's subscribers only).
    pub(crate) repeated: u64,
    /// Deliveries that reached a handler before the handler it runs after
    /// had even asked to ack the event.
    pub(crate) ahead_of_dependency: u64,
}

impl Anomalies {
    pub(crate) fn any(&self) -> bool {
        self.out_of_order > 0 || self.repeated > 0 || self.ahead_of_dependency > 0
    }
}

/// Most retries of `Unavailable` failures one consumer makes before it
/// gives the run up.
const MAX_RETRIES: usize = 100;

/// What one publisher or consumer recorded, in microseconds.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    /// Events whose publish was acknowledged inside the window.
    pub(crate) published: u64,
    /// Publish calls (a whole batch) acknowledged inside the window.
    pub(crate) publish_calls: Vec<u64>,
    /// Send → arrival at the first consumer, for arrivals inside the window.
    pub(crate) first_delivery: Vec<u64>,
    /// Events finished by the last consumer inside the window.
    pub(crate) finished: u64,
    /// Send → finished by the last consumer, inside the window.
    pub(crate) finished_latency: Vec<u64>,
    pub(crate) anomalies: Anomalies,
    /// Each `Unavailable` failure retried: what failed and why.
    pub(crate) retries: Vec<String>,
}

impl Samples {
    /// Notes a retry of `what` after `error`; fails past [`MAX_RETRIES`].
    pub(crate) fn retried(&mut self, what: &str, error: &impl std::fmt::Display) -> anyhow::Result<()> {
        let retry = format!("{what}: {error}");
        if self.retries.len() >= MAX_RETRIES {
            bail!("gave up after {MAX_RETRIES} retries; the last: {retry}");
        }
        self.retries.push(retry);
        Ok(())
    }

    fn absorb(&mut self, other: Self) {
        self.retries.extend(other.retries);
        self.published += other.published;
        self.publish_calls.extend(other.publish_calls);
        self.first_delivery.extend(other.first_delivery);
        self.finished += other.finished;
        self.finished_latency.extend(other.finished_latency);
        self.anomalies.out_of_order += other.anomalies.out_of_order;
        self.anomalies.repeated += other.anomalies.repeated;
        self.anomalies.ahead_of_dependency += other.anomalies.ahead_of_dependency;
    }
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FlowResult {
    pub(crate) seconds: f64,
    /// Events published inside the window.
    pub(crate) published: u64,
    pub(crate) published_per_sec: f64,
    /// Events finished by the last consumer inside the window.
    pub(crate) finished: u64,
    pub(crate) finished_per_sec: f64,
    /// Events published over the whole run (warm-up and window), every one
    /// of them finished before the run ended.
    pub(crate) all_events: u64,
    /// One publish call: a whole batch, acknowledged.
    pub(crate) publish_call: LatencySummary,
    /// Send → arrival at the first consumer.
    pub(crate) first_delivery: LatencySummary,
    /// Send → finished by the last consumer.
    pub(crate) finished_latency: LatencySummary,
    pub(crate) anomalies: Anomalies,
    /// Calls and streams that failed with `Unavailable` and were retried.
    pub(crate) retried: u64,
    /// Their distinct failures, the first few.
    pub(crate) retry_errors: Vec<String>,
}

/// How many distinct retried failures a result lists.
const RETRY_ERRORS_LISTED: usize = 5;

/// The state publishers and consumers share.
#[derive(Debug)]
pub(crate) struct Progress {
    epoch: Instant,
    pub(crate) window: Window,
    backlog: Semaphore,
    published: AtomicU64,
    finished: AtomicU64,
    stop_publishing: CancellationToken,
    pub(crate) stop_consuming: CancellationToken,
}

impl Progress {
    /// Microseconds since the run started: what payloads carry.
    pub(crate) fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Microseconds from a payload's send time to now.
    pub(crate) fn since_us(&self, sent_us: u64) -> u64 {
        self.now_us().saturating_sub(sent_us)
    }

    /// Waits until `events` more fit in the backlog; false once publishing
    /// has stopped.
    pub(crate) async fn reserve(&self, events: u32) -> bool {
        tokio::select! {
            biased;
            () = self.stop_publishing.cancelled() => false,
            permits = self.backlog.acquire_many(events) => match permits {
                Ok(permits) => {
                    permits.forget();
                    true
                }
                Err(_) => false,
            },
        }
    }

    /// Counts events whose publish was acknowledged.
    pub(crate) fn published(&self, events: u64) {
        self.published.fetch_add(events, Ordering::Relaxed);
    }

    /// Counts events the last consumer finished, freeing their backlog.
    pub(crate) fn finished(&self, events: u64) {
        self.finished.fetch_add(events, Ordering::Relaxed);
        self.backlog.add_permits(events as usize);
    }
}

/// Publishers and consumers running against one system.
#[derive(Debug)]
pub(crate) struct Flow {
    pub(crate) progress: Arc<Progress>,
    publishers: JoinSet<anyhow::Result<Samples>>,
    consumers: JoinSet<anyhow::Result<Samples>>,
    samples: Samples,
}

impl Flow {
    /// A run whose window opens after `warmup` and lasts `measure`, with at
    /// most `backlog` events unfinished. Add the consumers, then the publishers.
    pub(crate) fn new(backlog: usize, warmup: Duration, measure: Duration) -> Self {
        let epoch = Instant::now();
        let start = epoch + warmup;
        let progress = Progress {
            epoch,
            window: Window { start, end: start + measure },
            backlog: Semaphore::new(backlog),
            published: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            stop_publishing: CancellationToken::new(),
            stop_consuming: CancellationToken::new(),
        };
        Self {
            progress: Arc::new(progress),
            publishers: JoinSet::new(),
            consumers: JoinSet::new(),
            samples: Samples::default(),
        }
    }

    pub(crate) fn window(&self) -> Window {
        self.progress.window
    }

    pub(crate) fn spawn_consumer(&mut self, consumer: impl Future<Output = anyhow::Result<Samples>> + Send + 'static) {
        self.consumers.spawn(consumer);
    }

    pub(crate) fn spawn_publisher(
        &mut self,
        publisher: impl Future<Output = anyhow::Result<Samples>> + Send + 'static,
    ) {
        self.publishers.spawn(publisher);
    }

    /// Sleeps until `at`, failing as soon as a publisher or consumer fails.
    pub(crate) async fn wait_until(&mut self, at: Instant) -> anyhow::Result<()> {
        loop {
            let joined = tokio::select! {
                () = tokio::time::sleep_until(at) => return Ok(()),
                Some(joined) = self.publishers.join_next() => joined,
                Some(joined) = self.consumers.join_next() => joined,
            };
            self.samples.absorb(joined.context("a load task panicked")??);
        }
    }

    /// Waits through the warm-up and the window, and returns the CPU use
    /// over the window (`server`: the process under test).
    pub(crate) async fn sample_cpu(&mut self, server: Option<u32>) -> anyhow::Result<CpuUsage> {
        let window = self.window();
        let bench = std::process::id();
        self.wait_until(window.start).await?;
        let before = CpuSnapshot::take(server, bench)?;
        self.wait_until(window.end).await?;
        Ok(before.usage_until(&CpuSnapshot::take(server, bench)?))
    }

    /// Stops publishing at the window's end, waits for the consumers to
    /// finish every event published, stops them and sums up.
    pub(crate) async fn finish(mut self) -> anyhow::Result<FlowResult> {
        let window = self.window();
        self.wait_until(window.end).await?;
        self.progress.stop_publishing.cancel();
        while let Some(joined) = self.publishers.join_next().await {
            self.samples.absorb(joined.context("a publisher panicked")??);
        }
        let published = self.progress.published.load(Ordering::Relaxed);
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while self.progress.finished.load(Ordering::Relaxed) < published {
            if Instant::now() >= deadline {
                let finished = self.progress.finished.load(Ordering::Relaxed);
                bail!(
                    "stalled: {} of {published} events published were not finished {DRAIN_TIMEOUT:?} after \
                     publishing stopped",
                    published - finished
                );
            }
            self.wait_until(Instant::now() + Duration::from_millis(10)).await?;
        }
        self.progress.stop_consuming.cancel();
        while let Some(joined) = self.consumers.join_next().await {
            self.samples.absorb(joined.context("a consumer panicked")??);
        }
        let seconds = window.end.duration_since(window.start).as_secs_f64();
        let samples = self.samples;
        Ok(FlowResult {
            seconds,
            published: samples.published,
            published_per_sec: samples.published as f64 / seconds,
            finished: samples.finished,
            finished_per_sec: samples.finished as f64 / seconds,
            all_events: published,
            publish_call: LatencySummary::from_micros(samples.publish_calls),
            first_delivery: LatencySummary::from_micros(samples.first_delivery),
            finished_latency: LatencySummary::from_micros(samples.finished_latency),
            anomalies: samples.anomalies,
            retried: samples.retries.len() as u64,
            retry_errors: distinct(samples.retries, RETRY_ERRORS_LISTED),
        })
    }
}

/// The first `limit` distinct values, in order.
fn distinct(values: Vec<String>, limit: usize) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    for value in values {
        if kept.len() == limit {
            break;
        }
        if !kept.contains(&value) {
            kept.push(value);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_carries_its_send_time() {
        assert_eq!(sent_us(&stamp(1_234_567)).expect("a stamp"), 1_234_567);
        assert!(sent_us(b"{}").is_err());
        assert!(sent_us(b"not json").is_err());
    }

    #[test]
    fn sequences_must_follow_each_other() {
        let mut check = SequenceCheck::default();
        assert!(check.next(1));
        assert!(check.next(2));
        assert!(!check.next(4), "a gap");
        assert!(check.next(5), "back in step after the gap");
        assert!(!check.next(3), "a late redelivery");
        assert!(check.next(6));
    }

    #[test]
    fn retries_are_counted_then_refused() {
        let mut samples = Samples::default();
        for _ in 0..MAX_RETRIES {
            samples.retried("Ack of a", &"deadlock detected").expect("within the limit");
        }
        assert!(samples.retried("Ack of a", &"deadlock detected").is_err());
        assert_eq!(samples.retries.len(), MAX_RETRIES);
        let listed = distinct(vec!["x".into(), "y".into(), "x".into(), "z".into()], 2);
        assert_eq!(listed, vec!["x".to_owned(), "y".to_owned()]);
    }

    #[tokio::test]
    async fn the_backlog_holds_publishers_until_events_finish() {
        let flow = Flow::new(3, Duration::ZERO, Duration::from_secs(1));
        let progress = Arc::clone(&flow.progress);
        assert!(progress.reserve(2).await);
        let blocked = tokio::time::timeout(Duration::from_millis(20), progress.reserve(2)).await;
        assert!(blocked.is_err(), "4 events do not fit a backlog of 3");
        progress.finished(2);
        assert!(progress.reserve(2).await);
        progress.stop_publishing.cancel();
        assert!(!progress.reserve(2).await, "nothing is reserved once publishing stopped");
    }
}
