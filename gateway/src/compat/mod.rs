//! A2A 0.3 compatibility for the JSON-RPC endpoint.
//!
//! The gateway speaks A2A 1.0. A request without an `A2A-Version` header, or with `0.3`, uses the
//! 0.3 method names and JSON shapes (spec §3.6.2). These pure functions translate such a request
//! into its 1.0 form and the 1.0 answer back into the 0.3 form:
//!
//! - [`method_v1`] maps the method name;
//! - [`params_to_v1`] turns 0.3 params into 1.0 params and names every malformed field;
//! - [`result_to_v03`] turns a 1.0 result into its 0.3 shape;
//! - [`stream_event_to_v03`] turns a 1.0 `StreamResponse` into a 0.3 stream event.
//!
//! Where the two versions do not map one to one:
//!
//! - A 1.0 data part may hold any JSON value, a 0.3 data part only an object. A non-object goes
//!   out as `{"value": v}` with `metadata.data_part_compat = true` (the marker a2a-python's 0.3
//!   compatibility layer uses), and an incoming data part with that marker is unwrapped again.
//! - 0.3 text and data parts have no `filename` or `mediaType`; those survive on file parts only.
//! - A 0.3 push config set without an `id` gets the task id as its id (as does one sent with a
//!   message, of any version), and a 0.3 get without
//!   `pushNotificationConfigId` asks for that id: the 0.3 SDKs' one-config-per-task default.
//! - A 1.0 push config has one authentication scheme; of several 0.3 `schemes` the first is kept.
//! - A 0.3 `tasks/pushNotificationConfig/list` result is a bare array, so `nextPageToken` is lost.
//! - A 1.0 message whose role is not `ROLE_USER` is an `"agent"` message in 0.3.

mod to_v03;
mod to_v1;

#[cfg(test)]
mod tests;

use serde_json::Value;

/// The 0.3 JSON-RPC method names and the 1.0 methods they stand for (spec §5.3). `tasks/list`
/// never was a 0.3 JSON-RPC method; its pre-1.0 draft form (`ListTasksParams`) is accepted.
const METHODS: [(&str, &str); 11] = [
    ("message/send", "SendMessage"),
    ("message/stream", "SendStreamingMessage"),
    ("tasks/get", "GetTask"),
    ("tasks/list", "ListTasks"),
    ("tasks/cancel", "CancelTask"),
    ("tasks/resubscribe", "SubscribeToTask"),
    ("tasks/pushNotificationConfig/set", "CreateTaskPushNotificationConfig"),
    ("tasks/pushNotificationConfig/get", "GetTaskPushNotificationConfig"),
    ("tasks/pushNotificationConfig/list", "ListTaskPushNotificationConfigs"),
    ("tasks/pushNotificationConfig/delete", "DeleteTaskPushNotificationConfig"),
    ("agent/getAuthenticatedExtendedCard", "GetExtendedAgentCard"),
];

/// The 0.3 task states and their 1.0 ProtoJSON names.
const STATES: [(&str, &str); 9] = [
    ("submitted", "TASK_STATE_SUBMITTED"),
    ("working", "TASK_STATE_WORKING"),
    ("input-required", "TASK_STATE_INPUT_REQUIRED"),
    ("completed", "TASK_STATE_COMPLETED"),
    ("canceled", "TASK_STATE_CANCELED"),
    ("failed", "TASK_STATE_FAILED"),
    ("rejected", "TASK_STATE_REJECTED"),
    ("auth-required", "TASK_STATE_AUTH_REQUIRED"),
    ("unknown", "TASK_STATE_UNSPECIFIED"),
];

/// The metadata key that marks a 0.3 data part as a wrapped non-object 1.0 value.
const DATA_PART_COMPAT: &str = "data_part_compat";

/// The 1.0 method name for a 0.3 JSON-RPC method name, or `None` when `method` is not one.
pub(crate) fn method_v1(method: &str) -> Option<&'static str> {
    METHODS.iter().find(|(v03, _)| *v03 == method).map(|(_, v1)| *v1)
}

/// The 1.0 params for `method_v1` (a name returned by [`method_v1`]) from 0.3 `params`.
///
/// `null` params count as `{}`. The error lists every malformed field as `path: problem`,
/// separated by `; `, ready to be the message of an InvalidParams error.
pub(crate) fn params_to_v1(method_v1: &str, params: Value) -> Result<Value, String> {
    to_v1::params(method_v1, &params)
}

/// The 0.3 shape of the 1.0 `result` of `method_v1`.
///
/// `SendMessage` answers with a bare task or message; the streaming methods convert like
/// [`stream_event_to_v03`]; push configs nest under `pushNotificationConfig`; a config list is a
/// bare array; a delete answers `null`. Agent cards, and anything not understood, pass unchanged.
pub(crate) fn result_to_v03(method_v1: &str, result: Value) -> Value {
    to_v03::result(method_v1, result)
}

/// The 0.3 stream event for a 1.0 `StreamResponse`: a task, message, `status-update` or
/// `artifact-update` object with its `kind`. A status update is `final` when its state is
/// terminal or interrupted, the states on which the server closes the stream.
pub(crate) fn stream_event_to_v03(event: Value) -> Value {
    to_v03::stream_event(event)
}
