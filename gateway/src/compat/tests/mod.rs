//! Exact-JSON tests of the A2A 0.3 compatibility conversions.

use serde_json::{Value, json};

use super::{method_v1, params_to_v1, result_to_v03, stream_event_to_v03};

/// The 1.0 form of one 0.3 part, sent as the only part of a `message/send`.
fn part_v1(part: Value) -> Result<Value, String> {
    let params = json!({ "message": { "messageId": "m", "role": "user", "parts": [part] } });
    params_to_v1("SendMessage", params).map(|v| v["message"]["parts"][0].clone())
}

/// The 0.3 form of one 1.0 part, received as the only part of a `SendMessage` answer.
fn part_v03(part: Value) -> Value {
    let result = json!({ "message": { "messageId": "m", "role": "ROLE_AGENT", "parts": [part] } });
    result_to_v03("SendMessage", result)["parts"][0].clone()
}

/// The problems reported for `message/send` params whose message is `message`.
fn message_error(message: Value) -> String {
    params_to_v1("SendMessage", json!({ "message": message })).unwrap_err()
}

/// Each 0.3 method name maps to its 1.0 name, and nothing else maps.
#[test]
fn every_03_method_maps_to_its_10_name() {
    let pairs = [
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
    for (v03, v1) in pairs {
        assert_eq!(method_v1(v03), Some(v1), "{v03}");
    }
    for not_03 in ["SendMessage", "message/send/", "tasks/pushNotificationConfig", "MESSAGE/SEND", ""] {
        assert_eq!(method_v1(not_03), None, "{not_03}");
    }
}

/// `message/send` params become a request a2a-lf parses, and a task answer comes back bare.
#[test]
fn message_send_round_trip_with_a_task_result() {
    let params = json!({
        "message": {
            "kind": "message", "messageId": "m1", "role": "user", "contextId": "c1",
            "referenceTaskIds": ["t0"], "extensions": ["urn:x"], "metadata": { "trace": "a" },
            "parts": [{ "kind": "text", "text": "hello" }],
        },
        "configuration": {
            "acceptedOutputModes": ["text/plain"], "blocking": true, "historyLength": 5,
            "pushNotificationConfig": {
                "url": "https://hook.example/a", "token": "tok",
                "authentication": { "schemes": ["Bearer"], "credentials": "secret" },
            },
        },
        "metadata": { "k": 1 },
    });
    let v1 = params_to_v1("SendMessage", params).unwrap();
    assert_eq!(
        v1,
        json!({
            "message": {
                "messageId": "m1", "role": "ROLE_USER", "contextId": "c1",
                "referenceTaskIds": ["t0"], "extensions": ["urn:x"], "metadata": { "trace": "a" },
                "parts": [{ "text": "hello" }],
            },
            "configuration": {
                "acceptedOutputModes": ["text/plain"], "returnImmediately": false, "historyLength": 5,
                "taskPushNotificationConfig": {
                    "url": "https://hook.example/a", "token": "tok",
                    "authentication": { "scheme": "Bearer", "credentials": "secret" },
                },
            },
            "metadata": { "k": 1 },
        })
    );
    let request: a2a::SendMessageRequest = serde_json::from_value(v1).unwrap();
    assert_eq!(request.configuration.unwrap().return_immediately, Some(false));

    let result = json!({ "task": {
        "id": "t1", "contextId": "c1",
        "status": {
            "state": "TASK_STATE_COMPLETED", "timestamp": "2026-01-01T00:00:00Z",
            "message": { "messageId": "m2", "role": "ROLE_AGENT", "parts": [{ "text": "done" }] },
        },
        "artifacts": [{ "artifactId": "a1", "name": "out", "parts": [{ "text": "result" }] }],
        "history": [{ "messageId": "m1", "role": "ROLE_USER", "contextId": "c1", "parts": [{ "text": "hello" }] }],
        "metadata": { "k": 1 },
    }});
    assert_eq!(
        result_to_v03("SendMessage", result),
        json!({
            "kind": "task", "id": "t1", "contextId": "c1",
            "status": {
                "state": "completed", "timestamp": "2026-01-01T00:00:00Z",
                "message": {
                    "kind": "message", "messageId": "m2", "role": "agent",
                    "parts": [{ "kind": "text", "text": "done" }],
                },
            },
            "artifacts": [{ "artifactId": "a1", "name": "out", "parts": [{ "kind": "text", "text": "result" }] }],
            "history": [{
                "kind": "message", "messageId": "m1", "role": "user", "contextId": "c1",
                "parts": [{ "kind": "text", "text": "hello" }],
            }],
            "metadata": { "k": 1 },
        })
    );
}

/// `blocking: false` is `returnImmediately`, and a message answer comes back bare.
#[test]
fn message_send_round_trip_with_a_message_result() {
    let params = json!({
        "message": { "messageId": "m1", "role": "user", "parts": [{ "text": "hi" }] },
        "configuration": { "blocking": false },
    });
    assert_eq!(
        params_to_v1("SendMessage", params).unwrap(),
        json!({
            "message": { "messageId": "m1", "role": "ROLE_USER", "parts": [{ "text": "hi" }] },
            "configuration": { "returnImmediately": true },
        })
    );
    let result = json!({ "message": {
        "messageId": "m2", "role": "ROLE_AGENT", "contextId": "c1", "taskId": "t1", "parts": [{ "text": "hello" }],
    }});
    assert_eq!(
        result_to_v03("SendMessage", result),
        json!({
            "kind": "message", "messageId": "m2", "role": "agent", "contextId": "c1", "taskId": "t1",
            "parts": [{ "kind": "text", "text": "hello" }],
        })
    );
}

/// Text, file (bytes and uri) and data parts, with or without `kind`, become flat 1.0 parts.
#[test]
fn parts_of_every_kind_convert_to_10() {
    let cases = [
        (
            json!({ "kind": "text", "text": "hi", "metadata": { "a": 1 } }),
            json!({ "text": "hi", "metadata": { "a": 1 } }),
        ),
        (
            json!({ "kind": "file", "file": { "bytes": "aGk=", "name": "a.txt", "mimeType": "text/plain" } }),
            json!({ "raw": "aGk=", "filename": "a.txt", "mediaType": "text/plain" }),
        ),
        (
            json!({ "kind": "file", "file": { "uri": "https://x.example/y.pdf", "mimeType": "application/pdf" } }),
            json!({ "url": "https://x.example/y.pdf", "mediaType": "application/pdf" }),
        ),
        (json!({ "kind": "data", "data": { "k": [1, 2] } }), json!({ "data": { "k": [1, 2] } })),
        (
            json!({ "kind": "data", "data": { "value": [1, 2] }, "metadata": { "data_part_compat": true, "a": 1 } }),
            json!({ "data": [1, 2], "metadata": { "a": 1 } }),
        ),
        (json!({ "kind": "data", "data": { "value": 3 } }), json!({ "data": { "value": 3 } })),
        (json!({ "text": "no kind" }), json!({ "text": "no kind" })),
        (json!({ "file": { "uri": "u" } }), json!({ "url": "u" })),
        (json!({ "data": {} }), json!({ "data": {} })),
        (json!({ "kind": "file", "file": { "bytes": "-_8=" } }), json!({ "raw": "+/8=" })),
        (json!({ "kind": "file", "file": { "bytes": "-_8" } }), json!({ "raw": "+/8=" })),
    ];
    for (v03, v1) in cases {
        assert_eq!(part_v1(v03.clone()), Ok(v1), "{v03}");
    }
}

/// Flat 1.0 parts become 0.3 parts; a non-object data value is wrapped and marked.
#[test]
fn parts_of_every_kind_convert_to_03() {
    let cases = [
        (
            json!({ "text": "hi", "mediaType": "text/markdown", "metadata": { "a": 1 } }),
            json!({ "kind": "text", "text": "hi", "metadata": { "a": 1 } }),
        ),
        (
            json!({ "raw": "aGk=", "filename": "a.txt", "mediaType": "text/plain" }),
            json!({ "kind": "file", "file": { "bytes": "aGk=", "name": "a.txt", "mimeType": "text/plain" } }),
        ),
        (
            json!({ "url": "https://x.example/y.pdf" }),
            json!({ "kind": "file", "file": { "uri": "https://x.example/y.pdf" } }),
        ),
        (json!({ "data": { "k": 1 } }), json!({ "kind": "data", "data": { "k": 1 } })),
        (
            json!({ "data": [1, 2], "metadata": { "a": 1 } }),
            json!({ "kind": "data", "data": { "value": [1, 2] }, "metadata": { "a": 1, "data_part_compat": true } }),
        ),
        (
            json!({ "data": "s" }),
            json!({ "kind": "data", "data": { "value": "s" }, "metadata": { "data_part_compat": true } }),
        ),
    ];
    for (v1, v03) in cases {
        assert_eq!(part_v03(v1.clone()), v03, "{v1}");
    }
}

/// A wrapped data value is unwrapped when a 0.3 client sends it back.
#[test]
fn a_non_object_data_part_survives_the_round_trip() {
    for data in [json!([1, "two"]), json!("text"), json!(4.5), json!(null)] {
        let part = json!({ "data": data });
        assert_eq!(part_v1(part_v03(part.clone())), Ok(part));
    }
}

/// Every state maps to its 0.3 name, and `final` is set exactly where the stream ends.
#[test]
fn status_updates_are_final_on_terminal_and_interrupted_states() {
    let states = [
        ("TASK_STATE_SUBMITTED", "submitted", false),
        ("TASK_STATE_WORKING", "working", false),
        ("TASK_STATE_INPUT_REQUIRED", "input-required", true),
        ("TASK_STATE_AUTH_REQUIRED", "auth-required", true),
        ("TASK_STATE_COMPLETED", "completed", true),
        ("TASK_STATE_CANCELED", "canceled", true),
        ("TASK_STATE_FAILED", "failed", true),
        ("TASK_STATE_REJECTED", "rejected", true),
        ("TASK_STATE_UNSPECIFIED", "unknown", false),
    ];
    for (v1, v03, last) in states {
        let event = json!({ "statusUpdate": { "taskId": "t", "contextId": "c", "status": { "state": v1 } } });
        assert_eq!(
            stream_event_to_v03(event),
            json!({
                "kind": "status-update", "taskId": "t", "contextId": "c", "status": { "state": v03 }, "final": last,
            }),
            "{v1}"
        );
    }
}

/// Task, message, status and artifact events lose their wrapper and gain a `kind`.
#[test]
fn stream_events_of_every_kind_convert_to_03() {
    let status = json!({ "statusUpdate": {
        "taskId": "t", "contextId": "c", "metadata": { "m": 1 },
        "status": {
            "state": "TASK_STATE_INPUT_REQUIRED",
            "message": { "messageId": "q", "role": "ROLE_AGENT", "parts": [{ "text": "which?" }] },
        },
    }});
    assert_eq!(
        stream_event_to_v03(status),
        json!({
            "kind": "status-update", "taskId": "t", "contextId": "c", "metadata": { "m": 1 }, "final": true,
            "status": {
                "state": "input-required",
                "message": {
                    "kind": "message", "messageId": "q", "role": "agent",
                    "parts": [{ "kind": "text", "text": "which?" }],
                },
            },
        })
    );
    let artifact = json!({ "artifactUpdate": {
        "taskId": "t", "contextId": "c", "append": true, "lastChunk": false,
        "artifact": { "artifactId": "a", "parts": [{ "url": "https://x.example/f" }] },
    }});
    assert_eq!(
        stream_event_to_v03(artifact),
        json!({
            "kind": "artifact-update", "taskId": "t", "contextId": "c", "append": true, "lastChunk": false,
            "artifact": { "artifactId": "a", "parts": [{ "kind": "file", "file": { "uri": "https://x.example/f" } }] },
        })
    );
    let task = json!({ "task": { "id": "t", "contextId": "c", "status": { "state": "TASK_STATE_SUBMITTED" } } });
    let task_v03 = json!({ "kind": "task", "id": "t", "contextId": "c", "status": { "state": "submitted" } });
    assert_eq!(stream_event_to_v03(task.clone()), task_v03);
    assert_eq!(result_to_v03("SubscribeToTask", task), task_v03);
    let message = json!({ "message": { "messageId": "m", "role": "ROLE_USER", "parts": [] } });
    assert_eq!(
        result_to_v03("SendStreamingMessage", message),
        json!({ "kind": "message", "messageId": "m", "role": "user", "parts": [] })
    );
}

mod errors;
mod methods;
