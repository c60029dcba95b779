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

/// The largest magnitude up to which every whole number is exact in a double (2^53).
const MAX_EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// A protobuf value as JSON. A whole number within ±2^53 becomes a JSON
/// integer (`5`, not `5.0`: ProtoJSON prints it so, and an integer is what
/// the sender meant, the wire having doubles only); a number that is not
/// finite becomes null.
pub fn value_to_json(value: &Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(flag)) => Json::Bool(*flag),
        Some(Kind::NumberValue(number)) => json_number(*number).map_or(Json::Null, Json::Number),
        Some(Kind::StringValue(text)) => Json::String(text.clone()),
        Some(Kind::ListValue(list)) => Json::Array(list.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(object)) => Json::Object(struct_to_json(object)),
    }
}

/// A protobuf number as a JSON number: an integer when whole within ±2^53
/// (see [`value_to_json`]); `None` when it is not finite.
pub fn json_number(number: f64) -> Option<serde_json::Number> {
    if number.fract() == 0.0 && number.abs() <= MAX_EXACT_INTEGER {
        // Whole and within ±2^53: the conversion is exact.
        return Some((number as i64).into());
    }
    serde_json::Number::from_f64(number)
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
        let json = serde_json::json!({"a": [1.5, "x", null, true], "b": {"c": 2, "d": -7}});
        let value = value_from_json(json.clone());
        assert_eq!(value_to_json(&value), json);
        assert!(is_finite(&value));
        assert!(!is_finite(&Value { kind: Some(Kind::NumberValue(f64::NAN)) }));
    }

    #[test]
    fn whole_numbers_become_integers_as_protojson_prints_them() {
        let number = |n: f64| value_to_json(&Value { kind: Some(Kind::NumberValue(n)) });
        assert_eq!(number(5.0).to_string(), "5");
        assert!(number(5.0).is_i64(), "an integer input is an integer");
        assert_eq!(number(-3.0).to_string(), "-3");
        assert_eq!(number(-0.0).to_string(), "0");
        assert_eq!(number(10.5).to_string(), "10.5");
        assert_eq!(number(9_007_199_254_740_992.0).to_string(), "9007199254740992");
        assert_eq!(number(-9_007_199_254_740_992.0).to_string(), "-9007199254740992");
        assert!(number(18_014_398_509_481_984.0).is_f64(), "beyond 2^53 a double is not an exact integer");
        assert_eq!(number(f64::NAN), Json::Null);
        assert_eq!(number(f64::INFINITY), Json::Null);
    }
}
