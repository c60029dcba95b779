//! The workflow agent's reading of messages: gate verdicts, deciders, a
//! run's input and a gate's question.

use a2a::Role;

use super::*;

fn text(value: &str) -> Message {
    Message::new(Role::User, vec![Part::text(value)])
}

#[test]
fn a_gate_decided_over_a2a_names_the_credential_it_came_with() {
    assert_eq!(sender(&text("approve")), "a2a", "no credentials checked");
    let mut reply = text("approve");
    reply.metadata = Some([(super::super::CALLER.to_owned(), json!("release-managers"))].into());
    assert_eq!(sender(&reply), "a2a:release-managers");
}

#[test]
fn a_run_s_input_is_a_data_part_or_a_json_object_sent_as_text() {
    let input = |message: &Message| Value::Object(chorus_proto::json::struct_to_json(&input_of(message)));
    let both = Message::new(Role::User, vec![Part::text(r#"{"epic": "text"}"#), Part::data(json!({"epic": "data"}))]);
    assert_eq!(input(&both), json!({"epic": "data"}), "a data part first");
    assert_eq!(input(&text(" {\"epic\": \"search\"}\n")), json!({"epic": "search"}), "an IDE's prompt");
    assert_eq!(input(&text("ship the search epic")), json!({}), "words are no input");
    assert_eq!(input(&text("[1, 2]")), json!({}));
}

#[test]
fn a_gate_s_question_shows_its_artifacts() {
    let artifacts = json!({ "prd": "Search, for everyone", "tasks": ["a", "b"], "long": "x".repeat(3000) });
    let text = artifacts_text(Some(&artifacts));
    assert!(text.starts_with("\n\n"), "after the question: {text:?}");
    assert!(text.contains("\n\nprd: Search, for everyone") && text.contains("\n\ntasks: [\"a\",\"b\"]"), "{text}");
    assert!(text.contains(&format!("long: {}…", "x".repeat(ARTIFACT_CHARS))), "cut short");
    assert_eq!(artifacts_text(None), "");
}

#[test]
fn replies_decide_gates() {
    assert_eq!(verdict(&text("approve")), Some((wf::Decision::Approve, String::new())));
    assert_eq!(verdict(&text("Approve: looks good")), Some((wf::Decision::Approve, "looks good".into())));
    assert_eq!(verdict(&text("reject: add tests")), Some((wf::Decision::Reject, "add tests".into())));
    assert_eq!(verdict(&text("reject")), None, "a rejection needs feedback");
    assert_eq!(verdict(&text("maybe")), None);
    let data = Message::new(Role::User, vec![Part::data(json!({"decision": "reject", "reason": "too slow"}))]);
    assert_eq!(verdict(&data), Some((wf::Decision::Reject, "too slow".into())));
}

#[test]
fn an_ide_s_answer_decides_gates() {
    let answered = |option: &str| {
        let mut message = text(option);
        message.metadata = Some([(acp::PERMISSION.to_owned(), json!(option))].into_iter().collect());
        verdict(&message)
    };
    assert_eq!(answered(acp::ALLOW), Some((wf::Decision::Approve, String::new())));
    assert_eq!(answered(acp::REJECT), Some((wf::Decision::Reject, IDE_REJECTION.into())));
    assert_eq!(answered("something else"), None);
    assert_eq!(verdict(&text(acp::ALLOW)), None, "only the IDE's answer, not the word, decides");
}
