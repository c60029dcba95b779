//! `google.protobuf.Struct` / `Value` ↔ JSON, for services that keep JSON.

use prost_types::{ListValue, Struct, Value, value::Kind};
use serde_json::{Map, Value as Json};

/// JSON as a protobuf value. Numbers become doubles.
pub fn value_from_json(value: Json) -> Value {
    let kind = match value {
        Json::Null => Kind::NullValue(0),
        Json::Bool(flag) => Kind::BoolValue(flag),
        Json::Number(number) => Kind::NumberValue(number.as_f64().unwrap_or_default()),
        Json::String(text) => Kind::StringValue(text),
        Json::Array(items) => Kind::ListValue(ListValue { values: items.into_iter().map(value_from_json).collect() }),
        Json::Object(map) => Kind::StructValue(struct_from_json(map)),
    };
    Value { kind: Some(kind) }
}

/// A JSON object as a protobuf struct.
pub fn struct_from_json(map: Map<String, Json>) -> Struct {
    Struct { fields: map.into_iter().map(|(key, value)| (key, value_from_json(value))).collect() }
}

/// A protobuf value as JSON; a number that is not finite becomes null.
pub fn value_to_json(value: &Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(flag)) => Json::Bool(*flag),
        Some(Kind::NumberValue(number)) => serde_json::Number::from_f64(*number).map_or(Json::Null, Json::Number),
        Some(Kind::StringValue(text)) => Json::String(text.clone()),
        Some(Kind::ListValue(list)) => Json::Array(list.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(object)) => Json::Object(struct_to_json(object)),
    }
}

/// A protobuf struct as a JSON object.
pub fn struct_to_json(object: &Struct) -> Map<String, Json> {
    object.fields.iter().map(|(key, value)| (key.clone(), value_to_json(value))).collect()
}

/// Whether every number in `value` is finite (JSON has no NaN or infinity).
pub fn is_finite(value: &Value) -> bool {
    match &value.kind {
        Some(Kind::NumberValue(number)) => number.is_finite(),
        Some(Kind::ListValue(list)) => list.values.iter().all(is_finite),
        Some(Kind::StructValue(object)) => object.fields.values().all(is_finite),
        None | Some(Kind::NullValue(_) | Kind::BoolValue(_) | Kind::StringValue(_)) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let json = serde_json::json!({"a": [1.5, "x", null, true], "b": {"c": 2.0}});
        let value = value_from_json(json.clone());
        assert_eq!(value_to_json(&value), json);
        assert!(is_finite(&value));
        assert!(!is_finite(&Value { kind: Some(Kind::NumberValue(f64::NAN)) }));
    }
}
