//! Handlers inside the process (the workflow engine's triggers, ...): the
//! same registration, ordering, retries and dead letters as remote handlers,
//! without the wire.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use futures_util::StreamExt as _;
use tokio::task::JoinHandle;

use super::{EventBus, Subscription};
use crate::{
    domain::{Delivery, Event, HandlerSpec, Nack},
    error::{EventBusError, Result},
};

/// Deliveries an in-process handler holds at once.
const PREFETCH: u32 = 16;

/// A failed attempt of an in-process handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerFailure {
    pub message: String,
    /// Dead-letter at once instead of retrying.
    pub permanent: bool,
}

impl HandlerFailure {
    /// A failure worth retrying under the handler's retry policy.
    pub fn retry(message: impl Into<String>) -> Self {
        Self { message: message.into(), permanent: false }
    }

    /// A failure no retry will fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self { message: message.into(), permanent: true }
    }
}

/// Code that handles events inside the process.
#[async_trait]
pub trait EventHandler: Send + Sync + 'static {
    async fn handle(&self, event: &Event) -> Result<(), HandlerFailure>;
}

impl EventBus {
    /// Registers `spec` and runs `handler` on its deliveries, one at a time
    /// in delivery order, until shutdown (or until the returned task is
    /// aborted). A broken stream is reopened after a pause; deliveries left
    /// unacked by a crash come back after their visibility timeout.
    pub async fn run_handler(
        &self,
        spec: HandlerSpec,
        consumer_id: &str,
        handler: Arc<dyn EventHandler>,
    ) -> Result<JoinHandle<()>> {
        let registered = self.register_handler(spec).await?;
        let subscription = Subscription {
            namespace: registered.namespace,
            handler: registered.name,
            consumer_id: consumer_id.to_owned(),
            max_in_flight: PREFETCH,
            after: None,
        };
        let bus = self.clone();
        Ok(tokio::spawn(async move { bus.drive(subscription, handler).await }))
    }

    async fn drive(self, subscription: Subscription, handler: Arc<dyn EventHandler>) {
        let pause = self.config.poll_interval();
        while !self.shutdown.is_cancelled() {
            match self.drive_once(&subscription, handler.as_ref()).await {
                Err(EventBusError::HandlerNotFound(_)) => {
                    tracing::info!(handler = %subscription.handler, "handler deregistered; stopping it");
                    return;
                }
                Err(error) => {
                    tracing::warn!(handler = %subscription.handler, %error, "handler stream broke; reopening")
                }
                Ok(()) => {}
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    async fn drive_once(&self, subscription: &Subscription, handler: &dyn EventHandler) -> Result<()> {
        let mut deliveries = self.subscribe(subscription.clone()).await?;
        loop {
            let delivery = tokio::select! {
                () = self.shutdown.cancelled() => return Ok(()),
                next = deliveries.next() => match next {
                    Some(delivery) => delivery?,
                    None => return Ok(()),
                },
            };
            self.handle_one(&subscription.namespace, delivery, handler).await?;
        }
    }

    async fn handle_one(&self, namespace: &str, delivery: Delivery, handler: &dyn EventHandler) -> Result<()> {
        let Some(event) = &delivery.event else {
            return Err(EventBusError::Corrupt(format!("delivery {} came without its event", delivery.id)));
        };
        match handler.handle(event).await {
            Ok(()) => self.ack(namespace, std::slice::from_ref(&delivery.id)).await,
            Err(failure) => {
                tracing::debug!(delivery = %delivery.id, error = %failure.message, "handler failed");
                let nack = Nack {
                    error: failure.message,
                    retry_delay: None::<Duration>,
                    dead_letter: failure.permanent,
                    attempt: Some(delivery.attempt),
                };
                match self.nack(namespace, &delivery.id, nack).await {
                    // The lease ran out meanwhile: the attempt is already counted.
                    Ok(_)
                    | Err(
                        EventBusError::NotInFlight { .. }
                        | EventBusError::DeliveryFinished { .. }
                        | EventBusError::AttemptOver { .. },
                    ) => Ok(()),
                    Err(error) => Err(error),
                }
            }
        }
    }
}
