//! The gRPC handlers: validate and convert the request, call the service,
//! convert the answer. No logic of their own.

use chorus_proto::eventbus::{self as pb, event_bus_server::EventBusServer};
use chorus_runtime::{
    grpc::{ResponseStream, fitting, namespace, stream_of},
    time::timestamp,
    validate::{self, FieldViolation},
};
use tonic::{Request, Response, Status};

use super::convert::{self, MAX_BATCH};
use crate::{
    domain::{DeliveryId, DeliveryPage, DeliveryQuery, DeliveryState, EventPage, EventQuery, HandlerSpec, Nack},
    service::{EventBus, Subscription},
};

const DEFAULT_EVENT_PAGE: u32 = 100;
const MAX_EVENT_PAGE: u32 = 1000;
const DEFAULT_IN_FLIGHT: u32 = 10;
const MAX_IN_FLIGHT: u32 = 1000;

/// The `chorus.eventbus.v1.EventBus` service over an [`EventBus`].
#[derive(Debug, Clone)]
pub struct EventBusGrpc {
    bus: EventBus,
    /// How large a page of events may grow on the wire.
    max_message_bytes: usize,
}

impl EventBusGrpc {
    pub fn new(bus: EventBus) -> Self {
        Self { bus, max_message_bytes: usize::MAX }
    }

    /// The tonic server, accepting requests up to `max_message_bytes`, and
    /// answering pages of events no larger.
    pub fn into_server(self, max_message_bytes: usize) -> EventBusServer<Self> {
        EventBusServer::new(Self { max_message_bytes, ..self }).max_decoding_message_size(max_message_bytes)
    }

    fn max_payload(&self) -> usize {
        self.bus.config().max_payload_bytes
    }
}

/// The page's events on the wire, as many as fit in `budget` bytes (at
/// least one): a page cut short continues after its last event. Events of up
/// to `max_payload_bytes` each would otherwise make a page no gRPC client
/// with the default 4 MiB limit can read.
fn fit_page(page: EventPage, budget: usize) -> pb::ReadEventsResponse {
    let mut next_after = page.next_after;
    let mut events: Vec<pb::Event> = page.events.into_iter().map(convert::event).collect();
    let fit = fitting(events.iter().map(prost::Message::encoded_len), budget);
    if fit < events.len() {
        events.truncate(fit);
        next_after = i64::try_from(events[fit - 1].sequence).unwrap_or(next_after);
    }
    pb::ReadEventsResponse {
        events,
        next_after_sequence: u64::try_from(next_after).unwrap_or_default(),
        head_sequence: u64::try_from(page.head).unwrap_or_default(),
    }
}

/// The page's deliveries on the wire, as many as fit in `budget` bytes (at
/// least one), and the token of the page after them. With their events,
/// deliveries are as large as those, as `fit_page` says of events.
fn fit_deliveries(page: DeliveryPage, budget: usize) -> (Vec<pb::Delivery>, String) {
    let mut next = page.next.map(|id| id.to_string());
    let mut deliveries: Vec<pb::Delivery> = page.deliveries.into_iter().map(convert::delivery).collect();
    let fit = fitting(deliveries.iter().map(prost::Message::encoded_len), budget);
    if fit < deliveries.len() {
        deliveries.truncate(fit);
        next = Some(deliveries[fit - 1].id.clone());
    }
    (deliveries, next.map(|id| convert::page_token(&id)).unwrap_or_default())
}

