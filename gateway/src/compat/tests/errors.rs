//! Malformed 0.3 input is rejected, field by field.

use serde_json::json;

use super::*;

/// Malformed messages are rejected with every problem named by its path.
#[test]
fn malformed_messages_are_rejected_field_by_field() {
    let cases = [
        (
            json!({ "messageId": "m", "role": "user", "parts": [{ "metadata": {} }] }),
            "params.message.parts[0]: part has no content, expected one of text, file or data",
        ),
        (
            json!({ "messageId": "m", "role": "bot", "parts": [] }),
            "params.message.role: unknown role \"bot\", expected \"user\" or \"agent\"",
        ),
        (
            json!({ "messageId": 7, "role": "user", "parts": "hi" }),
            "params.message.messageId: expected a string, got a number; \
             params.message.parts: expected an array, got a string",
        ),
        (json!({ "role": "user" }), "params.message.messageId: required; params.message.parts: required"),
        (
            json!({ "kind": "task", "messageId": "m", "role": "user", "parts": [] }),
            "params.message.kind: expected \"message\", got \"task\"",
        ),
        (json!("hello"), "params.message: expected an object, got a string"),
    ];
    for (message, error) in cases {
        assert_eq!(message_error(message), error);
    }
}

/// Malformed parts are rejected with the problem named by its path.
#[test]
fn malformed_parts_are_rejected_field_by_field() {
    let cases = [
        (
            json!({ "kind": "file", "file": { "bytes": "aGk=", "uri": "u" } }),
            "params.message.parts[0].file: has both bytes and uri, expected one",
        ),
        (
            json!({ "kind": "file", "file": { "name": "a.txt" } }),
            "params.message.parts[0].file: has neither bytes nor uri",
        ),
        (json!({ "kind": "file" }), "params.message.parts[0].file: required"),
        (
            json!({ "kind": "file", "file": { "bytes": "not base64!" } }),
            "params.message.parts[0].file.bytes: not valid base64",
        ),
        (json!({ "kind": "text", "data": {} }), "params.message.parts[0].text: required"),
        (json!({ "kind": "text", "text": 5 }), "params.message.parts[0].text: expected a string, got a number"),
        (
            json!({ "kind": "image", "text": "x" }),
            "params.message.parts[0].kind: unknown part kind \"image\", expected \"text\", \"file\" or \"data\"",
        ),
        (
            json!({ "text": "a", "data": {} }),
            "params.message.parts[0]: part has text and data without a kind, expected one of them",
        ),
        (json!({ "kind": "data", "data": [1] }), "params.message.parts[0].data: expected an object, got an array"),
        (json!({ "text": "a", "metadata": [] }), "params.message.parts[0].metadata: expected an object, got an array"),
        (json!(3), "params.message.parts[0]: expected an object, got a number"),
    ];
    for (part, error) in cases {
        assert_eq!(part_v1(part), Err(error.to_owned()));
    }
}

/// Malformed params of every method are rejected with the problem named by its path.
#[test]
fn malformed_params_are_rejected_field_by_field() {
    let cases = [
        ("GetTask", json!([1]), "params: expected an object, got an array"),
        ("GetTask", Value::Null, "params.id: required"),
        (
            "GetTask",
            json!({ "id": "t", "historyLength": "5" }),
            "params.historyLength: expected an integer, got a string",
        ),
        (
            "GetTask",
            json!({ "id": "t", "historyLength": 1e10 }),
            "params.historyLength: expected an integer, got a number",
        ),
        (
            "GetTask",
            json!({ "id": "t", "historyLength": 3_000_000_000_i64 }),
            "params.historyLength: 3000000000 is out of range",
        ),
        ("SendMessage", json!({}), "params.message: required"),
        ("ListTasks", json!({ "status": "done" }), "params.status: unknown task state \"done\""),
        ("CreateTaskPushNotificationConfig", json!({ "taskId": "t" }), "params.pushNotificationConfig: required"),
        (
            "CreateTaskPushNotificationConfig",
            json!({ "taskId": "t", "pushNotificationConfig": { "token": "x" } }),
            "params.pushNotificationConfig.url: required",
        ),
        (
            "CreateTaskPushNotificationConfig",
            json!({ "taskId": "t", "pushNotificationConfig": { "url": "u", "authentication": { "schemes": [] } } }),
            "params.pushNotificationConfig.authentication.schemes: must name at least one scheme",
        ),
        (
            "CreateTaskPushNotificationConfig",
            json!({ "taskId": "t", "pushNotificationConfig": { "url": "u", "authentication": { "schemes": [1] } } }),
            "params.pushNotificationConfig.authentication.schemes: expected an array of strings",
        ),
        ("GetTaskPushNotificationConfig", json!({ "pushNotificationConfigId": "p" }), "params.id: required"),
        (
            "SendMessage",
            json!({
                "message": { "messageId": "m", "role": "user", "parts": [] },
                "configuration": { "blocking": "yes" },
            }),
            "params.configuration.blocking: expected a boolean, got a string",
        ),
        ("Nonsense", json!({}), "method \"Nonsense\" has no A2A 0.3 form"),
    ];
    for (method, params, error) in cases {
        assert_eq!(params_to_v1(method, params), Err(error.to_owned()), "{method}");
    }
}
