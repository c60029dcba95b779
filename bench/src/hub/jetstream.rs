//! The hub's loads on NATS JetStream, each on a scratch stream with file
//! storage (named and cleaned up as in [`crate::nats`]), every client on a
//! connection of its own.
//!
//! Fan-out: a stream with interest retention (a message is kept until every
//! consumer acked it, as a hub message stays in each subscriber's inbox),
//! one durable pull consumer per subscriber with explicit acks and at most
//! max_in_flight unacked; the publisher keeps several publishes in flight,
//! each done when its PubAck arrives. A delivery is acked once its ack is
//! sent (JetStream does not answer plain acks).
//!
//! Direct: a work-queue stream (a message is removed once acked), one
//! durable consumer per pair filtering on the pair's subject; a round trip
//! is a publish and its PubAck, the message on the consumer, and an ack the
//! server confirms (double ack), as chorus's Ack is answered.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::{Context as _, anyhow};
use async_nats::{
    Subject,
    jetstream::{
        self,
        consumer::{AckPolicy, pull},
        stream::{self, RetentionPolicy, StorageType},
    },
};
use futures_util::{FutureExt as _, StreamExt as _};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    HubPlan, System, SystemRuns, describe_direct, describe_fanout,
    direct::{self, DirectResult, Pair, STEP_TIMEOUT, Trip},
    fanout::{self, FanoutResult, Pace, Tally},
};
use crate::{
    flow::{Flow, Samples},
    nats::{self, NatsServer},
    postgres,
};

/// The three loads against the JetStream server at `url`.
pub(crate) async fn run(
    url: &str,
    plan: &HubPlan,
    interrupt: &CancellationToken,
) -> anyhow::Result<(NatsServer, SystemRuns)> {
    let (control, server, pid) = nats::open(url).await?;
    let scratch = Scratch { url, control: &control, server: pid, streams: Mutex::new(Vec::new()) };
    let runs = async {
        let saturated = scratch.fanout(plan, plan.saturated()).await?;
        let steady = scratch.fanout(plan, plan.steady()).await?;
        let direct = scratch.direct(plan).await?;
        Ok(SystemRuns { system: System::Nats, saturated, steady, direct })
    };
    let outcome = tokio::select! {
        outcome = runs => outcome,
        () = interrupt.cancelled() => Err(anyhow!("interrupted")),
    };
    // The streams of a run that was cut short.
    for name in scratch.take_streams() {
        if let Err(error) = control.delete_stream(&name).await {
            eprintln!("warning: cannot delete the NATS stream {name}: {error}");
        }
    }
    Ok((server, outcome?))
}

/// Runs on scratch streams of one server.
struct Scratch<'a> {
    url: &'a str,
    control: &'a jetstream::Context,
    /// nats-server's pid.
    server: Option<u32>,
    /// Streams created and not yet deleted.
    streams: Mutex<Vec<String>>,
}

impl Scratch<'_> {
    async fn fanout(&self, plan: &HubPlan, pace: Pace) -> anyhow::Result<FanoutResult> {
        eprintln!("nats: {}…", describe_fanout(plan, &pace));
        let (name, subjects) = self.create(RetentionPolicy::Interest).await?;
        let outcome = self.measure_fanout(&name, Subject::from(format!("{subjects}.topic")), plan, pace).await;
        self.delete(&name, outcome).await
    }

    async fn direct(&self, plan: &HubPlan) -> anyhow::Result<DirectResult> {
        eprintln!("nats: {}…", describe_direct(plan));
        let (name, subjects) = self.create(RetentionPolicy::WorkQueue).await?;
        let outcome = async {
            let mut pairs = Vec::with_capacity(plan.pairs);
            for index in 0..plan.pairs {
                pairs.push(NatsPair::open(self.url, &name, Subject::from(format!("{subjects}.direct.{index}"))).await?);
            }
            direct::run(pairs, plan.warmup, plan.measure, self.server).await
        }
        .await;
        self.delete(&name, outcome).await
    }

    /// A scratch stream with file storage on `<subjects>.>`.
    async fn create(&self, retention: RetentionPolicy) -> anyhow::Result<(String, String)> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("{}{}_{id}", postgres::PREFIX, std::process::id());
        let subjects = format!("chorus.bench.{id}");
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![format!("{subjects}.>")],
            storage: StorageType::File,
            retention,
            ..Default::default()
        };
        self.control.create_stream(config).await.with_context(|| format!("cannot create the NATS stream {name}"))?;
        self.lock_streams().push(name.clone());
        Ok((name, subjects))
    }

    /// Deletes the stream `name` whatever `outcome` is.
    async fn delete<T>(&self, name: &str, outcome: anyhow::Result<T>) -> anyhow::Result<T> {
        let deleted =
            self.control.delete_stream(name).await.with_context(|| format!("cannot delete the NATS stream {name}"));
        self.lock_streams().retain(|created| created != name);
        let value = outcome?;
        deleted?;
        Ok(value)
    }

    fn lock_streams(&self) -> MutexGuard<'_, Vec<String>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_streams(&self) -> Vec<String> {
        std::mem::take(&mut *self.lock_streams())
    }

    async fn measure_fanout(
        &self,
        name: &str,
        subject: Subject,
        plan: &HubPlan,
        pace: Pace,
    ) -> anyhow::Result<FanoutResult> {
        let mut flow = Flow::new(plan.backlog * plan.subscribers, plan.warmup, plan.measure);
        for index in 0..plan.subscribers {
            let context = jetstream::new(nats::connect(self.url).await?);
            let stream =
                context.get_stream(name).await.with_context(|| format!("cannot open the NATS stream {name}"))?;
            let config = pull::Config {
                durable_name: Some(format!("sub-{index}")),
                ack_policy: AckPolicy::Explicit,
                max_ack_pending: i64::from(plan.max_in_flight),
                ..Default::default()
            };
            let consumer = stream.create_consumer(config).await.context("cannot create a NATS consumer")?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(plan.max_in_flight as usize)
                .messages()
                .await
                .context("cannot pull from a NATS consumer")?;
            flow.spawn_consumer(consume(messages, Tally::new(&flow), plan.ack_batch));
        }
        let publishing = jetstream::new(nats::connect(self.url).await?);
        flow.spawn_publisher(fanout::publish(Arc::clone(&flow.progress), pace, move |payload| {
            let (context, subject) = (publishing.clone(), subject.clone());
            async move {
                let ack = context.publish(subject, payload.into()).await.context("JetStream publish")?;
                ack.await.context("no PubAck from JetStream")?;
                Ok(())
            }
        }));
        let cpu = flow.sample_cpu(self.server).await?;
        Ok(FanoutResult::new(&pace, flow.finish().await?, cpu))
    }
}

