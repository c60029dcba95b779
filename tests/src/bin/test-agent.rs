//! A hub agent process for end-to-end tests: a worker of the TEA
//! coordinator–worker example (the coordinator is the test, over gRPC).
//!
//! `test-agent --server URL --namespace NS --agent-id ID --consumer-id ID
//! --log PATH [--agent-type worker] [--capabilities a,b] [--topics a,b]
//! [--heartbeat-ms N]`
//!
//! Registers the agent (a restarted process updates the same
//! registration), subscribes it to its topics, heartbeats every
//! `--heartbeat-ms`, opens a StreamInbox as `--consumer-id`, then prints
//! `test-agent ready` on stdout. Each message, in the order received, is
//! appended to its log (kind, delivery attempt, id, correlation id), the log
//! flushed, answered with the payload reversed — a request (KIND_REQUEST)
//! with Reply, any other message with a `job.done` SendDirect back to its
//! sender carrying the message's correlation id — and then acked. When its
//! stream fails or ends it opens it again, with backoff. Logs go to stderr.

use std::{path::PathBuf, time::Duration};

use chorus_proto::hub::{
    AckRequest, Content, HeartbeatRequest, Message, RegisterAgentRequest, ReplyRequest, SendDirectRequest,
    StreamInboxRequest, SubscribeRequest, hub_client::HubClient, message::Kind,
};
use chorus_runtime::telemetry::{self, TelemetryConfig};
use chorus_tests::{
    agent::{DONE, Handled, READY, answer},
    process::Stop,
};
use clap::Parser;
use tokio::{
    fs::{File, OpenOptions},
    io::{AsyncWriteExt as _, BufWriter},
};
use tonic::{
    Code, Status, Streaming,
    transport::{Channel, Endpoint},
};

/// First pause before opening the stream again after a failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The media type of every answer.
const TEXT: &str = "text/plain";

