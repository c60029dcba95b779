//! 0.3 request params to 1.0 request params, with every malformed field named by its path.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use chrono::{DateTime, SecondsFormat};
use serde_json::{Map, Value};

use super::{DATA_PART_COMPAT, STATES};

/// The 1.0 params for `method` from 0.3 `params`, or every problem found, joined by `; `.
pub(super) fn params(method: &str, params: &Value) -> Result<Value, String> {
    let empty = Value::Object(Map::new());
    let params = if params.is_null() { &empty } else { params };
    let mut p = Problems::default();
    let Some(o) = Obj::new(params, "params".to_owned(), &mut p) else {
        return Err(p.0.join("; "));
    };
    let out = match method {
        "SendMessage" | "SendStreamingMessage" => send_message(&o, &mut p),
        "GetTask" => get_task(&o, &mut p),
        "ListTasks" => list_tasks(&o, &mut p),
        "CancelTask" => cancel_task(&o, &mut p),
        "SubscribeToTask" => task_id_as(&o, "id", &mut p),
        "CreateTaskPushNotificationConfig" => set_push_config(&o, &mut p),
        "GetTaskPushNotificationConfig" => push_config_id(&o, false, &mut p),
        "ListTaskPushNotificationConfigs" => task_id_as(&o, "taskId", &mut p),
        "DeleteTaskPushNotificationConfig" => push_config_id(&o, true, &mut p),
        "GetExtendedAgentCard" => Map::new(),
        other => return Err(format!("method {other:?} has no A2A 0.3 form")),
    };
    if p.0.is_empty() { Ok(Value::Object(out)) } else { Err(p.0.join("; ")) }
}

/// Every problem found in one request's params, each as `path: problem`.
#[derive(Debug, Default)]
struct Problems(Vec<String>);

impl Problems {
    /// Records that the field at `path` is wrong as `what` says.
    fn add(&mut self, path: &str, what: impl std::fmt::Display) {
        self.0.push(format!("{path}: {what}"));
    }
}

/// A 0.3 JSON object being read, with its path for problem reports.
#[derive(Debug)]
struct Obj<'a> {
    /// The object's fields.
    map: &'a Map<String, Value>,
    /// Where the object sits in the params, such as `params.message.parts[0]`.
    path: String,
}

impl<'a> Obj<'a> {
    /// Reads `v` as an object at `path`, or records that it is not one.
    fn new(v: &'a Value, path: String, p: &mut Problems) -> Option<Self> {
        match v {
            Value::Object(map) => Some(Self { map, path }),
            other => {
                p.add(&path, format!("expected an object, got {}", type_name(other)));
                None
            }
        }
    }