/// Takes what the consumer has ready, up to the ack batch, and acks each
/// message, until told to stop.
async fn consume(mut messages: pull::Stream, mut tally: Tally, ack_batch: usize) -> anyhow::Result<Samples> {
    let mut batch = Vec::with_capacity(ack_batch);
    loop {
        let message = tokio::select! {
            biased;
            () = tally.progress().stop_consuming.cancelled() => return Ok(tally.into_samples()),
            message = messages.next() => message,
        };
        batch.push(message);
        while batch.len() < ack_batch {
            let Some(message) = messages.next().now_or_never() else { break };
            batch.push(message);
        }
        let mut sent = Vec::with_capacity(batch.len());
        for message in batch.drain(..) {
            let message = message.context("the NATS consumer's messages ended")?.context("the NATS consumer failed")?;
            let info = message.info().map_err(anyhow::Error::from_boxed).context("a message without its info")?;
            sent.push(tally.arrived(u128::from(info.stream_sequence), &message.payload)?);
            message.ack().await.map_err(anyhow::Error::from_boxed).context("cannot ack a NATS message")?;
        }
        tally.acked(&sent);
    }
}

/// A publisher and a consumer of the pair's subject, on connections of their own.
struct NatsPair {
    sender: jetstream::Context,
    subject: Subject,
    messages: pull::Stream,
}

impl NatsPair {
    async fn open(url: &str, stream: &str, subject: Subject) -> anyhow::Result<Self> {
        let receiving = jetstream::new(nats::connect(url).await?);
        let stream = receiving.get_stream(stream).await.context("cannot open the NATS stream")?;
        let config = pull::Config {
            durable_name: Some(format!("pair-{}", subject.split('.').next_back().unwrap_or_default())),
            filter_subject: subject.to_string(),
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        };
        let consumer = stream.create_consumer(config).await.context("cannot create a NATS consumer")?;
        let messages = consumer.messages().await.context("cannot pull from a NATS consumer")?;
        Ok(Self { sender: jetstream::new(nats::connect(url).await?), subject, messages })
    }
}

impl Pair for NatsPair {
    async fn round_trip(&mut self, payload: Vec<u8>) -> anyhow::Result<Trip> {
        let ack = self.sender.publish(self.subject.clone(), payload.into()).await.context("JetStream publish")?;
        ack.await.context("no PubAck from JetStream")?;
        let sent = Instant::now();
        let message = tokio::time::timeout(STEP_TIMEOUT, self.messages.next())
            .await
            .with_context(|| format!("no message on {} within {STEP_TIMEOUT:?}", self.subject))?
            .context("the NATS consumer's messages ended")?
            .context("the NATS consumer failed")?;
        let received = Instant::now();
        message.double_ack().await.map_err(anyhow::Error::from_boxed).context("JetStream did not confirm an ack")?;
        Ok(Trip { sent, received, payload: message.payload.to_vec(), acked: Instant::now() })
    }
}
