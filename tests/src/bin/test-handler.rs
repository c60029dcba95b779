//! An event-bus handler process for end-to-end tests.
//!
//! `test-handler --server URL --namespace NS --handler NAME [--after a,b]
//! [--event-types '*'] --consumer-id ID --log PATH [--max-in-flight N]`
//!
//! Registers its handler (taking the whole log; registering an existing
//! handler redefines it), prints `test-handler ready` on stdout, then
//! consumes the handler's deliveries. As each one arrives it asks the bus
//! (GetDelivery) whether every handler in `--after` has acked the event;
//! whenever the stream has nothing more ready, it appends `<sequence> ok`
//! (or `<sequence> violation`) for each delivery received, in the order
//! received, to its log file, flushes it, and acks them all in one call.
//! When its stream fails or ends it subscribes again, with backoff. Logs go
//! to stderr.

use std::{path::PathBuf, sync::Arc, time::Duration};

use chorus_proto::eventbus::{
    AckRequest, Delivery, DeliveryState, GetDeliveryRequest, RegisterHandlerRequest, SubscribeRequest,
    event_bus_client::EventBusClient,
};
use chorus_runtime::telemetry::{self, TelemetryConfig};
use chorus_tests::{
    handler::{Handled, READY},
    process::Stop,
};
use clap::Parser;
use futures_util::FutureExt as _;
use tokio::{
    fs::{File, OpenOptions},
    io::{AsyncWriteExt as _, BufWriter},
    task::JoinHandle,
};
use tonic::{
    Code, Status,
    transport::{Channel, Endpoint},
};

/// First pause before subscribing again after a failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

