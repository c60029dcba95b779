//! The load on a running `chorus serve hub`, over gRPC, each client on a
//! connection of its own.
//!
//! Fan-out: agents `publisher` and `sub-0`…, every `sub-N` subscribed to
//! one topic and holding a StreamInbox; the publisher's Publish calls share
//! its connection, several in flight. A subscriber takes what its stream has
//! ready, up to the ack batch, and acks it in one call.
//!
//! Direct: pairs `a-N` → `b-N`; `b-N` holds a StreamInbox, and each round
//! trip is SendDirect, the message on `b-N`'s stream, `b-N`'s Ack.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use chorus_proto::hub::{self as pb, hub_client::HubClient};
use futures_util::FutureExt as _;
use tokio::time::Instant;
use tonic::{Status, Streaming, transport::Channel};

use super::{
    HubPlan,
    direct::{Pair, STEP_TIMEOUT, Trip},
    fanout::{self, Pace, Tally},
};
use crate::{
    flow::{Flow, Samples},
    load::{call, connect},
};

const TOPIC: &str = "bench.topic";
const MESSAGE_TYPE: &str = "bench.message";
const PUBLISHER: &str = "publisher";

/// Registers the agents in `namespace`, opens the subscribers' streams and
/// starts the fan-out load: subscribers first, then the publisher.
pub(crate) async fn start_fanout(endpoint: &str, namespace: &str, plan: &HubPlan, pace: Pace) -> anyhow::Result<Flow> {
    let mut client = HubClient::new(connect(endpoint).await?);
    register(&mut client, namespace, PUBLISHER).await?;
    let mut flow = Flow::new(plan.backlog * plan.subscribers, plan.warmup, plan.measure);
    for index in 0..plan.subscribers {
        let agent_id = format!("sub-{index}");
        register(&mut client, namespace, &agent_id).await?;
        let request = pb::SubscribeRequest {
            namespace: namespace.to_owned(),
            agent_id: agent_id.clone(),
            topic: TOPIC.to_owned(),
        };
        call("Subscribe", client.subscribe(request)).await?;
        let subscriber = Subscriber::open(endpoint, namespace, agent_id, plan, &flow).await?;
        flow.spawn_consumer(subscriber.run());
    }
    let publisher = HubClient::new(connect(endpoint).await?);
    let namespace = namespace.to_owned();
    let fan_out = plan.subscribers;
    flow.spawn_publisher(fanout::publish(Arc::clone(&flow.progress), pace, move |payload| {
        let mut client = publisher.clone();
        let request = pb::PublishRequest {
            namespace: namespace.clone(),
            topic: TOPIC.to_owned(),
            sender: PUBLISHER.to_owned(),
            content: Some(content(payload)),
            ..Default::default()
        };
        async move {
            let sent = call("Publish", client.publish(request)).await?;
            if sent.recipients as usize != fan_out {
                bail!("Publish reached {} inboxes, not the {fan_out} subscribers'", sent.recipients);
            }
            Ok(())
        }
    }));
    Ok(flow)
}

/// Registers pairs `a-N` → `b-N` in `namespace` and opens their clients.
pub(crate) async fn pairs(endpoint: &str, namespace: &str, count: usize) -> anyhow::Result<Vec<ChorusPair>> {
    let mut client = HubClient::new(connect(endpoint).await?);
    let mut pairs = Vec::with_capacity(count);
    for index in 0..count {
        let (from, to) = (format!("a-{index}"), format!("b-{index}"));
        register(&mut client, namespace, &from).await?;
        register(&mut client, namespace, &to).await?;
        let mut receiver = HubClient::new(connect(endpoint).await?);
        let inbox = open(&mut receiver, namespace, &to, 1).await?;
        let sender = HubClient::new(connect(endpoint).await?);
        pairs.push(ChorusPair { sender, receiver, inbox, namespace: namespace.to_owned(), from, to });
    }
    Ok(pairs)
}

async fn register(client: &mut HubClient<Channel>, namespace: &str, agent_id: &str) -> anyhow::Result<()> {
    let request = pb::RegisterAgentRequest {
        namespace: namespace.to_owned(),
        agent_id: agent_id.to_owned(),
        agent_type: "bench".to_owned(),
        ..Default::default()
    };
    call("RegisterAgent", client.register_agent(request)).await?;
    Ok(())
}

/// Opens `agent_id`'s StreamInbox, holding at most `max_in_flight`.
async fn open(
    client: &mut HubClient<Channel>,
    namespace: &str,
    agent_id: &str,
    max_in_flight: u32,
) -> anyhow::Result<Streaming<pb::Message>> {
    let request = pb::StreamInboxRequest {
        namespace: namespace.to_owned(),
        agent_id: agent_id.to_owned(),
        consumer_id: format!("{agent_id}-bench"),
        max_in_flight,
        ..Default::default()
    };
    call("StreamInbox", client.stream_inbox(request)).await
}

