//! `ReadInbox` and `AckInbox` requests, checked and converted.

use std::{ops::RangeInclusive, time::Duration};

use chorus_proto::taskstore as pb;
use chorus_runtime::{
    grpc::namespace,
    validate::{self, FieldViolation},
};
use tonic::Status;

use super::convert;
use crate::domain::{InboxRead, Owner};

/// The most messages one read returns, and its default.
const MAX_MESSAGES: u32 = 100;
/// The bounds of a read's ack deadline.
const ACK_DEADLINES: RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(3600);
/// The most messages one `AckInbox` names.
const MAX_ACKS: usize = 100;

/// A `ReadInbox` request, checked.
pub(super) struct Read {
    pub(super) namespace: String,
    pub(super) owner: Owner,
    pub(super) max: u32,
    pub(super) wait: Duration,
    pub(super) mode: InboxRead,
}

pub(super) fn read_in(request: pb::ReadInboxRequest) -> Result<Read, Status> {
    let namespace = namespace(&request.namespace)?;
    let owner = convert::required_owner("owner", request.owner)?;
    let max = validate::count("max_messages", request.max_messages, MAX_MESSAGES, MAX_MESSAGES)?;
    let wait = validate::duration("wait", request.wait, Duration::ZERO)?;
    let mode = match (request.peek, request.ack_deadline) {
        (true, Some(_)) => return Err(FieldViolation::new("ack_deadline", "must be unset with peek").into()),
        (true, None) => InboxRead::Peek,
        (false, None) => InboxRead::Consume,
        (false, Some(deadline)) => {
            let deadline = validate::duration("ack_deadline", Some(deadline), Duration::ZERO)?;
            if !ACK_DEADLINES.contains(&deadline) {
                return Err(FieldViolation::new("ack_deadline", "must be from 1 ms to 1 h").into());
            }
            InboxRead::Hold { deadline }
        }
    };
    Ok(Read { namespace, owner, max, wait, mode })
}

/// An `AckInbox` request, checked: its namespace, owner and message ids.
pub(super) fn ack_in(request: pb::AckInboxRequest) -> Result<(String, Owner, Vec<i64>), Status> {
    let namespace = namespace(&request.namespace)?;
    let owner = convert::required_owner("owner", request.owner)?;
    if !(1..=MAX_ACKS).contains(&request.message_ids.len()) {
        return Err(FieldViolation::new("message_ids", format!("must name 1 to {MAX_ACKS} messages")).into());
    }
    let ids = request
        .message_ids
        .iter()
        .enumerate()
        .map(|(index, id)| {
            id.parse::<i64>()
                .ok()
                .filter(|id| *id > 0)
                .ok_or_else(|| FieldViolation::new(format!("message_ids[{index}]"), "must be an InboxMessage id"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((namespace, owner, ids))
}
