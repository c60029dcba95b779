//! Direct round trips, the same on every system: pairs of a sender and a
//! receiver, each pair looping send → the receiver gets the message → the
//! receiver acks it, one message at a time. A round trip counts when its
//! ack is answered inside the measured window; its latency runs from the
//! send to that answer.

use std::{future::Future, time::Duration};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::{task::JoinSet, time::Instant};

use crate::{
    cpu::{CpuSnapshot, CpuUsage},
    flow::{sent_us, stamp},
    load::Window,
    stats::LatencySummary,
};

/// How long one step of a round trip may take before the run is declared broken.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// A sender and its receiver on one system.
pub(crate) trait Pair: Send + 'static {
    /// Sends `payload` to the receiver, who receives it and acks it;
    /// returns the payload received and when each step ended.
    fn round_trip(&mut self, payload: Vec<u8>) -> impl Future<Output = anyhow::Result<Trip>> + Send;
}

/// One round trip as a pair saw it.
#[derive(Debug, Clone)]
pub(crate) struct Trip {
    /// The send was acknowledged.
    pub(crate) sent: Instant,
    /// The receiver had the message.
    pub(crate) received: Instant,
    pub(crate) payload: Vec<u8>,
    /// The receiver's ack was answered.
    pub(crate) acked: Instant,
}

/// Round trips of one system.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DirectResult {
    pub(crate) pairs: usize,
    pub(crate) seconds: f64,
    /// Round trips whose ack was answered inside the window.
    pub(crate) round_trips: u64,
    pub(crate) round_trips_per_sec: f64,
    /// Round trips over the whole run, warm-up included.
    pub(crate) all_round_trips: u64,
    /// Send started → ack answered.
    pub(crate) latency: LatencySummary,
    /// The send call.
    pub(crate) send: LatencySummary,
    /// Send acknowledged → the receiver has the message.
    pub(crate) deliver: LatencySummary,
    /// The receiver's ack call.
    pub(crate) ack: LatencySummary,
    pub(crate) cpu: CpuUsage,
    /// On PostgreSQL: commits over the server's life per round trip.
    pub(crate) commits_per_round_trip: Option<f64>,
}

/// One measured round trip, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    total: u64,
    send: u64,
    deliver: u64,
    ack: u64,
}

/// What one pair did.
#[derive(Debug, Default)]
struct Finished {
    samples: Vec<Sample>,
    all_round_trips: u64,
}

/// Runs `pairs` through a warm-up and a measured window, sampling CPU over
/// the window (`server`: the process under test).
pub(crate) async fn run<P: Pair>(
    pairs: Vec<P>,
    warmup: Duration,
    measure: Duration,
    server: Option<u32>,
) -> anyhow::Result<DirectResult> {
    let count = pairs.len();
    let start = Instant::now() + warmup;
    let window = Window { start, end: start + measure };
    let mut running = JoinSet::new();
    for (index, pair) in pairs.into_iter().enumerate() {
        running.spawn(drive(pair, index, window));
    }
    let mut finished = Vec::with_capacity(count);
    let bench = std::process::id();
    wait_until(&mut running, &mut finished, window.start).await?;
    let before = CpuSnapshot::take(server, bench)?;
    wait_until(&mut running, &mut finished, window.end).await?;
    let cpu = before.usage_until(&CpuSnapshot::take(server, bench)?);
    while let Some(joined) = running.join_next().await {
        finished.push(joined.context("a pair panicked")??);
    }
    Ok(summarise(count, window, finished, cpu))
}

/// Sleeps until `at`, failing as soon as a pair fails.
async fn wait_until(
    running: &mut JoinSet<anyhow::Result<Finished>>,
    finished: &mut Vec<Finished>,
    at: Instant,
) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(at) => return Ok(()),
            Some(joined) = running.join_next() => finished.push(joined.context("a pair panicked")??),
        }
    }
}

/// One pair's round trips until the window ends.
async fn drive<P: Pair>(mut pair: P, index: usize, window: Window) -> anyhow::Result<Finished> {
    let mut finished = Finished::default();
    let mut token = 0;
    while Instant::now() < window.end {
        token += 1;
        let started = Instant::now();
        let trip = tokio::time::timeout(STEP_TIMEOUT * 3, pair.round_trip(stamp(token)))
            .await
            .with_context(|| format!("a round trip of pair {index} took longer than {:?}", STEP_TIMEOUT * 3))?
            .with_context(|| format!("a round trip of pair {index}"))?;
        if sent_us(&trip.payload)? != token {
            bail!("pair {index} received another message than the one it sent");
        }
        finished.all_round_trips += 1;
        if window.contains(trip.acked) {
            finished.samples.push(sample(started, &trip));
        }
    }
    Ok(finished)
}

fn sample(started: Instant, trip: &Trip) -> Sample {
    let micros = |from: Instant, to: Instant| to.saturating_duration_since(from).as_micros() as u64;
    Sample {
        total: micros(started, trip.acked),
        send: micros(started, trip.sent),
        deliver: micros(trip.sent, trip.received),
        ack: micros(trip.received, trip.acked),
    }
}

fn summarise(pairs: usize, window: Window, finished: Vec<Finished>, cpu: CpuUsage) -> DirectResult {
    let all_round_trips = finished.iter().map(|finished| finished.all_round_trips).sum();
    let samples: Vec<Sample> = finished.into_iter().flat_map(|finished| finished.samples).collect();
    let summary = |part: fn(&Sample) -> u64| LatencySummary::from_micros(samples.iter().map(part).collect());
    let seconds = window.end.duration_since(window.start).as_secs_f64();
    DirectResult {
        pairs,
        seconds,
        round_trips: samples.len() as u64,
        round_trips_per_sec: samples.len() as f64 / seconds,
        all_round_trips,
        latency: summary(|sample| sample.total),
        send: summary(|sample| sample.send),
        deliver: summary(|sample| sample.deliver),
        ack: summary(|sample| sample.ack),
        cpu,
        commits_per_round_trip: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echoes what it is sent, each step taking a millisecond.
    struct Echo {
        corrupt: bool,
    }

    impl Pair for Echo {
        async fn round_trip(&mut self, payload: Vec<u8>) -> anyhow::Result<Trip> {
            let step = Duration::from_millis(1);
            tokio::time::sleep(step).await;
            let sent = Instant::now();
            tokio::time::sleep(step).await;
            let received = Instant::now();
            tokio::time::sleep(step).await;
            let payload = if self.corrupt { stamp(0) } else { payload };
            Ok(Trip { sent, received, payload, acked: Instant::now() })
        }
    }

    #[tokio::test]
    async fn round_trips_are_timed_step_by_step() {
        let pairs = vec![Echo { corrupt: false }, Echo { corrupt: false }];
        let result = run(pairs, Duration::from_millis(20), Duration::from_millis(100), None).await.expect("a run");
        assert_eq!(result.pairs, 2);
        assert!(result.round_trips > 10, "{} round trips", result.round_trips);
        assert!(result.all_round_trips > result.round_trips, "the warm-up's are not measured");
        assert_eq!(result.latency.samples, result.round_trips);
        assert!(result.deliver.p50_ms >= 1.0 && result.latency.p50_ms >= 3.0, "{:?}", result.latency);
    }

    #[tokio::test]
    async fn a_pair_that_receives_another_message_fails_the_run() {
        let outcome = run(vec![Echo { corrupt: true }], Duration::ZERO, Duration::from_millis(50), None).await;
        let error = format!("{:#}", outcome.expect_err("a mismatch"));
        assert!(error.contains("another message"), "{error}");
    }
}
