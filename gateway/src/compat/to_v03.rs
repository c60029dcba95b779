//! 1.0 results and stream events to their 0.3 shapes.
//!
//! The input is the gateway's own output, so nothing here fails: a value of an unexpected type is
//! left as it is, and fields this module does not know pass through, except on parts, which are
//! rebuilt from their known fields.

use serde_json::{Map, Value, json};

use super::{DATA_PART_COMPAT, STATES};

/// The 0.3 states after which the server closes a stream, so a status update is `final`.
const FINAL_STATES: [&str; 6] = ["completed", "canceled", "failed", "rejected", "input-required", "auth-required"];

/// The 0.3 shape of the 1.0 `result` of `method`.
pub(super) fn result(method: &str, result: Value) -> Value {
    match method {
        "SendMessage" => send_message_response(result),
        "SendStreamingMessage" | "SubscribeToTask" => stream_event(result),
        "GetTask" | "CancelTask" => task(result),
        "ListTasks" => object(result, |m| map_items(m, "tasks", task)),
        "CreateTaskPushNotificationConfig" | "GetTaskPushNotificationConfig" => push_config(result),
        "ListTaskPushNotificationConfigs" => push_config_list(result),
        "DeleteTaskPushNotificationConfig" => Value::Null,
        _ => result,
    }
}

/// The 0.3 event for a 1.0 `StreamResponse`.
pub(super) fn stream_event(event: Value) -> Value {
    let Value::Object(mut m) = event else { return event };
    if let Some(t) = m.remove("task") {
        return task(t);
    }
    if let Some(msg) = m.remove("message") {
        return message(msg);
    }
    if let Some(update) = m.remove("statusUpdate") {
        return status_update(update);
    }
    if let Some(update) = m.remove("artifactUpdate") {
        return object(update, |m| {
            set_kind(m, "artifact-update");
            map_field(m, "artifact", artifact);
        });
    }
    Value::Object(m)
}

/// Applies `f` to `v` when it is an object.
fn object(v: Value, f: impl FnOnce(&mut Map<String, Value>)) -> Value {
    let Value::Object(mut m) = v else { return v };
    f(&mut m);
    Value::Object(m)
}

/// Sets the 0.3 `kind` discriminator.
fn set_kind(m: &mut Map<String, Value>, kind: &str) {
    m.insert("kind".to_owned(), kind.into());
}

/// Replaces the field `key`, when present, by `f` of it.
fn map_field(m: &mut Map<String, Value>, key: &str, f: fn(Value) -> Value) {
    if let Some(v) = m.get_mut(key) {
        *v = f(v.take());
    }
}

/// Replaces every item of the array field `key`, when present, by `f` of it.
fn map_items(m: &mut Map<String, Value>, key: &str, f: fn(Value) -> Value) {
    if let Some(Value::Array(items)) = m.get_mut(key) {
        items.iter_mut().for_each(|item| *item = f(item.take()));
    }
}

/// `SendMessageResponse` (`{"task"}` or `{"message"}`) to a bare task or message.
fn send_message_response(v: Value) -> Value {
    let Value::Object(mut m) = v else { return v };
    if let Some(t) = m.remove("task") {
        return task(t);
    }
    if let Some(msg) = m.remove("message") {
        return message(msg);
    }
    Value::Object(m)
}

/// A 1.0 `Task` to a 0.3 one; a task without status reads as state `unknown`.
fn task(v: Value) -> Value {
    object(v, |m| {
        set_kind(m, "task");
        let status = m.remove("status").unwrap_or_else(|| json!({}));
        m.insert("status".to_owned(), task_status(status));
        map_items(m, "artifacts", artifact);
        map_items(m, "history", message);
    })
}

/// A 1.0 `TaskStatus` to a 0.3 one.
fn task_status(v: Value) -> Value {
    object(v, |m| {
        let state = m.get("state").and_then(Value::as_str).map_or("unknown", state);
        m.insert("state".to_owned(), state.into());
        map_field(m, "message", message);
    })
}

/// The 0.3 name of a 1.0 task state; one 0.3 does not know is `unknown`.
fn state(v1: &str) -> &'static str {
    STATES.iter().find(|(_, s)| *s == v1).map_or("unknown", |(v03, _)| v03)
}

