//! The fan-out load every system runs, on the [`Flow`] machinery the event
//! bus uses: one publisher keeping several publishes in flight (pipelined:
//! it does not wait for one to be acknowledged before sending the next),
//! either as fast as the backlog allows or at a fixed rate, and subscribers
//! that each receive every message and ack in batches.
//!
//! The flow counts deliveries: a publish reserves one backlog slot per
//! subscriber and each subscriber's ack frees one, so the backlog is
//! `backlog × subscribers` deliveries — `backlog` messages not yet acked by
//! every subscriber.

use std::{collections::HashSet, future::Future, sync::Arc, time::Duration};

use anyhow::Context as _;
use serde::Serialize;
use tokio::{
    task::JoinSet,
    time::{Instant, MissedTickBehavior},
};

use crate::{
    cpu::CpuUsage,
    flow::{Flow, FlowResult, Progress, Samples, sent_us, stamp},
    stats::LatencySummary,
};

/// A fixed-rate run that publishes less than this share of the rate asked
/// did not keep up: its latencies include queueing.
const KEPT_UP: f64 = 0.95;

/// How one publisher loads a system.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    /// Subscribers: the deliveries each publish makes.
    pub(crate) fan_out: u32,
    /// Most publishes sent and not yet acknowledged.
    pub(crate) in_flight: usize,
    /// Publishes per second; `None`: as fast as the backlog allows.
    pub(crate) rate: Option<f64>,
}

/// One fan-out run of one system.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FanoutResult {
    /// The publish rate asked for; null: as fast as the subscribers drain.
    pub(crate) target_rate: Option<f64>,
    /// With a target rate: whether the system published at ≥ 95% of it.
    pub(crate) kept_up: Option<bool>,
    pub(crate) seconds: f64,
    /// Publishes acknowledged inside the window.
    pub(crate) publishes: u64,
    pub(crate) publishes_per_sec: f64,
    /// Messages acked by a subscriber inside the window (each publish makes
    /// one per subscriber).
    pub(crate) deliveries: u64,
    pub(crate) deliveries_per_sec: f64,
    /// Deliveries over the whole run (warm-up, window and drain), all acked.
    pub(crate) all_deliveries: u64,
    /// One publish call, sent → acknowledged.
    pub(crate) publish_call: LatencySummary,
    /// Publish sent → the message's arrival at a subscriber.
    pub(crate) deliver: LatencySummary,
    /// Publish sent → its ack answered (JetStream: sent; it answers none).
    pub(crate) acked: LatencySummary,
    /// First deliveries that came after a later-sequenced one: publishes in
    /// flight together commit in any order, and none is promised.
    pub(crate) out_of_order: u64,
    /// Deliveries of a message the subscriber had received before.
    pub(crate) repeated: u64,
    pub(crate) cpu: CpuUsage,
    /// On PostgreSQL: commits over the server's life per delivery.
    pub(crate) commits_per_delivery: Option<f64>,
}

impl FanoutResult {
    pub(crate) fn new(pace: &Pace, flow: FlowResult, cpu: CpuUsage) -> Self {
        Self {
            target_rate: pace.rate,
            kept_up: pace.rate.map(|rate| flow.published_per_sec >= KEPT_UP * rate),
            seconds: flow.seconds,
            publishes: flow.published,
            publishes_per_sec: flow.published_per_sec,
            deliveries: flow.finished,
            deliveries_per_sec: flow.finished_per_sec,
            all_deliveries: flow.all_events,
            publish_call: flow.publish_call,
            deliver: flow.first_delivery,
            acked: flow.finished_latency,
            out_of_order: flow.anomalies.out_of_order,
            repeated: flow.anomalies.repeated,
            cpu,
            commits_per_delivery: None,
        }
    }
}

/// Publishes while the backlog allows, at `pace`, with `publish` (which
/// sends one payload and resolves once the system acknowledged it).
pub(crate) async fn publish<F, Fut>(progress: Arc<Progress>, pace: Pace, mut publish: F) -> anyhow::Result<Samples>
where
    F: FnMut(Vec<u8>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut samples = Samples::default();
    let mut calls: JoinSet<anyhow::Result<(Instant, Instant)>> = JoinSet::new();
    let mut ticks = pace.rate.map(|rate| {
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
        ticks
    });
    loop {
        if let Some(ticks) = &mut ticks {
            ticks.tick().await;
        }
        while calls.len() >= pace.in_flight {
            let joined = calls.join_next().await.context("a publish in flight")?;
            acknowledged(&progress, &pace, &mut samples, joined)?;
        }
        while let Some(joined) = calls.try_join_next() {
            acknowledged(&progress, &pace, &mut samples, joined)?;
        }
        if !progress.reserve(pace.fan_out).await {
            break;
        }
        let call = publish(stamp(progress.now_us()));
        let started = Instant::now();
        calls.spawn(async move {
            call.await?;
            Ok((started, Instant::now()))
        });
    }
    while let Some(joined) = calls.join_next().await {
        acknowledged(&progress, &pace, &mut samples, joined)?;
    }
    Ok(samples)
}