#[derive(Debug, Parser)]
#[command(name = "test-handler", about = "A chorus event-bus handler for end-to-end tests")]
struct Args {
    /// The event bus to consume from.
    #[arg(long)]
    server: String,
    #[arg(long)]
    namespace: String,
    /// The handler's name.
    #[arg(long)]
    handler: String,
    /// Handlers that must finish an event before this one receives it.
    #[arg(long, value_delimiter = ',')]
    after: Vec<String>,
    /// Event types or patterns the handler takes.
    #[arg(long, value_delimiter = ',', default_value = "*")]
    event_types: Vec<String>,
    /// Whom the leases belong to: the same for every process of the handler.
    #[arg(long)]
    consumer_id: String,
    /// The file every delivery handled is appended to.
    #[arg(long)]
    log: PathBuf,
    /// Most unacked deliveries held at once.
    #[arg(long, default_value_t = 100)]
    max_in_flight: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = telemetry::init("test-handler", &TelemetryConfig::default())?;
    let channel = Endpoint::from_shared(args.server.clone())?.connect_timeout(Duration::from_secs(5)).connect_lazy();
    let mut client = EventBusClient::new(channel);
    let log = BufWriter::new(OpenOptions::new().create(true).append(true).open(&args.log).await?);
    register(&mut client, &args).await?;
    println!("{READY}");
    let after = args.after.clone().into();
    let mut consumer = Consumer { client, args, after, log, received: Vec::new(), unacked: Vec::new() };
    let mut backoff = FIRST_BACKOFF;
    loop {
        match consumer.consume(&mut backoff).await {
            Ok(()) => tracing::warn!("the delivery stream ended"),
            Err(Stop::Grpc(status)) => {
                tracing::warn!(code = ?status.code(), message = status.message(), "consuming failed")
            }
            Err(Stop::Log(error)) => return Err(anyhow::Error::new(error).context("cannot write the log")),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Registers the handler from the whole log, waiting for the server to come up.
async fn register(client: &mut EventBusClient<Channel>, args: &Args) -> Result<(), Status> {
    let request = RegisterHandlerRequest {
        namespace: args.namespace.clone(),
        name: args.handler.clone(),
        event_types: args.event_types.clone(),
        after: args.after.clone(),
        start_after_sequence: Some(0),
        ..RegisterHandlerRequest::default()
    };
    let mut backoff = FIRST_BACKOFF;
    loop {
        match client.register_handler(request.clone()).await {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == Code::Unavailable => {
                tracing::warn!(message = status.message(), "the event bus is unavailable; registering again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(status) => return Err(status),
        }
    }
}

/// A delivery received, its dependency check under way.
struct Received {
    id: String,
    sequence: u64,
    /// Whether every handler it is after had acked the event.
    check: JoinHandle<Result<bool, Status>>,
}

struct Consumer {
    client: EventBusClient<Channel>,
    args: Args,
    after: Arc<[String]>,
    log: BufWriter<File>,
    /// Received and not logged yet, in the order received.
    received: Vec<Received>,
    /// Logged (maybe not flushed yet) and not acked yet.
    unacked: Vec<String>,
}

impl Consumer {
    /// One Subscribe stream, until it fails or ends; resets `backoff` once it
    /// delivers.
    async fn consume(&mut self, backoff: &mut Duration) -> Result<(), Stop> {
        // What a failed stream left received is logged and acked first, so
        // that everything still leased to this consumer id is unhandled.
        self.settle().await?;
        let request = SubscribeRequest {
            namespace: self.args.namespace.clone(),
            handler: self.args.handler.clone(),
            consumer_id: self.args.consumer_id.clone(),
            max_in_flight: self.args.max_in_flight,
            // Unset, not the highest sequence in the log of a previous life:
            // a cursor tells the bus that this consumer still holds its
            // deliveries at or below it, so they would stay leased. A new
            // process holds nothing: what the dead one logged but had not
            // acked, or received and not yet logged (a redelivery can come
            // below the log's highest sequence), would wait for the
            // visibility timeout, holding up the dependents and costing an
            // attempt each, and enough crashes would dead-letter an event.
            // Unset, every delivery still leased to this consumer id is sent
            // again at once: a line logged but unacked is written twice,
            // which at-least-once allows. Within one life the settling
            // above makes unset exact: nothing comes twice.
            after_sequence: None,
        };
        let mut stream = self.client.subscribe(request).await?.into_inner();
        loop {
            // Settles whatever was received once the stream has nothing
            // ready (at the latest after `max_in_flight` deliveries: the
            // bus sends no more until some are acked).
            let next = match stream.message().now_or_never() {
                Some(next) => next,
                None => {
                    self.settle().await?;
                    stream.message().await
                }
            };
            let Some(delivery) = next? else { return Ok(()) };
            *backoff = FIRST_BACKOFF;
            self.receive(delivery);
        }
    }

    /// Starts checking the delivery's dependencies at once, while the next
    /// deliveries arrive.
    fn receive(&mut self, delivery: Delivery) {
        let (client, namespace) = (self.client.clone(), self.args.namespace.clone());
        let check = tokio::spawn(dependencies_acked(client, namespace, delivery.sequence, Arc::clone(&self.after)));
        self.received.push(Received { id: delivery.id, sequence: delivery.sequence, check });
    }

    /// Logs every delivery received, in the order received, once its check
    /// is done; then flushes the log and acks them all: a line exists for
    /// every acked delivery.
    async fn settle(&mut self) -> Result<(), Stop> {
        // On an error the rest are forgotten: still leased to this consumer
        // id, they come again on the next stream.
        for received in std::mem::take(&mut self.received) {
            let in_order = received.check.await.expect("a dependency check does not panic")?;
            let handled = Handled { sequence: received.sequence, in_order };
            self.log.write_all(handled.line().as_bytes()).await?;
            self.unacked.push(received.id);
        }
        if self.unacked.is_empty() {
            return Ok(());
        }
        self.log.flush().await?;
        let request = AckRequest { namespace: self.args.namespace.clone(), delivery_ids: self.unacked.clone() };
        self.client.ack(request).await?;
        self.unacked.clear();
        Ok(())
    }
}

/// Whether every handler in `after` has acked the event `sequence`.
async fn dependencies_acked(
    mut client: EventBusClient<Channel>,
    namespace: String,
    sequence: u64,
    after: Arc<[String]>,
) -> Result<bool, Status> {
    let mut acked = true;
    for dependency in after.iter() {
        let request =
            GetDeliveryRequest { namespace: namespace.clone(), delivery_id: format!("{sequence}:{dependency}") };
        let state = match client.get_delivery(request).await {
            Ok(found) => found.into_inner().state(),
            Err(status) if status.code() == Code::NotFound => DeliveryState::Unspecified,
            Err(status) => return Err(status),
        };
        if state != DeliveryState::Acked {
            tracing::error!(sequence, dependency, ?state, "received before a dependency acked");
            acked = false;
        }
    }
    Ok(acked)
}