#[tonic::async_trait]
impl pb::event_bus_server::EventBus for EventBusGrpc {
    async fn publish(&self, request: Request<pb::PublishRequest>) -> Result<Response<pb::PublishResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let event = convert::new_event("event", request.event, self.max_payload())?;
        let published = self.bus.publish(&namespace, vec![event]).await?;
        let first = published.into_iter().next().ok_or_else(|| Status::internal("publish returned nothing"))?;
        Ok(Response::new(convert::published(first)))
    }

    async fn publish_batch(
        &self,
        request: Request<pb::PublishBatchRequest>,
    ) -> Result<Response<pb::PublishBatchResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        if request.events.is_empty() || request.events.len() > MAX_BATCH {
            return Err(FieldViolation::new("events", format!("must hold 1-{MAX_BATCH} events")).into());
        }
        let events = request
            .events
            .into_iter()
            .enumerate()
            .map(|(n, event)| convert::new_event(&format!("events[{n}]"), Some(event), self.max_payload()))
            .collect::<Result<Vec<_>, _>>()?;
        let published = self.bus.publish(&namespace, events).await?;
        Ok(Response::new(pb::PublishBatchResponse { results: published.into_iter().map(convert::published).collect() }))
    }

    async fn read_events(
        &self,
        request: Request<pb::ReadEventsRequest>,
    ) -> Result<Response<pb::ReadEventsResponse>, Status> {
        let request = request.into_inner();
        let query = EventQuery {
            namespace: namespace(&request.namespace)?,
            after: convert::sequence("after_sequence", request.after_sequence)?,
            types: convert::patterns("event_types", &request.event_types)?,
            limit: validate::count("page_size", request.page_size, DEFAULT_EVENT_PAGE, MAX_EVENT_PAGE)?,
        };
        let page = self.bus.read_events(&query).await?;
        Ok(Response::new(fit_page(page, self.max_message_bytes)))
    }

    type StreamEventsStream = ResponseStream<pb::Event>;

    async fn stream_events(
        &self,
        request: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let after = request.after_sequence.map(|after| convert::sequence("after_sequence", after)).transpose()?;
        let types = convert::patterns("event_types", &request.event_types)?;
        let events = self.bus.stream_events(&namespace, after, types).await?;
        Ok(Response::new(stream_of(events, convert::event)))
    }

    async fn register_handler(
        &self,
        request: Request<pb::RegisterHandlerRequest>,
    ) -> Result<Response<pb::Handler>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        if request.event_types.is_empty() {
            return Err(FieldViolation::required("event_types").into());
        }
        // A name given twice is one dependency, kept once.
        let mut after: Vec<String> = Vec::with_capacity(request.after.len());
        for (n, name) in request.after.iter().enumerate() {
            let name = convert::handler_name(&format!("after[{n}]"), name)?;
            if !after.contains(&name) {
                after.push(name);
            }
        }
        let spec = HandlerSpec {
            name: convert::handler_name("name", &request.name)?,
            event_types: convert::patterns("event_types", &request.event_types)?,
            after,
            failure_policy: convert::failure_policy(request.failure_policy)?,
            retry: convert::retry_policy(request.retry_policy, self.bus.config())?,
            start_after: request
                .start_after_sequence
                .map(|after| convert::sequence("start_after_sequence", after))
                .transpose()?,
            namespace,
        };
        let handler = self.bus.register_handler(spec).await?;
        let view = self.bus.get_handler(&handler.namespace, &handler.name).await?;
        Ok(Response::new(convert::handler(view)))
    }

    async fn deregister_handler(
        &self,
        request: Request<pb::DeregisterHandlerRequest>,
    ) -> Result<Response<pb::DeregisterHandlerResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        self.bus.deregister_handler(&namespace, &convert::handler_name("name", &request.name)?).await?;
        Ok(Response::new(pb::DeregisterHandlerResponse {}))
    }

    async fn get_handler(&self, request: Request<pb::GetHandlerRequest>) -> Result<Response<pb::Handler>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let view = self.bus.get_handler(&namespace, &convert::handler_name("name", &request.name)?).await?;
        Ok(Response::new(convert::handler(view)))
    }

    async fn list_handlers(
        &self,
        request: Request<pb::ListHandlersRequest>,
    ) -> Result<Response<pb::ListHandlersResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let size = validate::count("page_size", request.page_size, 100, 100)? as usize;
        let after = convert::parse_page_token("page_token", &request.page_token)?;
        let views = self.bus.list_handlers(&namespace).await?;
        let start = match &after {
            Some(name) => views.iter().position(|view| &view.handler.name == name).map_or(views.len(), |at| at + 1),
            None => 0,
        };
        let page: Vec<_> = views.into_iter().skip(start).collect();
        let more = page.len() > size;
        let page: Vec<_> = page.into_iter().take(size).collect();
        let next_page_token = if more {
            page.last().map(|view| convert::page_token(&view.handler.name)).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListHandlersResponse {
            handlers: page.into_iter().map(convert::handler).collect(),
            next_page_token,
        }))
    }

    type SubscribeStream = ResponseStream<pb::Delivery>;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let request = request.into_inner();
        let subscription = Subscription {
            namespace: namespace(&request.namespace)?,
            handler: convert::handler_name("handler", &request.handler)?,
            consumer_id: validate::id("consumer_id", &request.consumer_id)?,
            max_in_flight: validate::count("max_in_flight", request.max_in_flight, DEFAULT_IN_FLIGHT, MAX_IN_FLIGHT)?,
            after: request.after_sequence.map(|after| convert::sequence("after_sequence", after)).transpose()?,
        };
        let deliveries = self.bus.subscribe(subscription).await?;
        Ok(Response::new(stream_of(deliveries, convert::delivery)))
    }

    async fn ack(&self, request: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let ids = convert::delivery_ids("delivery_ids", &request.delivery_ids, true)?;
        self.bus.ack(&namespace, &ids).await?;
        Ok(Response::new(pb::AckResponse {}))
    }

    async fn nack(&self, request: Request<pb::NackRequest>) -> Result<Response<pb::NackResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let id = convert::delivery_id("delivery_id", &request.delivery_id)?;
        let nack = Nack {
            error: convert::failure(request.error),
            retry_delay: request
                .retry_delay
                .map(|delay| validate::duration("retry_delay", Some(delay), Default::default()))
                .transpose()?,
            dead_letter: request.dead_letter,
            attempt: (request.attempt != 0).then_some(request.attempt),
        };
        let delivery = self.bus.nack(&namespace, &id, nack).await?;
        Ok(Response::new(pb::NackResponse {
            state: convert::delivery_state_out(delivery.state).into(),
            next_attempt_at: delivery.next_attempt_at.map(timestamp),
        }))
    }

    async fn extend_delivery(
        &self,
        request: Request<pb::ExtendDeliveryRequest>,
    ) -> Result<Response<pb::ExtendDeliveryResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let id = convert::delivery_id("delivery_id", &request.delivery_id)?;
        let extension = request
            .extension
            .map(|extension| validate::duration("extension", Some(extension), Default::default()))
            .transpose()?
            .filter(|extension| !extension.is_zero())
            .map(|extension| convert::lease("extension", extension))
            .transpose()?;
        let attempt = (request.attempt != 0).then_some(request.attempt);
        let until = self.bus.extend(&namespace, &id, extension, attempt).await?;
        Ok(Response::new(pb::ExtendDeliveryResponse { visible_until: Some(timestamp(until)) }))
    }

    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let request = request.into_inner();
        let query = DeliveryQuery {
            namespace: namespace(&request.namespace)?,
            handler: optional_handler(&request.handler)?,
            sequence: None,
            states: vec![DeliveryState::DeadLettered],
            include_events: true,
            after: delivery_cursor(&request.page_token)?,
            limit: validate::count("page_size", request.page_size, 50, 100)?,
        };
        let page = self.bus.list_deliveries(&query).await?;
        let (deliveries, next_page_token) = fit_deliveries(page, self.max_message_bytes);
        Ok(Response::new(pb::ListDeadLettersResponse { deliveries, next_page_token }))
    }

    async fn replay_dead_letters(
        &self,
        request: Request<pb::ReplayDeadLettersRequest>,
    ) -> Result<Response<pb::ReplayDeadLettersResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let handler = convert::handler_name("handler", &request.handler)?;
        let ids = convert::delivery_ids("delivery_ids", &request.delivery_ids, false)?;
        let replayed =
            self.bus.replay_dead_letters(&namespace, &handler, &ids, request.rearm_skipped_dependents).await?;
        Ok(Response::new(pb::ReplayDeadLettersResponse { replayed: replayed.replayed, rearmed: replayed.rearmed }))
    }

    async fn replay(&self, request: Request<pb::ReplayRequest>) -> Result<Response<pb::ReplayResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let handler = convert::handler_name("handler", &request.handler)?;
        let from = convert::sequence("from_sequence", request.from_sequence)?.max(1);
        let to = request.to_sequence.map(|to| convert::sequence("to_sequence", to)).transpose()?;
        if to.is_some_and(|to| to < from) {
            return Err(FieldViolation::new("to_sequence", "must not be below from_sequence").into());
        }
        let replayed = self.bus.replay(&namespace, &handler, from, to).await?;
        Ok(Response::new(pb::ReplayResponse { replayed }))
    }

    async fn get_delivery(&self, request: Request<pb::GetDeliveryRequest>) -> Result<Response<pb::Delivery>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let id = convert::delivery_id("delivery_id", &request.delivery_id)?;
        Ok(Response::new(convert::delivery(self.bus.get_delivery(&namespace, &id).await?)))
    }

    async fn list_deliveries(
        &self,
        request: Request<pb::ListDeliveriesRequest>,
    ) -> Result<Response<pb::ListDeliveriesResponse>, Status> {
        let request = request.into_inner();
        let states = request
            .states
            .iter()
            .enumerate()
            .map(|(n, state)| convert::delivery_state(&format!("states[{n}]"), *state))
            .collect::<Result<Vec<_>, _>>()?;
        let query = DeliveryQuery {
            namespace: namespace(&request.namespace)?,
            handler: optional_handler(&request.handler)?,
            sequence: request.sequence.map(|sequence| convert::sequence("sequence", sequence)).transpose()?,
            states,
            include_events: request.include_events,
            after: delivery_cursor(&request.page_token)?,
            limit: validate::count("page_size", request.page_size, 50, 100)?,
        };
        let page = self.bus.list_deliveries(&query).await?;
        let (deliveries, next_page_token) = fit_deliveries(page, self.max_message_bytes);
        Ok(Response::new(pb::ListDeliveriesResponse { deliveries, next_page_token }))
    }
}

