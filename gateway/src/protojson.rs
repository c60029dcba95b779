//! ProtoJSON leniency on input: parsers accept a field's proto name
//! (`task_id`) as well as its JSON name (`taskId`). The A2A JSON types
//! know only the latter, so requests are renamed before they are parsed.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::{GatewayError, Result};

/// Fields whose values are free-form JSON (`google.protobuf.Struct` and
/// `Value`): their keys belong to the caller and are never renamed.
const FREE_FORM: &[&str] = &["metadata", "data", "params"];

/// Parses a request (`what` names it in errors), accepting proto names; a
/// mismatch names the field at fault (`params.message.parts: invalid type …`).
pub(crate) fn parse<T: DeserializeOwned>(mut value: Value, what: &str) -> Result<T> {
    accept_proto_names(&mut value);
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let field = if path == "." { what.to_owned() } else { format!("{what}.{path}") };
        GatewayError::InvalidParams(format!("{field}: {}", error.into_inner()))
    })
}

/// An answer as JSON (A2A types always serialize).
pub(crate) fn to_value(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("A2A types serialize")
}

/// Renames every `snake_case` key of `value` to `lowerCamelCase`, outside
/// free-form fields.
pub(crate) fn accept_proto_names(value: &mut Value) {
    match value {
        Value::Object(object) => {
            let renamed: Map<String, Value> = std::mem::take(object)
                .into_iter()
                .map(|(key, mut value)| {
                    let key = if key.contains('_') { camel(&key) } else { key };
                    if !FREE_FORM.contains(&key.as_str()) {
                        accept_proto_names(&mut value);
                    }
                    (key, value)
                })
                .collect();
            *object = renamed;
        }
        Value::Array(items) => items.iter_mut().for_each(accept_proto_names),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
    }
}

fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn proto_names_become_json_names_outside_free_form_fields() {
        let mut request = json!({
            "task_id": "t1",
            "history_length": 2,
            "message": {"message_id": "m", "parts": [{"text": "x", "media_type": "text/plain"}],
                        "metadata": {"keep_me": 1}},
            "configs": [{"push_config": {"auth_scheme": "Bearer"}}],
            "data": {"snake_key": true},
        });
        accept_proto_names(&mut request);
        assert_eq!(
            request,
            json!({
                "taskId": "t1",
                "historyLength": 2,
                "message": {"messageId": "m", "parts": [{"text": "x", "mediaType": "text/plain"}],
                            "metadata": {"keep_me": 1}},
                "configs": [{"pushConfig": {"authScheme": "Bearer"}}],
                "data": {"snake_key": true},
            })
        );
    }
}
