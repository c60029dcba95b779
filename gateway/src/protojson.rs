//! ProtoJSON rules on input that the A2A JSON types do not apply
//! themselves: parsers accept a field's proto name (`task_id`) as well as
//! its JSON name (`taskId`), an integer as a number or a decimal string
//! (`"historyLength": "2"`), a part sets one member of its `content` oneof,
//! and bytes come in standard or URL-safe base64, padded or not. Requests
//! are renamed and their parts checked before they are parsed.

use base64::{
    Engine as _, alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig, general_purpose::STANDARD},
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::{GatewayError, Result};

/// Fields whose values are free-form JSON (`google.protobuf.Struct` and
/// `Value`): their keys belong to the caller and are never renamed.
const FREE_FORM: &[&str] = &["metadata", "data", "params"];
/// The integer fields of A2A requests, which ProtoJSON also reads from strings.
const INTEGERS: &[&str] = &["historyLength", "pageSize"];

/// Parses a request (`what` names it in errors), accepting proto names; a
/// mismatch names the field at fault (`params.message.parts: invalid type …`).
pub(crate) fn parse<T: DeserializeOwned>(mut value: Value, what: &str) -> Result<T> {
    accept_proto_names(&mut value);
    default_omitted(&mut value);
    check_parts(&mut value).map_err(|(mut path, problem)| {
        path.push(what.to_owned());
        path.reverse();
        GatewayError::InvalidParams(format!("{}: {problem}", path.join(".").replace(".[", "[")))
    })?;
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let field = if path == "." { what.to_owned() } else { format!("{what}.{path}") };
        GatewayError::InvalidParams(format!("{field}: {}", error.into_inner()))
    })
}

/// A request's message with the fields ProtoJSON leaves out when they hold
/// their default (an empty `parts`, `role` unspecified) put back, so that the
/// message is judged on what it says ("parts must not be empty") rather than
/// on a field a ProtoJSON writer had every right to omit ("missing field").
fn default_omitted(request: &mut Value) {
    if let Some(message) = request.get_mut("message").and_then(Value::as_object_mut) {
        message.entry("parts").or_insert_with(|| Value::Array(Vec::new()));
        message.entry("role").or_insert_with(|| Value::from("ROLE_UNSPECIFIED"));
    }
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
                    if let Value::String(text) = &value
                        && INTEGERS.contains(&key.as_str())
                        && let Ok(number) = text.trim().parse::<i64>()
                    {
                        value = Value::from(number);
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

/// The members of `Part`'s `content` oneof.
const PART_CONTENT: [&str; 4] = ["text", "raw", "url", "data"];

/// Bytes as ProtoJSON reads them: padding optional.
const ANY_PADDING: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const STANDARD_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, ANY_PADDING);
const URL_SAFE_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, ANY_PADDING);

/// A problem found in a request, and the path to it, innermost first.
type Found = (Vec<String>, String);

