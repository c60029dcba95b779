//! Messaging: sends into inboxes, receives and streams out of them, acks,
//! and request/response.

use std::{sync::Arc, time::Duration};

use chorus_runtime::{
    feed::{self, forward},
    time::{micros, now_micros},
    wakeup::Waiter,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Hub, handoff::Live, keys};
use crate::{
    domain::{Audience, Content, InboxFilter, Lease, Message, MessageKind, Outgoing, Queued, Sent},
    error::{HubError, Result},
    repository::{HubRepository, OpenedStream, Take, Taken},
};

/// What a receive got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub messages: Vec<Message>,
    pub timed_out: bool,
    /// With `require_all` and a timeout: the senders that sent nothing matching.
    pub missing_senders: Vec<String>,
}

/// A receive: which messages, how many, how long to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receive {
    pub namespace: String,
    pub agent_id: String,
    pub filter: InboxFilter,
    pub require_all: bool,
    pub max: u32,
    /// Most bytes the messages taken may add up to: the first is taken
    /// whatever its size, the rest wait for the next receive.
    pub max_bytes: usize,
    pub timeout: Duration,
    pub ack_timeout: Duration,
}

/// A consumer of an agent's inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbox {
    pub namespace: String,
    pub agent_id: String,
    pub consumer_id: String,
    pub filter: InboxFilter,
    pub ack_timeout: Duration,
    pub max_in_flight: u32,
    /// The highest sequence this consumer received on its previous stream.
    pub after: Option<i64>,
}

impl Inbox {
    /// A lease taken at `now`.
    pub(super) fn lease(&self, now: i64) -> Lease {
        Lease::for_ack(&self.consumer_id, now, self.ack_timeout)
    }
}

/// What Delegate does when no reply came in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutPolicy {
    Raise,
    Retry { max_retries: u32 },
    Fallback,
}

/// A request to delegate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegation {
    pub namespace: String,
    pub sender: String,
    pub recipient: String,
    pub content: Content,
    pub timeout: Duration,
    pub on_timeout: TimeoutPolicy,
}

/// The outcome of a Delegate call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegated {
    pub correlation_id: String,
    pub reply: Option<Message>,
    pub attempts: u32,
}

impl Hub {
    /// Queues a message for its audience: straight onto the recipients'
    /// caught-up streams in this process (see [`handoff`](super::handoff)),
    /// into the inbox for the others, which it wakes.
    pub async fn send(&self, send: Outgoing) -> Result<Sent> {
        let now = now_micros();
        let mut offers = self.streams.offers(&send, now);
        let hand_offs = offers.iter().map(|(agent_id, offer)| (agent_id.clone(), offer.hand_off.clone())).collect();
        let queued = self.repository.send(&send, &hand_offs, self.config.max_queue_depth, now).await?;
        let Queued { sent, recipients, handed_off } = queued;
        self.metrics.hub_messages_sent.get().inc();
        for recipient in &recipients {
            // A stream replaced meanwhile in another process got no lease:
            // its copy waits in the inbox for the consumer's new stream.
            match offers.remove(recipient).filter(|_| handed_off.contains(recipient)) {
                Some(offer) => {
                    let message = send.leased_to(&sent, recipient, now, &offer.hand_off.lease);
                    offer.deliver(message);
                }
                None => {
                    self.streams.missed(&send.namespace, recipient);
                    self.wakeups.notify(&keys::inbox(&send.namespace, recipient));
                }
            }
        }
        Ok(sent)
    }

    /// Sends, then waits up to `confirm` for the recipient to ack; returns
    /// what was sent and whether it was acked in time.
    pub async fn send_confirmed(&self, send: Outgoing, confirm: Duration) -> Result<(Sent, bool)> {
        let (namespace, recipient) = match &send.audience {
            Audience::Agent(recipient) => (send.namespace.clone(), recipient.clone()),
            Audience::Topic(_) | Audience::Everyone { .. } => return Ok((self.send(send).await?, false)),
        };
        let sent = self.send(send).await?;
        let deadline = tokio::time::Instant::now() + confirm;
        loop {
            let mut waiter = self.wakeups.waiter(&keys::acked(&namespace, &sent.message_id));
            if !self.repository.is_queued(&namespace, &recipient, &sent.message_id).await? {
                return Ok((sent, true));
            }
            if !self.pause(&mut waiter, deadline).await? {
                return Ok((sent, false));
            }
        }
    }

