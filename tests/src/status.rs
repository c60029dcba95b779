//! Assertions on the errors a chorus server answers with.

use std::collections::HashMap;

use prost::Message as _;
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// Asserts `outcome` failed with INVALID_ARGUMENT naming `field`, in its
/// message and as the one field of its `google.rpc.BadRequest` details.
#[track_caller]
pub fn assert_invalid<T: std::fmt::Debug>(outcome: Result<T, Status>, field: &str) {
    let status = outcome.expect_err(&format!("a request with a bad `{field}` must fail"));
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let Some(details) = status.get_details_bad_request() else {
        panic!("no google.rpc.BadRequest details in {status:?}");
    };
    let fields: Vec<&str> = details.field_violations.iter().map(|violation| violation.field.as_str()).collect();
    assert_eq!(fields, [field], "{status:?}");
    assert!(status.message().contains(field), "the message names the field: {status:?}");
}

/// Asserts `status` carries a `google.rpc.ErrorInfo` of `reason` in
/// `domain`, and returns its metadata.
#[track_caller]
pub fn assert_reason(status: &Status, domain: &str, reason: &str) -> HashMap<String, String> {
    let Some(info) = status.get_details_error_info() else {
        panic!("no google.rpc.ErrorInfo in {status:?}");
    };
    assert_eq!((info.domain.as_str(), info.reason.as_str()), (domain, reason), "{status:?}");
    info.metadata
}

/// The detail of `status` of the type `name` (`chorus.hub.v1.StateConflict`, ...), decoded.
#[track_caller]
pub fn detail<M: prost::Message + Default>(status: &Status, name: &str) -> M {
    let details =
        tonic_types::Status::decode(status.details()).expect("grpc-status-details-bin is a google.rpc.Status");
    assert_eq!(details.code, status.code() as i32, "{details:?}");
    let type_url = format!("type.googleapis.com/{name}");
    let Some(detail) = details.details.iter().find(|detail| detail.type_url == type_url) else {
        panic!("no {name} among the details: {details:?}");
    };
    M::decode(detail.value.as_slice()).unwrap_or_else(|error| panic!("not a {name}: {error}"))
}