/// Checks every part (an element of a `parts` list) outside free-form
/// fields: see [`check_part`].
fn check_parts(value: &mut Value) -> std::result::Result<(), Found> {
    let within = |key: String| {
        move |(mut path, problem): Found| {
            path.push(key);
            (path, problem)
        }
    };
    match value {
        Value::Object(object) => {
            for (key, child) in object.iter_mut().filter(|(key, _)| !FREE_FORM.contains(&key.as_str())) {
                match child {
                    Value::Array(parts) if key == "parts" => {
                        for (index, part) in parts.iter_mut().enumerate() {
                            check_part(part)
                                .map_err(|problem| (Vec::new(), problem))
                                .map_err(within(format!("[{index}]")))
                                .map_err(within(key.clone()))?;
                        }
                    }
                    child => check_parts(child).map_err(within(key.clone()))?,
                }
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                check_parts(item).map_err(within(format!("[{index}]")))?;
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
    }
    Ok(())
}

/// A part sets exactly one member of its `content` oneof (`null` is unset;
/// the A2A types would silently keep the first and drop the others), a text,
/// raw or url member is a string, and `raw` is rewritten to the padded
/// standard base64 the A2A types read.
fn check_part(part: &mut Value) -> std::result::Result<(), String> {
    let Value::Object(part) = part else { return Ok(()) };
    let set: Vec<&str> =
        PART_CONTENT.into_iter().filter(|member| part.get(*member).is_some_and(|value| !value.is_null())).collect();
    if set.len() > 1 {
        return Err(format!("sets {}: a part holds exactly one of text, raw, url and data", set.join(" and ")));
    }
    match set.first().map(|member| (*member, &part[*member])) {
        Some(("data", _)) | None => Ok(()),
        Some((member, value)) => {
            let Value::String(text) = value else { return Err(format!("{member}: must be a string")) };
            if member == "raw" {
                let engine = if text.contains(['-', '_']) { URL_SAFE_ANY_PADDING } else { STANDARD_ANY_PADDING };
                let bytes = engine.decode(text).map_err(|error| format!("raw: must be base64 ({error})"))?;
                if text.len() % 4 != 0 || text.contains(['-', '_']) {
                    part.insert("raw".to_owned(), Value::String(STANDARD.encode(bytes)));
                }
            }
            Ok(())
        }
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
    fn a_message_s_omitted_defaults_are_its_defaults() {
        let request: a2a::SendMessageRequest =
            parse(json!({"message": {"messageId": "m"}}), "params").expect("ProtoJSON may omit defaults");
        assert!(request.message.parts.is_empty());
        assert_eq!(request.message.role, a2a::Role::Unspecified);
        let given: a2a::SendMessageRequest =
            parse(json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}), "params")
                .expect("a full message");
        assert_eq!((given.message.role, given.message.parts.len()), (a2a::Role::User, 1), "what is given is kept");
    }

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

    fn part_error(request: Value) -> String {
        match parse::<a2a::SendMessageRequest>(request, "params") {
            Err(GatewayError::InvalidParams(message)) => message,
            other => panic!("expected InvalidParams, got {other:?}"),
        }
    }

    fn message(parts: Value) -> Value {
        json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": parts}})
    }

    #[test]
    fn a_part_with_two_contents_is_refused_not_cut() {
        let error = part_error(message(json!([{"text": "a"}, {"text": "a", "data": {"x": 1}}])));
        assert_eq!(
            error,
            "params.message.parts[1]: sets text and data: a part holds exactly one of text, raw, url and data"
        );
        let error = part_error(message(json!([{"text": 5, "data": {"x": 1}}])));
        assert!(error.starts_with("params.message.parts[0]: sets text and data"), "{error}");
        assert_eq!(part_error(message(json!([{"url": 5}]))), "params.message.parts[0]: url: must be a string");
    }

    #[test]
    fn integers_are_read_from_decimal_strings_too() {
        let request: a2a::GetTaskRequest =
            parse(json!({ "id": "t", "historyLength": "2" }), "params").expect("a string integer");
        assert_eq!(request.history_length, Some(2));
        let error = parse::<a2a::GetTaskRequest>(json!({ "id": "t", "history_length": "two" }), "params");
        assert!(
            matches!(error, Err(GatewayError::InvalidParams(ref text)) if text.contains("historyLength")),
            "{error:?}"
        );
    }

    #[test]
    fn a_null_member_is_unset() {
        let request: a2a::SendMessageRequest =
            parse(message(json!([{"text": null, "data": {"x": 1}}])), "params").expect("parses");
        assert_eq!(request.message.parts[0].content, a2a::PartContent::Data(json!({"x": 1})));
    }

    #[test]
    fn raw_bytes_are_read_in_either_base64_alphabet_padded_or_not() {
        for raw in ["-_8=", "-_8", "+/8=", "+/8"] {
            let request: a2a::SendMessageRequest =
                parse(message(json!([{"raw": raw}])), "params").unwrap_or_else(|error| panic!("{raw}: {error}"));
            assert_eq!(request.message.parts[0].content, a2a::PartContent::Raw(vec![0xfb, 0xff]), "{raw}");
        }
        for garbage in ["not base64!", "!!!!"] {
            let error = part_error(message(json!([{ "raw": garbage }])));
            assert!(error.starts_with("params.message.parts[0]: raw: must be base64"), "{garbage}: {error}");
        }
    }

    #[test]
    fn free_form_fields_keep_what_looks_like_parts() {
        let request = message(json!([{"data": {"parts": [{"text": "a", "data": 1}]}}]));
        assert!(parse::<a2a::SendMessageRequest>(request, "params").is_ok());
    }
}