fn optional_handler(value: &str) -> Result<Option<String>, FieldViolation> {
    if value.is_empty() { Ok(None) } else { convert::handler_name("handler", value).map(Some) }
}

fn delivery_cursor(token: &str) -> Result<Option<DeliveryId>, FieldViolation> {
    let bad = || FieldViolation::new("page_token", "is not a page token this service handed out");
    convert::parse_page_token("page_token", token)?.map(|id| id.parse().map_err(|()| bad())).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Delivery, Event};

    fn page(payloads: &[usize]) -> EventPage {
        let event = |index: usize, bytes: usize| Event {
            namespace: "ns".to_owned(),
            sequence: i64::try_from(index).unwrap() + 1,
            event_type: "t".to_owned(),
            source: String::new(),
            subject: String::new(),
            payload: vec![b'x'; bytes],
            content_type: String::new(),
            attributes: std::collections::BTreeMap::new(),
            idempotency_key: None,
            time: 0,
            published_at: 0,
        };
        let events: Vec<Event> = payloads.iter().enumerate().map(|(index, bytes)| event(index, *bytes)).collect();
        EventPage { next_after: 40, head: 50, events }
    }

    #[test]
    fn a_page_of_large_events_is_cut_to_the_budget_and_continues_after_its_last() {
        let cut = fit_page(page(&[1 << 20; 5]), 4 << 20);
        assert_eq!(cut.events.len(), 3);
        assert_eq!((cut.next_after_sequence, cut.head_sequence), (3, 50));
        let whole = fit_page(page(&[10; 5]), 4 << 20);
        assert_eq!((whole.events.len(), whole.next_after_sequence), (5, 40), "a page that fits keeps its cursor");
        let alone = fit_page(page(&[5 << 20, 10]), 4 << 20);
        assert_eq!((alone.events.len(), alone.next_after_sequence), (1, 1), "one event, however large, goes");
    }

    #[test]
    fn deliveries_with_large_events_are_cut_to_the_budget_and_continue_after_the_last() {
        let deliveries = |payloads: &[usize]| DeliveryPage {
            next: Some(DeliveryId { sequence: 40, handler: "h".to_owned() }),
            deliveries: page(payloads)
                .events
                .into_iter()
                .map(|event| Delivery {
                    namespace: "ns".to_owned(),
                    id: DeliveryId { sequence: event.sequence, handler: "h".to_owned() },
                    state: DeliveryState::DeadLettered,
                    attempt: 3,
                    consumer_id: None,
                    visible_until: None,
                    next_attempt_at: None,
                    last_error: Some("boom".to_owned()),
                    skip_reason: None,
                    created_at: 0,
                    updated_at: 0,
                    finished_at: Some(0),
                    event: Some(event),
                })
                .collect(),
        };
        let token = |id: &str| convert::page_token(id);
        let (cut, next) = fit_deliveries(deliveries(&[1 << 20; 5]), 4 << 20);
        assert_eq!((cut.len(), next), (3, token("3:h")));
        let (whole, next) = fit_deliveries(deliveries(&[10; 5]), 4 << 20);
        assert_eq!((whole.len(), next), (5, token("40:h")), "a page that fits keeps its token");
        let (alone, next) = fit_deliveries(deliveries(&[5 << 20, 10]), 4 << 20);
        assert_eq!((alone.len(), next), (1, token("1:h")), "one delivery, however large, goes");
    }
}
