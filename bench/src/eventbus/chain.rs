//! The event-bus load: handlers `a`, `b` after `a` and `c` after `b` in one
//! namespace, one consumer each (a connection and a Subscribe stream of its
//! own), and publishers sending PublishBatch on connections of their own.
//!
//! A consumer takes what its stream has ready, up to the ack batch, acks it
//! in one call, and goes on. An event is finished when `c`'s ack of it has
//! been answered. Each consumer checks that its sequences follow each other
//! and that it never gets an event before the handler it runs after asked
//! to ack it. Like any client of the bus, it retries what fails with
//! `Unavailable` (reopening its stream after the last delivery it received);
//! each retry is counted and reported.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail};
use chorus_proto::eventbus::{self as pb, event_bus_client::EventBusClient};
use futures_util::FutureExt as _;
use tokio::time::Instant;
use tonic::{Code, Status, Streaming, transport::Channel};

use crate::{
    flow::{Flow, FlowPlan, Progress, Samples, SequenceCheck, sent_us, stamp},
    load::{call, connect},
};

/// The chain, in dependency order: each runs after the one before it.
const HANDLERS: [&str; 3] = ["a", "b", "c"];

const EVENT_TYPE: &str = "bench.event";

/// The pause before a call or stream that failed with `Unavailable` is retried.
const RETRY_DELAY: Duration = Duration::from_millis(50);

/// Connects, registers the chain in `namespace` and starts the load:
/// consumers first, then publishers.
pub(crate) async fn start(endpoint: &str, namespace: &str, plan: &FlowPlan) -> anyhow::Result<Flow> {
    register(endpoint, namespace).await?;
    let mut flow = Flow::new(plan.backlog, plan.warmup, plan.measure);
    let marks = Arc::new(AckMarks::default());
    for stage in 0..HANDLERS.len() {
        let consumer = Consumer::subscribe(endpoint, namespace, stage, plan, &flow, &marks).await?;
        flow.spawn_consumer(consumer.run());
    }
    for index in 0..plan.publishers {
        let publisher = Publisher {
            client: EventBusClient::new(connect(endpoint).await?),
            namespace: namespace.to_owned(),
            source: format!("bench-publisher-{index}"),
            batch: plan.batch,
            progress: Arc::clone(&flow.progress),
        };
        flow.spawn_publisher(publisher.run());
    }
    Ok(flow)
}

/// The chain as registered: `a`, `b after a`, `c after b`.
pub(crate) fn describe() -> Vec<String> {
    let mut previous: Option<&str> = None;
    let mut described = Vec::with_capacity(HANDLERS.len());
    for name in HANDLERS {
        described.push(previous.map_or_else(|| name.to_owned(), |after| format!("{name} after {after}")));
        previous = Some(name);
    }
    described
}

/// Registers `a`, `b` after `a`, `c` after `b`.
async fn register(endpoint: &str, namespace: &str) -> anyhow::Result<()> {
    let mut client = EventBusClient::new(connect(endpoint).await?);
    let mut previous: Option<&str> = None;
    for name in HANDLERS {
        let request = pb::RegisterHandlerRequest {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            event_types: vec!["bench.*".to_owned()],
            after: previous.map(str::to_owned).into_iter().collect(),
            ..Default::default()
        };
        call("RegisterHandler", client.register_handler(request)).await?;
        previous = Some(name);
    }
    Ok(())
}

/// How far each handler has asked to ack: consumers ack in sequence order,
/// so every sequence up to the mark has been sent in an Ack.
#[derive(Debug, Default)]
struct AckMarks([AtomicU64; HANDLERS.len()]);

impl AckMarks {
    fn mark(&self, stage: usize, through: u64) {
        self.0[stage].fetch_max(through, Ordering::Relaxed);
    }

    fn through(&self, stage: usize) -> u64 {
        self.0[stage].load(Ordering::Relaxed)
    }
}

/// A publisher: PublishBatch after PublishBatch while the backlog allows.
struct Publisher {
    client: EventBusClient<Channel>,
    namespace: String,
    source: String,
    batch: u32,
    progress: Arc<Progress>,
}

impl Publisher {
    async fn run(mut self) -> anyhow::Result<Samples> {
        let mut samples = Samples::default();
        while self.progress.reserve(self.batch).await {
            let payload = stamp(self.progress.now_us());
            let events = (0..self.batch)
                .map(|_| pb::NewEvent {
                    r#type: EVENT_TYPE.to_owned(),
                    source: self.source.clone(),
                    payload: payload.clone(),
                    content_type: "application/json".to_owned(),
                    ..Default::default()
                })
                .collect();
            let request = pb::PublishBatchRequest { namespace: self.namespace.clone(), events };
            let started = Instant::now();
            let response = call("PublishBatch", self.client.publish_batch(request)).await?;
            let done = Instant::now();
            let fresh = response.results.iter().filter(|result| !result.duplicate).count();
            if fresh != self.batch as usize {
                bail!("PublishBatch of {} events appended {fresh}", self.batch);
            }
            self.progress.published(u64::from(self.batch));
            if self.progress.window.contains(done) {
                samples.published += u64::from(self.batch);
                samples.publish_calls.push(done.duration_since(started).as_micros() as u64);
            }
        }
        Ok(samples)
    }
}

/// A delivery taken from the stream, waiting for its ack.
struct Received {
    id: String,
    sequence: u64,
    sent_us: u64,
}

/// The consumer of one handler of the chain.
struct Consumer {
    client: EventBusClient<Channel>,
    deliveries: Streaming<pb::Delivery>,
    namespace: String,
    stage: usize,
    max_in_flight: u32,
    ack_batch: usize,
    progress: Arc<Progress>,
    marks: Arc<AckMarks>,
    order: SequenceCheck,
    samples: Samples,
}