#[derive(Debug, Parser)]
#[command(name = "test-agent", about = "A chorus hub worker agent for end-to-end tests")]
struct Args {
    /// The hub to work for.
    #[arg(long)]
    server: String,
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    agent_id: String,
    #[arg(long, default_value = "worker")]
    agent_type: String,
    /// What the agent registers as able to do.
    #[arg(long, value_delimiter = ',')]
    capabilities: Vec<String>,
    /// Topics to subscribe to.
    #[arg(long, value_delimiter = ',')]
    topics: Vec<String>,
    /// Whom the inbox leases belong to: the same for every process of the agent.
    #[arg(long)]
    consumer_id: String,
    /// The file every message handled is appended to.
    #[arg(long)]
    log: PathBuf,
    /// How often to heartbeat.
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = telemetry::init("test-agent", &TelemetryConfig::default())?;
    let channel = Endpoint::from_shared(args.server.clone())?.connect_timeout(Duration::from_secs(5)).connect_lazy();
    let mut client = HubClient::new(channel);
    let log = BufWriter::new(OpenOptions::new().create(true).append(true).open(&args.log).await?);
    register(&mut client, &args).await?;
    for topic in &args.topics {
        let request = SubscribeRequest {
            namespace: args.namespace.clone(),
            agent_id: args.agent_id.clone(),
            topic: topic.clone(),
        };
        client.subscribe(request).await?;
    }
    let beat = HeartbeatRequest { namespace: args.namespace.clone(), agent_id: args.agent_id.clone() };
    tokio::spawn(heartbeat(client.clone(), beat, Duration::from_millis(args.heartbeat_ms.max(1))));
    let mut agent = Agent { client, args, log };
    let mut ready = false;
    let mut backoff = FIRST_BACKOFF;
    loop {
        match agent.open().await {
            Ok(stream) => {
                if !ready {
                    println!("{READY}");
                    ready = true;
                }
                match agent.consume(stream, &mut backoff).await {
                    Ok(()) => tracing::warn!("the inbox stream ended"),
                    Err(Stop::Grpc(status)) => {
                        tracing::warn!(code = ?status.code(), message = status.message(), "consuming failed")
                    }
                    Err(Stop::Log(error)) => return Err(anyhow::Error::new(error).context("cannot write the log")),
                }
            }
            Err(status) => tracing::warn!(code = ?status.code(), message = status.message(), "cannot open the inbox"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Registers the agent, waiting for the server to come up.
async fn register(client: &mut HubClient<Channel>, args: &Args) -> Result<(), Status> {
    let request = RegisterAgentRequest {
        namespace: args.namespace.clone(),
        agent_id: args.agent_id.clone(),
        agent_type: args.agent_type.clone(),
        capabilities: args.capabilities.clone(),
        ..RegisterAgentRequest::default()
    };
    let mut backoff = FIRST_BACKOFF;
    loop {
        match client.register_agent(request.clone()).await {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == Code::Unavailable => {
                tracing::warn!(message = status.message(), "the hub is unavailable; registering again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(status) => return Err(status),
        }
    }
}

/// Heartbeats every `every`, for as long as the process lives.
async fn heartbeat(mut client: HubClient<Channel>, request: HeartbeatRequest, every: Duration) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if let Err(status) = client.heartbeat(request.clone()).await {
            tracing::warn!(code = ?status.code(), message = status.message(), "heartbeat failed");
        }
    }
}

struct Agent {
    client: HubClient<Channel>,
    args: Args,
    log: BufWriter<File>,
}

impl Agent {
    /// Opens the agent's inbox stream as its consumer id.
    async fn open(&mut self) -> Result<Streaming<Message>, Status> {
        let request = StreamInboxRequest {
            namespace: self.args.namespace.clone(),
            agent_id: self.args.agent_id.clone(),
            consumer_id: self.args.consumer_id.clone(),
            // Unset, not the highest sequence in the log of a previous life:
            // a cursor tells the hub that this consumer still holds its
            // messages leased at or below it, so they would stay leased
            // until their lease ran out. A new process holds nothing: the
            // message the dead one logged but had not acked, and those it
            // had received but not handled yet (sequences are namespace-wide
            // and a message whose lease ran out comes again below newer
            // ones, so these can lie below the log's highest sequence), are
            // all to be handled again at once. Unset, every message still
            // leased to this consumer id is sent again at once: a message
            // logged but unacked is logged twice, which at-least-once
            // allows (its answer is not repeated: see `report_done`). Within
            // one life, a message is acked before the next is read, so after
            // a failed stream everything leased to this consumer is
            // unhandled, and unset is exact.
            after_sequence: None,
            ..StreamInboxRequest::default()
        };
        Ok(self.client.stream_inbox(request).await?.into_inner())
    }

    /// Handles what one stream hands out, until it fails or ends; resets
    /// `backoff` once it delivers.
    async fn consume(&mut self, mut stream: Streaming<Message>, backoff: &mut Duration) -> Result<(), Stop> {
        while let Some(message) = stream.message().await? {
            *backoff = FIRST_BACKOFF;
            self.handle(message).await?;
        }
        Ok(())
    }

    /// Logs the message (flushed), answers it, then acks it: a line exists
    /// for every message acked.
    async fn handle(&mut self, message: Message) -> Result<(), Stop> {
        let handled = Handled {
            kind: message.kind(),
            attempt: message.delivery_attempt,
            id: message.id.clone(),
            job: message.correlation_id.clone(),
        };
        self.log.write_all(handled.line().as_bytes()).await?;
        self.log.flush().await?;
        let payload = answer(message.content.as_ref().map_or(&[], |content| content.payload.as_slice()));
        let content = Content { r#type: DONE.to_owned(), payload, content_type: TEXT.to_owned() };
        match handled.kind {
            Kind::Request => self.reply(&message, content).await?,
            // A reply (and an unspecified kind) is never queued in an
            // inbox; were one handed out, it would be answered like a job.
            Kind::Topic | Kind::Direct | Kind::Broadcast | Kind::Reply | Kind::Unspecified => {
                self.report_done(&message, content).await?
            }
        }
        let ack = AckRequest {
            namespace: self.args.namespace.clone(),
            agent_id: self.args.agent_id.clone(),
            message_ids: vec![message.id],
        };
        // An answered request has left the inbox already: its id comes back
        // as unknown, which is fine.
        self.client.ack(ack).await?;
        Ok(())
    }

    /// Answers a delegated request.
    async fn reply(&mut self, request: &Message, content: Content) -> Result<(), Status> {
        let reply = ReplyRequest {
            namespace: self.args.namespace.clone(),
            sender: self.args.agent_id.clone(),
            correlation_id: request.correlation_id.clone(),
            content: Some(content),
        };
        match self.client.reply(reply).await {
            Ok(_) => Ok(()),
            // The Delegate call is over (timed out, or already answered by
            // an earlier life of this agent): nobody waits for an answer.
            Err(status) if status.code() == Code::FailedPrecondition => {
                tracing::warn!(correlation_id = request.correlation_id, message = status.message(), "reply refused");
                Ok(())
            }
            Err(status) => Err(status),
        }
    }

    /// Tells the sender the job is done, under the job's correlation id
    /// (the message id when it has none).
    async fn report_done(&mut self, job: &Message, content: Content) -> Result<(), Status> {
        let correlation_id = if job.correlation_id.is_empty() { job.id.clone() } else { job.correlation_id.clone() };
        let done = SendDirectRequest {
            namespace: self.args.namespace.clone(),
            sender: self.args.agent_id.clone(),
            recipient: job.sender.clone(),
            content: Some(content),
            correlation_id,
            // However often the job comes (at least once), the hub queues
            // its answer once.
            idempotency_key: format!("{}/{}", self.args.agent_id, job.id),
            ..SendDirectRequest::default()
        };
        match self.client.send_direct(done).await {
            Ok(_) => Ok(()),
            // The sender left (deregistered): nobody to tell.
            Err(status) if status.code() == Code::NotFound => {
                tracing::warn!(sender = job.sender, message = status.message(), "the job's sender is gone");
                Ok(())
            }
            Err(status) => Err(status),
        }
    }
}
