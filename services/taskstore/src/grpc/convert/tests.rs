//! The conversions' checks: paths of bad values, numbers, messages, answers.

use super::*;

#[test]
fn non_finite_numbers_are_rejected_with_their_path() {
    let object = Struct {
        fields: [("score".to_owned(), Value { kind: Some(Kind::NumberValue(f64::NAN)) })].into_iter().collect(),
    };
    let error = json_object("metadata", Some(object)).unwrap_err();
    assert_eq!(error.field, "metadata.score");
}

#[test]
fn whole_numbers_are_kept_as_integers() {
    let number = |n: f64| Value { kind: Some(Kind::NumberValue(n)) };
    let object =
        Struct { fields: [("count".to_owned(), number(5.0)), ("ratio".to_owned(), number(0.5))].into_iter().collect() };
    let json = json_object("data", Some(object)).unwrap().unwrap_or_default();
    assert_eq!(serde_json::Value::Object(json).to_string(), r#"{"count":5,"ratio":0.5}"#);
}

#[test]
fn messages_need_an_id_a_role_and_parts() {
    let mut value = pb::Message { message_id: "m".into(), role: pb::Role::User.into(), ..Default::default() };
    assert_eq!(message("message", Some(value.clone())).unwrap_err().field, "message.parts");
    value.parts.push(pb::Part::default());
    assert_eq!(message("message", Some(value.clone())).unwrap_err().field, "message.parts[0].content");
    value.parts[0].content = Some(pb::part::Content::Text("hi".into()));
    value.role = 0;
    assert_eq!(message("message", Some(value.clone())).unwrap_err().field, "message.role");
    value.role = pb::Role::User.into();
    value.message_id.clear();
    assert_eq!(message("message", Some(value)).unwrap_err().field, "message.message_id");
}

#[test]
fn an_answer_settles_the_task_and_gives_each_artifact_once() {
    let artifact = |id: &str| pb::Artifact {
        artifact_id: id.into(),
        parts: vec![pb::Part { content: Some(pb::part::Content::Text("x".into())), ..Default::default() }],
        ..Default::default()
    };
    let answer = |state: pb::TaskState, ids: &[&str]| pb::TaskAnswer {
        state: state.into(),
        message: None,
        artifacts: ids.iter().map(|id| artifact(id)).collect(),
    };
    let settled = super::answer(Some(answer(pb::TaskState::Completed, &["a", "b"]))).unwrap().unwrap();
    assert_eq!((settled.state, settled.artifacts.len()), (TaskState::Completed, 2));
    assert!(super::answer(None).unwrap().is_none());
    for state in [pb::TaskState::Working, pb::TaskState::Submitted, pb::TaskState::Canceled, pb::TaskState::Unspecified]
    {
        assert_eq!(super::answer(Some(answer(state, &[]))).unwrap_err().field, "answer.state", "{state:?}");
    }
    let twice = super::answer(Some(answer(pb::TaskState::Completed, &["a", "a"]))).unwrap_err();
    assert_eq!((twice.field.as_str(), twice.reason.as_str()), ("answer.artifacts", "gives artifact a twice"));
    let nameless = super::answer(Some(answer(pb::TaskState::Completed, &[""]))).unwrap_err();
    assert_eq!(nameless.field, "answer.artifacts[0].artifact_id");
}

#[test]
fn json_round_trips() {
    let json = serde_json::json!({"a": [1.5, "x", null, {"b": true}]});
    let serde_json::Value::Object(object) = json else { unreachable!() };
    assert_eq!(struct_to_json("m", struct_from_json(object.clone())).unwrap(), object);
}