/// Counts one acknowledged publish.
fn acknowledged(
    progress: &Progress,
    pace: &Pace,
    samples: &mut Samples,
    joined: Result<anyhow::Result<(Instant, Instant)>, tokio::task::JoinError>,
) -> anyhow::Result<()> {
    let (started, done) = joined.context("a publish panicked")??;
    progress.published(u64::from(pace.fan_out));
    if progress.window.contains(done) {
        samples.published += 1;
        samples.publish_calls.push(done.duration_since(started).as_micros() as u64);
    }
    Ok(())
}

/// What one subscriber records: arrivals in order, and acks.
#[derive(Debug)]
pub(crate) struct Tally {
    progress: Arc<Progress>,
    /// The highest position delivered so far, to spot reordering.
    last: Option<u128>,
    /// Every position delivered so far, to spot repeats.
    seen: HashSet<u128>,
    samples: Samples,
}

impl Tally {
    pub(crate) fn new(flow: &Flow) -> Self {
        Self { progress: Arc::clone(&flow.progress), last: None, seen: HashSet::new(), samples: Samples::default() }
    }

    pub(crate) fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Notes a delivery at `position` (increasing in publish order) and
    /// returns the send time its payload carries.
    pub(crate) fn arrived(&mut self, position: u128, payload: &[u8]) -> anyhow::Result<u64> {
        let arrived = Instant::now();
        if !self.seen.insert(position) {
            self.samples.anomalies.repeated += 1;
        } else if self.last.is_some_and(|last| position < last) {
            self.samples.anomalies.out_of_order += 1;
        }
        self.last = Some(self.last.map_or(position, |last| last.max(position)));
        let sent_us = sent_us(payload)?;
        if self.progress.window.contains(arrived) {
            self.samples.first_delivery.push(self.progress.since_us(sent_us));
        }
        Ok(sent_us)
    }

    /// Notes that the deliveries sent at `sent` have been acked.
    pub(crate) fn acked(&mut self, sent: &[u64]) {
        if self.progress.window.contains(Instant::now()) {
            self.samples.finished += sent.len() as u64;
            let latencies = sent.iter().map(|&sent_us| self.progress.since_us(sent_us));
            self.samples.finished_latency.extend(latencies);
        }
        self.progress.finished(sent.len() as u64);
    }

    pub(crate) fn into_samples(self) -> Samples {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_subscriber_counts_repeats_and_acks() {
        let flow = Flow::new(10, Duration::ZERO, Duration::from_secs(60));
        let mut tally = Tally::new(&flow);
        assert!(tally.progress().reserve(3).await);
        assert_eq!(tally.arrived(5, &stamp(0)).expect("a stamp"), 0);
        tally.arrived(9, &stamp(0)).expect("a stamp");
        tally.arrived(9, &stamp(0)).expect("a stamp");
        tally.arrived(7, &stamp(0)).expect("a stamp");
        assert!(tally.arrived(10, b"{}").is_err(), "a payload without its send time");
        tally.acked(&[0, 0]);
        let samples = tally.into_samples();
        assert_eq!((samples.anomalies.repeated, samples.anomalies.out_of_order), (1, 1), "a repeat and a step back");
        assert_eq!(samples.first_delivery.len(), 4);
        assert_eq!((samples.finished, samples.finished_latency.len()), (2, 2));
    }

    #[test]
    fn a_fixed_rate_run_keeps_up_or_not() {
        let flow = |published_per_sec: f64| FlowResult {
            seconds: 1.0,
            published: 0,
            published_per_sec,
            finished: 0,
            finished_per_sec: 0.0,
            all_events: 0,
            publish_call: LatencySummary::default(),
            first_delivery: LatencySummary::default(),
            finished_latency: LatencySummary::default(),
            anomalies: Default::default(),
            retried: 0,
            retry_errors: Vec::new(),
        };
        let steady = Pace { fan_out: 10, in_flight: 16, rate: Some(200.0) };
        assert_eq!(FanoutResult::new(&steady, flow(190.0), CpuUsage::default()).kept_up, Some(true));
        assert_eq!(FanoutResult::new(&steady, flow(189.9), CpuUsage::default()).kept_up, Some(false));
        let saturated = Pace { rate: None, ..steady };
        assert_eq!(FanoutResult::new(&saturated, flow(5.0), CpuUsage::default()).kept_up, None);
    }

    #[tokio::test]
    async fn publishes_are_pipelined_up_to_the_limit_and_counted_once_acknowledged() {
        let mut flow = Flow::new(1000, Duration::ZERO, Duration::from_millis(200));
        let progress = Arc::clone(&flow.progress);
        let pace = Pace { fan_out: 10, in_flight: 3, rate: None };
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (counting, deepest) = (Arc::clone(&in_flight), Arc::clone(&most));
        flow.spawn_publisher(publish(Arc::clone(&progress), pace, move |payload| {
            let (in_flight, most, progress) = (Arc::clone(&counting), Arc::clone(&deepest), Arc::clone(&progress));
            async move {
                sent_us(&payload)?;
                most.fetch_max(in_flight.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                // Every subscriber acks it at once.
                progress.finished(10);
                Ok(())
            }
        }));
        let result = flow.finish().await.expect("a run");
        assert_eq!(most.load(Ordering::SeqCst), 3, "three publishes in flight, never more");
        assert!(result.published > 10, "{} publishes", result.published);
        assert_eq!(result.publish_call.samples, result.published);
        assert_eq!(result.all_events % 10, 0, "ten deliveries per publish");
    }
}