impl Consumer {
    async fn subscribe(
        endpoint: &str,
        namespace: &str,
        stage: usize,
        plan: &FlowPlan,
        flow: &Flow,
        marks: &Arc<AckMarks>,
    ) -> anyhow::Result<Self> {
        let mut client = EventBusClient::new(connect(endpoint).await?);
        let deliveries = open(&mut client, namespace, stage, plan.max_in_flight, None).await?;
        Ok(Self {
            client,
            deliveries,
            namespace: namespace.to_owned(),
            stage,
            max_in_flight: plan.max_in_flight,
            ack_batch: plan.ack_batch,
            progress: Arc::clone(&flow.progress),
            marks: Arc::clone(marks),
            order: SequenceCheck::default(),
            samples: Samples::default(),
        })
    }

    /// Receives and acks until told to stop; reopens the stream after an
    /// `Unavailable` (retryable) failure, resuming after the last delivery.
    async fn run(mut self) -> anyhow::Result<Samples> {
        let mut batch = Vec::with_capacity(self.ack_batch);
        loop {
            let message = tokio::select! {
                biased;
                () = self.progress.stop_consuming.cancelled() => return Ok(self.samples),
                message = self.deliveries.message() => message,
            };
            let mut broken = !self.receive(message, &mut batch)?;
            while !broken && batch.len() < self.ack_batch {
                let Some(message) = self.deliveries.message().now_or_never() else { break };
                broken = !self.receive(message, &mut batch)?;
            }
            if !batch.is_empty() {
                self.ack(&mut batch).await?;
            }
            if broken {
                tokio::time::sleep(RETRY_DELAY).await;
                let after = Some(self.order.last());
                let stage = self.stage;
                self.deliveries = open(&mut self.client, &self.namespace, stage, self.max_in_flight, after).await?;
            }
        }
    }

    /// Checks one delivery, notes its timing and adds it to `batch`; false
    /// when the stream failed and is worth reopening.
    fn receive(
        &mut self,
        message: Result<Option<pb::Delivery>, Status>,
        batch: &mut Vec<Received>,
    ) -> anyhow::Result<bool> {
        let handler = HANDLERS[self.stage];
        let delivery = match message {
            Ok(Some(delivery)) => delivery,
            Ok(None) => bail!("the Subscribe stream of handler {handler} ended"),
            Err(status) if status.code() == Code::Unavailable => {
                self.samples.retried(&format!("Subscribe stream of {handler}"), &status)?;
                return Ok(false);
            }
            Err(status) => {
                return Err(
                    anyhow::Error::new(status).context(format!("the Subscribe stream of handler {handler} failed"))
                );
            }
        };
        let arrived = Instant::now();
        if !self.order.next(delivery.sequence) {
            self.samples.anomalies.out_of_order += 1;
        }
        if self.stage > 0 && self.marks.through(self.stage - 1) < delivery.sequence {
            self.samples.anomalies.ahead_of_dependency += 1;
        }
        let event = delivery.event.as_ref().context("a delivery without its event")?;
        let sent_us = sent_us(&event.payload)?;
        if self.stage == 0 && self.progress.window.contains(arrived) {
            self.samples.first_delivery.push(self.progress.since_us(sent_us));
        }
        batch.push(Received { id: delivery.id, sequence: delivery.sequence, sent_us });
        Ok(true)
    }

    /// Acks the batch in one call, sent again after an `Unavailable` (acks
    /// are idempotent); the last handler's acks finish events.
    async fn ack(&mut self, batch: &mut Vec<Received>) -> anyhow::Result<()> {
        let through = batch.iter().map(|received| received.sequence).max().unwrap_or_default();
        self.marks.mark(self.stage, through);
        let request = pb::AckRequest {
            namespace: self.namespace.clone(),
            delivery_ids: batch.iter().map(|received| received.id.clone()).collect(),
        };
        while let Err(error) = call("Ack", self.client.ack(request.clone())).await {
            match error.downcast_ref::<Status>() {
                Some(status) if status.code() == Code::Unavailable => {
                    self.samples.retried(&format!("Ack of {}", HANDLERS[self.stage]), status)?;
                    tokio::time::sleep(RETRY_DELAY).await;
                }
                _ => return Err(error),
            }
        }
        if self.stage == HANDLERS.len() - 1 {
            if self.progress.window.contains(Instant::now()) {
                self.samples.finished += batch.len() as u64;
                let latencies = batch.iter().map(|received| self.progress.since_us(received.sent_us));
                self.samples.finished_latency.extend(latencies);
            }
            self.progress.finished(batch.len() as u64);
        }
        batch.clear();
        Ok(())
    }
}

/// Opens the Subscribe stream of the chain's `stage` handler.
async fn open(
    client: &mut EventBusClient<Channel>,
    namespace: &str,
    stage: usize,
    max_in_flight: u32,
    after_sequence: Option<u64>,
) -> anyhow::Result<Streaming<pb::Delivery>> {
    let request = pb::SubscribeRequest {
        namespace: namespace.to_owned(),
        handler: HANDLERS[stage].to_owned(),
        consumer_id: format!("bench-{}", HANDLERS[stage]),
        max_in_flight,
        after_sequence,
    };
    call("Subscribe", client.subscribe(request)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_is_described_in_dependency_order() {
        assert_eq!(describe(), vec!["a".to_owned(), "b after a".to_owned(), "c after b".to_owned()]);
    }
}