    /// The path of the field `key`.
    fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    /// The field `key`; JSON `null` counts as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// The field `key`, recording a problem when it is absent.
    fn required(&self, key: &str, p: &mut Problems) -> Option<&'a Value> {
        let v = self.get(key);
        if v.is_none() {
            p.add(&self.at(key), "required");
        }
        v
    }

    /// Records a type problem for `key` and yields nothing.
    fn wrong<T>(&self, key: &str, expected: &str, got: &Value, p: &mut Problems) -> Option<T> {
        p.add(&self.at(key), format!("expected {expected}, got {}", type_name(got)));
        None
    }

    /// The optional string field `key`.
    fn str(&self, key: &str, p: &mut Problems) -> Option<&'a str> {
        match self.get(key)? {
            Value::String(s) => Some(s),
            other => self.wrong(key, "a string", other, p),
        }
    }

    /// The required string field `key`.
    fn req_str(&self, key: &str, p: &mut Problems) -> Option<&'a str> {
        self.required(key, p)?;
        self.str(key, p)
    }

    /// The optional boolean field `key`.
    fn bool(&self, key: &str, p: &mut Problems) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            other => self.wrong(key, "a boolean", other, p),
        }
    }

    /// The optional integer field `key`, which must fit `T`.
    fn int<T: TryFrom<i64>>(&self, key: &str, p: &mut Problems) -> Option<T> {
        let v = self.get(key)?;
        match v.as_i64().map(T::try_from) {
            Some(Ok(n)) => Some(n),
            Some(Err(_)) => {
                p.add(&self.at(key), format!("{v} is out of range"));
                None
            }
            None => self.wrong(key, "an integer", v, p),
        }
    }

    /// The optional object field `key`, as a map.
    fn map(&self, key: &str, p: &mut Problems) -> Option<&'a Map<String, Value>> {
        match self.get(key)? {
            Value::Object(m) => Some(m),
            other => self.wrong(key, "an object", other, p),
        }
    }

    /// The optional object field `key`, as an object to read further.
    fn obj(&self, key: &str, p: &mut Problems) -> Option<Obj<'a>> {
        Obj::new(self.get(key)?, self.at(key), p)
    }

    /// The optional array field `key`.
    fn array(&self, key: &str, p: &mut Problems) -> Option<&'a [Value]> {
        match self.get(key)? {
            Value::Array(items) => Some(items),
            other => self.wrong(key, "an array", other, p),
        }
    }

    /// The optional array-of-strings field `key`.
    fn strings(&self, key: &str, p: &mut Problems) -> Option<Vec<&'a str>> {
        let items = self.array(key, p)?;
        let strings: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
        if strings.len() == items.len() {
            return Some(strings);
        }
        p.add(&self.at(key), "expected an array of strings");
        None
    }

    /// Checks an explicit `kind` discriminator; an absent one is accepted.
    fn expect_kind(&self, kind: &str, p: &mut Problems) {
        if let Some(got) = self.str("kind", p)
            && got != kind
        {
            p.add(&self.at("kind"), format!("expected {kind:?}, got {got:?}"));
        }
    }
}

/// Inserts `value` under `key` when there is one.
fn put(out: &mut Map<String, Value>, key: &str, value: Option<impl Into<Value>>) {
    if let Some(v) = value {
        out.insert(key.to_owned(), v.into());
    }
}

/// How a JSON value's type reads in a problem report.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `MessageSendParams` to `SendMessageRequest`.
fn send_message(o: &Obj<'_>, p: &mut Problems) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(m) = o.required("message", p) {
        out.insert("message".to_owned(), message(m, o.at("message"), p));
    }
    if let Some(c) = o.obj("configuration", p) {
        out.insert("configuration".to_owned(), Value::Object(configuration(&c, p)));
    }
    put(&mut out, "metadata", o.map("metadata", p).cloned());
    out
}

/// `MessageSendConfiguration` to `SendMessageConfiguration`; `blocking` is `!returnImmediately`.
fn configuration(c: &Obj<'_>, p: &mut Problems) -> Map<String, Value> {
    let mut out = Map::new();
    put(&mut out, "acceptedOutputModes", c.strings("acceptedOutputModes", p));
    put(&mut out, "historyLength", c.int::<i32>("historyLength", p));
    put(&mut out, "returnImmediately", c.bool("blocking", p).map(|b| !b));
    if let Some(push) = c.obj("pushNotificationConfig", p) {
        out.insert("taskPushNotificationConfig".to_owned(), Value::Object(push_config(&push, p)));
    }
    out
}

/// A 0.3 `Message` to a 1.0 `Message`.
fn message(v: &Value, path: String, p: &mut Problems) -> Value {
    let Some(o) = Obj::new(v, path, p) else { return Value::Null };
    o.expect_kind("message", p);
    let mut out = Map::new();
    put(&mut out, "messageId", o.req_str("messageId", p));
    let role = match o.req_str("role", p) {
        Some("user") => Some("ROLE_USER"),
        Some("agent") => Some("ROLE_AGENT"),
        Some(other) => {
            p.add(&o.at("role"), format!("unknown role {other:?}, expected \"user\" or \"agent\""));
            None
        }
        None => None,
    };
    put(&mut out, "role", role);
    o.required("parts", p);
    if let Some(parts) = o.array("parts", p) {
        let parts = parts.iter().enumerate().map(|(i, v)| part(v, format!("{}.parts[{i}]", o.path), p));
        out.insert("parts".to_owned(), Value::Array(parts.collect()));
    }
    put(&mut out, "contextId", o.str("contextId", p));
    put(&mut out, "taskId", o.str("taskId", p));
    put(&mut out, "referenceTaskIds", o.strings("referenceTaskIds", p));
    put(&mut out, "extensions", o.strings("extensions", p));
    put(&mut out, "metadata", o.map("metadata", p).cloned());
    Value::Object(out)
}

