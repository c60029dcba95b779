//! Assertions on the errors a chorus server answers with.

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