/// A 1.0 `TaskStatusUpdateEvent` to a 0.3 one, with `final` derived from its state.
fn status_update(v: Value) -> Value {
    object(v, |m| {
        set_kind(m, "status-update");
        let status = task_status(m.remove("status").unwrap_or_else(|| json!({})));
        let state = status.get("state").and_then(Value::as_str).unwrap_or_default();
        m.insert("final".to_owned(), FINAL_STATES.contains(&state).into());
        m.insert("status".to_owned(), status);
    })
}

/// A 1.0 `Message` to a 0.3 one; any role but `ROLE_USER` is `agent`.
fn message(v: Value) -> Value {
    object(v, |m| {
        set_kind(m, "message");
        let user = m.get("role").and_then(Value::as_str) == Some("ROLE_USER");
        m.insert("role".to_owned(), if user { "user" } else { "agent" }.into());
        map_items(m, "parts", part);
    })
}

/// A 1.0 `Artifact` to a 0.3 one: only its parts differ.
fn artifact(v: Value) -> Value {
    object(v, |m| map_items(m, "parts", part))
}

/// A flat 1.0 `Part` to a 0.3 text, file or data part; a part without content is left as it is.
fn part(v: Value) -> Value {
    let Value::Object(mut m) = v else { return v };
    let mut out = if let Some(text) = m.remove("text") {
        fields([("kind", "text".into()), ("text", text)])
    } else if let Some(bytes) = m.remove("raw") {
        file_part("bytes", bytes, &mut m)
    } else if let Some(uri) = m.remove("url") {
        file_part("uri", uri, &mut m)
    } else if let Some(data) = m.remove("data") {
        let data = data_object(data, &mut m);
        fields([("kind", "data".into()), ("data", data)])
    } else {
        return Value::Object(m);
    };
    out.extend(m.remove("metadata").map(|meta| ("metadata".to_owned(), meta)));
    Value::Object(out)
}

/// A 0.3 file part whose file holds `content` under `key`, with the name and media type of the
/// 1.0 `part`.
fn file_part(key: &str, content: Value, part: &mut Map<String, Value>) -> Map<String, Value> {
    let mut file = fields([(key, content)]);
    file.extend(part.remove("filename").map(|name| ("name".to_owned(), name)));
    file.extend(part.remove("mediaType").map(|media_type| ("mimeType".to_owned(), media_type)));
    fields([("kind", "file".into()), ("file", Value::Object(file))])
}

/// An object of the given fields.
fn fields<const N: usize>(fields: [(&str, Value); N]) -> Map<String, Value> {
    fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// `data` as a 0.3 data object: a non-object is wrapped as `{"value": data}` and the part's
/// metadata (in `part`) gets the compat marker.
fn data_object(data: Value, part: &mut Map<String, Value>) -> Value {
    if data.is_object() {
        return data;
    }
    let metadata = part.entry("metadata").or_insert_with(|| json!({}));
    if let Value::Object(meta) = metadata {
        meta.insert(DATA_PART_COMPAT.to_owned(), true.into());
    }
    json!({ "value": data })
}

/// A flat 1.0 `TaskPushNotificationConfig` to the 0.3 `{taskId, pushNotificationConfig}`.
fn push_config(v: Value) -> Value {
    let Value::Object(mut m) = v else { return v };
    let task_id = m.remove("taskId").unwrap_or_else(|| "".into());
    m.remove("tenant");
    map_field(&mut m, "authentication", |auth| {
        object(auth, |a| {
            let scheme = a.remove("scheme");
            a.insert("schemes".to_owned(), Value::Array(scheme.into_iter().collect()));
        })
    });
    json!({ "taskId": task_id, "pushNotificationConfig": m })
}

/// `ListTaskPushNotificationConfigsResponse` to the bare 0.3 array of configs.
fn push_config_list(v: Value) -> Value {
    let configs = match v {
        Value::Object(mut m) => m.remove("configs").unwrap_or_else(|| json!([])),
        Value::Null => json!([]),
        other => other,
    };
    let Value::Array(items) = configs else { return configs };
    Value::Array(items.into_iter().map(push_config).collect())
}