    /// Waits until `deadline` at most for a signal on `waiter` (or the poll
    /// interval); false when the deadline passed. A wait the service's
    /// shutdown cuts short is [`HubError::ShuttingDown`], not a timeout.
    async fn pause(&self, waiter: &mut Waiter, deadline: tokio::time::Instant) -> Result<bool> {
        let now = tokio::time::Instant::now();
        if self.shutdown.is_cancelled() {
            return Err(HubError::ShuttingDown);
        }
        if now >= deadline {
            return Ok(false);
        }
        tokio::select! {
            () = self.shutdown.cancelled() => Err(HubError::ShuttingDown),
            () = waiter.wait(self.config.poll_interval().min(deadline - now)) => Ok(true),
        }
    }

    /// Waits up to `timeout` for matching inbox messages and leases them
    /// for `ack_timeout`. A receive that times out takes nothing.
    pub async fn receive(&self, receive: Receive) -> Result<Received> {
        let Receive { namespace, agent_id, filter, require_all, max, max_bytes, timeout, ack_timeout } = receive;
        let (namespace, agent_id) = (namespace.as_str(), agent_id.as_str());
        self.repository.get_agent(namespace, agent_id).await?;
        let consumer_id = format!("receive-{}", uuid::Uuid::now_v7());
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut waiter = self.wakeups.waiter(&keys::inbox(namespace, agent_id));
            let now = now_micros();
            let take = Take {
                namespace: namespace.to_owned(),
                agent_id: agent_id.to_owned(),
                filter: filter.clone(),
                require_all,
                max,
                max_bytes,
                lease: Lease::for_ack(&consumer_id, now, ack_timeout),
                hold_limit: None,
                stream: None,
                now,
            };
            let missing_senders = match self.repository.take(&take).await? {
                Taken::Messages(messages) if !messages.is_empty() => {
                    return Ok(Received { messages, timed_out: false, missing_senders: Vec::new() });
                }
                Taken::Messages(_) => Vec::new(),
                Taken::Missing(senders) => senders,
            };
            if !self.pause(&mut waiter, deadline).await? {
                return Ok(Received { messages: Vec::new(), timed_out: true, missing_senders });
            }
        }
    }

    /// Hands an agent's inbox messages to one consumer as they arrive.
    pub async fn stream_inbox(&self, inbox: Inbox) -> Result<ReceiverStream<Result<Message>>> {
        self.repository.get_agent(&inbox.namespace, &inbox.agent_id).await?;
        let (sender, receiver) = mpsc::channel(inbox.max_in_flight.max(1) as usize);
        let hub = self.clone();
        tokio::spawn(async move { hub.feed_inbox(inbox, sender).await });
        Ok(ReceiverStream::new(receiver))
    }

    /// Opens the consumer's stream (replacing its previous one), feeds it,
    /// and forgets it once it ends.
    async fn feed_inbox(self, inbox: Inbox, sender: mpsc::Sender<Result<Message>>) {
        let (registration, replaced) = self.streams.register(inbox.clone(), sender.clone());
        for live in replaced {
            live.offers_settled().await;
        }
        let now = now_micros();
        let lease = inbox.lease(now);
        let opened = self.repository.open_stream(&inbox.namespace, &inbox.agent_id, &lease, inbox.after, now).await;
        let OpenedStream { stream, resent, held } = match opened {
            Ok(opened) => opened,
            Err(error) => {
                let _ = sender.send(Err(error)).await;
                return;
            }
        };
        // What it holds now: what was just sent again, and what it kept.
        registration.live().hold(held);
        registration.live().opened(stream);
        self.feed(&inbox, registration.live(), stream, resent, &sender).await;
        let closed = self.repository.close_stream(&inbox.namespace, &inbox.agent_id, &inbox.consumer_id, stream).await;
        if let Err(error) = closed {
            // Harmless: the consumer's next stream replaces the row.
            tracing::debug!(%error, consumer_id = %inbox.consumer_id, "cannot forget an ended inbox stream");
        }
    }

    /// Sends `resent` again, then takes and sends new messages as they come,
    /// until the client goes, the hub stops, or the consumer opens another
    /// stream.
    async fn feed(
        &self,
        inbox: &Inbox,
        live: &Arc<Live>,
        stream: i64,
        resent: Vec<Message>,
        sender: &mpsc::Sender<Result<Message>>,
    ) {
        if !forward(Ok(resent), sender).await {
            return;
        }
        loop {
            let mut waiter = self.wakeups.waiter(&keys::inbox(&inbox.namespace, &inbox.agent_id));
            let now = now_micros();
            let misses = live.misses();
            // No room by its own count: acks made in another process may
            // have made some, which only the database knows.
            let room = live.room(now);
            let max = if room == 0 { inbox.max_in_flight } else { room };
            let take = Take {
                namespace: inbox.namespace.clone(),
                agent_id: inbox.agent_id.clone(),
                filter: inbox.filter.clone(),
                require_all: false,
                max,
                // A stream sends each message on its own.
                max_bytes: usize::MAX,
                lease: inbox.lease(now),
                hold_limit: Some(inbox.max_in_flight),
                stream: Some(stream),
                now,
            };
            let taken = self.repository.take(&take).await.map(|taken| match taken {
                Taken::Messages(messages) => messages,
                Taken::Missing(_) => Vec::new(),
            });
            if let Ok(messages) = &taken {
                live.hold(messages.iter().map(|message| (message.id.clone(), take.lease.until)));
            }
            let got = taken.as_ref().map_or(0, Vec::len);
            if !forward(taken, sender).await {
                return;
            }
            // A full take may have left more behind: take again while there
            // is room (acks wake the stream when there is none). A smaller
            // one took all there was when it read, so the stream is caught
            // up; whatever comes later signals the waiter, which was
            // created before the read.
            if got == max as usize {
                if live.room(now_micros()) > 0 {
                    continue;
                }
            } else if room > 0 {
                live.drained(misses);
            }
            // Woken for nothing: the agent may have been deregistered.
            if got == 0
                && let Err(error) = self.repository.get_agent(&inbox.namespace, &inbox.agent_id).await
            {
                let _ = sender.send(Err(error)).await;
                return;
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return feed::stopping(sender, HubError::ShuttingDown).await,
                () = sender.closed() => return,
                () = waiter.wait(self.config.poll_interval()) => {}
            }
        }
    }

    /// Removes acked messages; returns the ids that were not in the inbox.
    pub async fn ack(&self, namespace: &str, agent_id: &str, message_ids: &[String]) -> Result<Vec<String>> {
        let unknown = self.repository.ack(namespace, agent_id, message_ids, now_micros()).await?;
        for id in message_ids.iter().filter(|id| !unknown.contains(id)) {
            self.wakeups.notify(&keys::acked(namespace, id));
        }
        // Room for the stream that held them; a caught-up stream here has
        // nothing waiting to fill it with.
        if self.streams.acked(namespace, agent_id, message_ids) {
            self.wakeups.notify(&keys::inbox(namespace, agent_id));
        }
        Ok(unknown)
    }

    /// Sends a request and waits for the reply carrying its correlation id.
    pub async fn delegate(&self, delegation: Delegation) -> Result<Delegated> {
        let Delegation { namespace, sender, recipient, content, timeout, on_timeout } = delegation;
        self.repository.get_agent(&namespace, &recipient).await?;
        let correlation_id = uuid::Uuid::now_v7().to_string();
        let attempts_allowed = match on_timeout {
            TimeoutPolicy::Retry { max_retries } => max_retries.saturating_add(1),
            TimeoutPolicy::Raise | TimeoutPolicy::Fallback => 1,
        };
        let expires_at = now_micros().saturating_add(micros(timeout.saturating_mul(attempts_allowed)));
        self.repository.open_delegation(&namespace, &correlation_id, &sender, &recipient, expires_at).await?;
        let open = OpenDelegation {
            repository: Arc::clone(&self.repository),
            namespace: namespace.clone(),
            correlation_id: correlation_id.clone(),
            open: true,
        };
        let outcome = self
            .await_reply(&namespace, &sender, &recipient, &content, &correlation_id, timeout, attempts_allowed)
            .await;
        open.close().await?;
        let (reply, attempts) = outcome?;
        match (reply, on_timeout) {
            (Some(reply), _) => Ok(Delegated { correlation_id, reply: Some(reply), attempts }),
            (None, TimeoutPolicy::Fallback) => Ok(Delegated { correlation_id, reply: None, attempts }),
            (None, TimeoutPolicy::Raise | TimeoutPolicy::Retry { .. }) => {
                Err(HubError::DelegationTimedOut { correlation_id, recipient, attempts })
            }
        }
    }

    /// Sends the request up to `attempts_allowed` times, each waiting
    /// `timeout`; returns the reply (if any) and the attempts made, or
    /// `AgentNotFound` once the recipient is deregistered.
    #[expect(clippy::too_many_arguments, reason = "the parts of one delegation")]
    async fn await_reply(
        &self,
        namespace: &str,
        sender: &str,
        recipient: &str,
        content: &Content,
        correlation_id: &str,
        timeout: Duration,
        attempts_allowed: u32,
    ) -> Result<(Option<Message>, u32)> {
        for attempt in 1..=attempts_allowed {
            let deadline = tokio::time::Instant::now() + timeout;
            self.send(Outgoing {
                namespace: namespace.to_owned(),
                sender: sender.to_owned(),
                audience: Audience::Agent(recipient.to_owned()),
                kind: MessageKind::Request,
                content: content.clone(),
                correlation_id: Some(correlation_id.to_owned()),
                ttl: timeout,
                idempotency_key: None,
            })
            .await?;
            loop {
                let mut waiter = self.wakeups.waiter(&keys::reply(namespace, correlation_id));
                if let Some(reply) = self.repository.delegation_reply(namespace, correlation_id).await? {
                    return Ok((Some(reply), attempt));
                }
                if !self.pause(&mut waiter, deadline).await? {
                    break;
                }
                // A recipient deregistered meanwhile dropped the request
                // with its inbox: no reply will come, so none is waited for.
                self.repository.get_agent(namespace, recipient).await?;
            }
        }
        Ok((None, attempts_allowed))
    }

    /// Answers a delegated request.
    pub async fn reply(
        &self,
        namespace: &str,
        sender: &str,
        correlation_id: &str,
        content: Content,
    ) -> Result<Message> {
        let reply = self.repository.reply(namespace, sender, correlation_id, content, now_micros()).await?;
        self.metrics.hub_messages_sent.get().inc();
        self.wakeups.notify(&keys::reply(namespace, correlation_id));
        Ok(reply)
    }
}

/// A delegation open in the repository, closed — its requests still queued
/// withdrawn, later replies refused — however the call ends. A caller that
/// hangs up, or whose deadline passes, drops the call before its end: then
/// the close is spawned from here.
struct OpenDelegation {
    repository: Arc<dyn HubRepository>,
    namespace: String,
    correlation_id: String,
    /// Still open, as far as this call knows.
    open: bool,
}

impl OpenDelegation {
    /// Closes it now, at the call's end.
    async fn close(mut self) -> Result<()> {
        self.repository.close_delegation(&self.namespace, &self.correlation_id).await?;
        self.open = false;
        Ok(())
    }
}

impl Drop for OpenDelegation {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let (repository, namespace, id) = (
            Arc::clone(&self.repository),
            std::mem::take(&mut self.namespace),
            std::mem::take(&mut self.correlation_id),
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            if let Err(error) = repository.close_delegation(&namespace, &id).await {
                tracing::warn!(%namespace, correlation_id = %id, %error, "cannot close an abandoned delegation");
            }
        });
    }
}