fn content(payload: Vec<u8>) -> pb::Content {
    pb::Content { r#type: MESSAGE_TYPE.to_owned(), payload, content_type: "application/json".to_owned() }
}

/// One subscriber of the topic.
struct Subscriber {
    client: HubClient<Channel>,
    inbox: Streaming<pb::Message>,
    namespace: String,
    agent_id: String,
    ack_batch: usize,
    tally: Tally,
}

impl Subscriber {
    async fn open(
        endpoint: &str,
        namespace: &str,
        agent_id: String,
        plan: &HubPlan,
        flow: &Flow,
    ) -> anyhow::Result<Self> {
        let mut client = HubClient::new(connect(endpoint).await?);
        let inbox = open(&mut client, namespace, &agent_id, plan.max_in_flight).await?;
        Ok(Self {
            client,
            inbox,
            namespace: namespace.to_owned(),
            agent_id,
            ack_batch: plan.ack_batch,
            tally: Tally::new(flow),
        })
    }

    /// Receives and acks until told to stop.
    async fn run(mut self) -> anyhow::Result<Samples> {
        let mut ids = Vec::with_capacity(self.ack_batch);
        let mut sent = Vec::with_capacity(self.ack_batch);
        loop {
            let message = tokio::select! {
                biased;
                () = self.tally.progress().stop_consuming.cancelled() => return Ok(self.tally.into_samples()),
                message = self.inbox.message() => message,
            };
            self.receive(message, &mut ids, &mut sent)?;
            while ids.len() < self.ack_batch {
                let Some(message) = self.inbox.message().now_or_never() else { break };
                self.receive(message, &mut ids, &mut sent)?;
            }
            let request =
                pb::AckRequest { namespace: self.namespace.clone(), agent_id: self.agent_id.clone(), message_ids: ids };
            let response = call("Ack", self.client.ack(request)).await?;
            if !response.unknown_ids.is_empty() {
                bail!("{} of {}'s acked messages were not in its inbox", response.unknown_ids.len(), self.agent_id);
            }
            self.tally.acked(&sent);
            ids = Vec::with_capacity(self.ack_batch);
            sent.clear();
        }
    }

    fn receive(
        &mut self,
        message: Result<Option<pb::Message>, Status>,
        ids: &mut Vec<String>,
        sent: &mut Vec<u64>,
    ) -> anyhow::Result<()> {
        let message = message
            .with_context(|| format!("the StreamInbox of {} failed", self.agent_id))?
            .with_context(|| format!("the StreamInbox of {} ended", self.agent_id))?;
        let payload = message.content.as_ref().map(|content| content.payload.as_slice()).unwrap_or_default();
        sent.push(self.tally.arrived(u128::from(message.sequence), payload)?);
        ids.push(message.id);
        Ok(())
    }
}

/// A sender, its receiver and the receiver's StreamInbox.
#[derive(Debug)]
pub(crate) struct ChorusPair {
    sender: HubClient<Channel>,
    receiver: HubClient<Channel>,
    inbox: Streaming<pb::Message>,
    namespace: String,
    from: String,
    to: String,
}

impl Pair for ChorusPair {
    async fn round_trip(&mut self, payload: Vec<u8>) -> anyhow::Result<Trip> {
        let request = pb::SendDirectRequest {
            namespace: self.namespace.clone(),
            sender: self.from.clone(),
            recipient: self.to.clone(),
            content: Some(content(payload)),
            ..Default::default()
        };
        call("SendDirect", self.sender.send_direct(request)).await?;
        let sent = Instant::now();
        let message = tokio::time::timeout(STEP_TIMEOUT, self.inbox.message())
            .await
            .with_context(|| format!("no message on the StreamInbox of {} within {STEP_TIMEOUT:?}", self.to))?
            .with_context(|| format!("the StreamInbox of {} failed", self.to))?
            .with_context(|| format!("the StreamInbox of {} ended", self.to))?;
        let received = Instant::now();
        let request = pb::AckRequest {
            namespace: self.namespace.clone(),
            agent_id: self.to.clone(),
            message_ids: vec![message.id],
        };
        let response = call("Ack", self.receiver.ack(request)).await?;
        if !response.unknown_ids.is_empty() {
            bail!("the message {} acked was not in its inbox", self.to);
        }
        let payload = message.content.map(|content| content.payload).unwrap_or_default();
        Ok(Trip { sent, received, payload, acked: Instant::now() })
    }
}