/// A 0.3 `Part` to a flat 1.0 `Part`. Without `kind`, the one content field present decides.
fn part(v: &Value, path: String, p: &mut Problems) -> Value {
    let Some(o) = Obj::new(v, path, p) else { return Value::Null };
    let kind = match o.get("kind") {
        Some(_) => o.str("kind", p),
        None => infer_kind(&o, p),
    };
    let mut out = Map::new();
    let mut metadata = o.map("metadata", p).cloned();
    match kind {
        Some("text") => put(&mut out, "text", o.req_str("text", p)),
        Some("file") => file(&o, &mut out, p),
        Some("data") => data(&o, &mut out, &mut metadata, p),
        Some(other) => {
            p.add(&o.at("kind"), format!("unknown part kind {other:?}, expected \"text\", \"file\" or \"data\""))
        }
        None => {}
    }
    put(&mut out, "metadata", metadata);
    Value::Object(out)
}

/// The kind of a part without `kind`: that of its only content field.
fn infer_kind(o: &Obj<'_>, p: &mut Problems) -> Option<&'static str> {
    let present: Vec<&str> = ["text", "file", "data"].into_iter().filter(|k| o.get(k).is_some()).collect();
    match present[..] {
        [kind] => Some(kind),
        [] => {
            p.add(&o.path, "part has no content, expected one of text, file or data");
            None
        }
        _ => {
            p.add(&o.path, format!("part has {} without a kind, expected one of them", present.join(" and ")));
            None
        }
    }
}

/// The content of a 0.3 file part: `bytes` becomes `raw`, `uri` becomes `url`.
fn file(o: &Obj<'_>, out: &mut Map<String, Value>, p: &mut Problems) {
    o.required("file", p);
    let Some(f) = o.obj("file", p) else { return };
    match (f.get("bytes"), f.get("uri")) {
        (Some(_), Some(_)) => p.add(&f.path, "has both bytes and uri, expected one"),
        (None, None) => p.add(&f.path, "has neither bytes nor uri"),
        (Some(_), None) => match f.str("bytes", p).map(standard_base64) {
            Some(Some(raw)) => put(out, "raw", Some(raw)),
            Some(None) => p.add(&f.at("bytes"), "not valid base64"),
            None => {}
        },
        (None, Some(_)) => put(out, "url", f.str("uri", p)),
    }
    put(out, "filename", f.str("name", p));
    put(out, "mediaType", f.str("mimeType", p));
}

/// `s` in standard padded base64, as 1.0 `raw` is read; URL-safe or unpadded input is re-encoded.
fn standard_base64(s: &str) -> Option<String> {
    if STANDARD.decode(s).is_ok() {
        return Some(s.to_owned());
    }
    [STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD].iter().find_map(|e| e.decode(s).ok()).map(|b| STANDARD.encode(b))
}

/// The content of a 0.3 data part, which must be an object; a value that [`super::to_v03`]
/// wrapped as `{"value": v}` under the compat marker is unwrapped and the marker dropped.
fn data(o: &Obj<'_>, out: &mut Map<String, Value>, metadata: &mut Option<Map<String, Value>>, p: &mut Problems) {
    o.required("data", p);
    let Some(data) = o.map("data", p) else { return };
    let marker = metadata.as_mut().and_then(|m| m.remove(DATA_PART_COMPAT));
    if metadata.as_ref().is_some_and(Map::is_empty) {
        *metadata = None;
    }
    let data = match data.get("value") {
        Some(inner) if marker == Some(Value::Bool(true)) => inner.clone(),
        _ => Value::Object(data.clone()),
    };
    out.insert("data".to_owned(), data);
}

/// A 0.3 `PushNotificationConfig` as the fields of a flat 1.0 `TaskPushNotificationConfig`.
fn push_config(o: &Obj<'_>, p: &mut Problems) -> Map<String, Value> {
    let mut out = Map::new();
    put(&mut out, "url", o.req_str("url", p));
    put(&mut out, "id", o.str("id", p));
    put(&mut out, "token", o.str("token", p));
    let Some(auth) = o.obj("authentication", p) else { return out };
    let mut a = Map::new();
    auth.required("schemes", p);
    match auth.strings("schemes", p).as_deref() {
        Some([first, ..]) => put(&mut a, "scheme", Some(*first)),
        Some([]) => p.add(&auth.at("schemes"), "must name at least one scheme"),
        None => {}
    }
    put(&mut a, "credentials", auth.str("credentials", p));
    out.insert("authentication".to_owned(), Value::Object(a));
    out
}

/// `TaskQueryParams` to `GetTaskRequest`.
fn get_task(o: &Obj<'_>, p: &mut Problems) -> Map<String, Value> {
    let mut out = task_id_as(o, "id", p);
    put(&mut out, "historyLength", o.int::<i32>("historyLength", p));
    out
}

/// `TaskIdParams` to `CancelTaskRequest`.
fn cancel_task(o: &Obj<'_>, p: &mut Problems) -> Map<String, Value> {
    let mut out = task_id_as(o, "id", p);
    put(&mut out, "metadata", o.map("metadata", p).cloned());
    out
}

/// The required task id `id` of a 0.3 request, under the 1.0 name `key`.
fn task_id_as(o: &Obj<'_>, key: &str, p: &mut Problems) -> Map<String, Value> {
    let mut out = Map::new();
    put(&mut out, key, o.req_str("id", p));
    out
}

/// The pre-1.0 draft `ListTasksParams` to `ListTasksRequest`; `lastUpdatedAfter` (epoch
/// milliseconds) becomes the timestamp `statusTimestampAfter`.
fn list_tasks(o: &Obj<'_>, p: &mut Problems) -> Map<String, Value> {
    let mut out = Map::new();
    put(&mut out, "contextId", o.str("contextId", p));
    let status = o.str("status", p).and_then(|s| match STATES.iter().find(|(v03, _)| *v03 == s) {
        Some((_, v1)) => Some(*v1),
        None => {
            p.add(&o.at("status"), format!("unknown task state {s:?}"));
            None
        }
    });
    put(&mut out, "status", status);
    put(&mut out, "pageSize", o.int::<i32>("pageSize", p));
    put(&mut out, "pageToken", o.str("pageToken", p));
    put(&mut out, "historyLength", o.int::<i32>("historyLength", p));
    let after = o.int::<i64>("lastUpdatedAfter", p).map(|ms| match DateTime::from_timestamp_millis(ms) {
        Some(t) => Some(t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
        None => {
            p.add(&o.at("lastUpdatedAfter"), "timestamp out of range");
            None
        }
    });
    put(&mut out, "statusTimestampAfter", after.flatten());
    put(&mut out, "includeArtifacts", o.bool("includeArtifacts", p));
    out
}

/// A 0.3 `TaskPushNotificationConfig` to a flat 1.0 one; a config without `id` gets the task id.
fn set_push_config(o: &Obj<'_>, p: &mut Problems) -> Map<String, Value> {
    let task_id = o.req_str("taskId", p);
    o.required("pushNotificationConfig", p);
    let mut out = o.obj("pushNotificationConfig", p).map(|c| push_config(&c, p)).unwrap_or_default();
    put(&mut out, "taskId", task_id);
    if !out.contains_key("id") {
        put(&mut out, "id", task_id);
    }
    out
}

/// The 0.3 params naming one push config (`id` is the task, `pushNotificationConfigId` the
/// config) to their 1.0 form; unless `required`, a missing config id means the task id.
fn push_config_id(o: &Obj<'_>, required: bool, p: &mut Problems) -> Map<String, Value> {
    let mut out = Map::new();
    let task_id = o.req_str("id", p);
    put(&mut out, "taskId", task_id);
    if required {
        o.required("pushNotificationConfigId", p);
    }
    let config_id = o.str("pushNotificationConfigId", p).or(if required { None } else { task_id });
    put(&mut out, "id", config_id);
    out
}
