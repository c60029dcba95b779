//! The `chorus.workflow.v1` handlers as a client sees them: codes, the
//! ValidationProblems detail, paging tokens, and the runs API's bad input.

use chorus_proto::workflow::{self as pb, validation_problem::Severity, workflow_server::Workflow as _};
use chorus_workflow::grpc::WorkflowGrpc;
use prost::Message as _;
use tonic::{Code, Request};

use crate::harness::{Harness, NS, conformance, definition};

const PROBLEMS_TYPE_URL: &str = "type.googleapis.com/chorus.workflow.v1.ValidationProblems";

conformance!(
    an_invalid_put_is_invalid_argument_with_every_problem,
    put_get_and_list_round_trip,
    validate_answers_problems_in_the_response,
    run_rpcs_answer_bad_input_with_the_field_and_unknown_runs_with_not_found,
    whole_numbers_from_the_wire_are_integers,
    disable_and_enable_answer_the_definition_and_refuse_bad_input,
);

fn put(source: &str, file: &str) -> Request<pb::PutDefinitionRequest> {
    Request::new(pb::PutDefinitionRequest {
        namespace: NS.into(),
        source: source.into(),
        file: file.into(),
        created_by: "ana".into(),
    })
}

async fn an_invalid_put_is_invalid_argument_with_every_problem(h: Harness) {
    let grpc = WorkflowGrpc::new(h.workflows.clone());
    let source = "name: x\nsteps:\n  - id: a\n    spawn: {agent: coder}\n  - id: a\n    teleport: {}\n";
    let status = grpc.put_definition(put(source, "x.yaml")).await.expect_err("invalid");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let details = tonic_types::Status::decode(status.details()).expect("a google.rpc.Status");
    let Some(detail) = details.details.iter().find(|detail| detail.type_url == PROBLEMS_TYPE_URL) else {
        panic!("no ValidationProblems: {details:?}")
    };
    assert_eq!(reason(&status), ("INVALID_DEFINITION".to_owned(), "x.yaml".to_owned()));
    let problems = pb::ValidationProblems::decode(detail.value.as_slice()).expect("ValidationProblems").problems;
    let seen: Vec<(&str, u32, &str)> = problems.iter().map(|p| (p.code.as_str(), p.line, p.field.as_str())).collect();
    assert_eq!(
        seen,
        [
            ("missing_field", 4, "steps[0].spawn.input"),
            ("duplicate_step_id", 5, "steps[1].id"),
            ("unknown_step_kind", 6, "steps[1].teleport"),
        ]
    );
    assert!(problems.iter().all(|p| p.file == "x.yaml" && p.severity == Severity::Error as i32));
    assert_eq!(h.stored_rows().await, 0);
}

async fn put_get_and_list_round_trip(h: Harness) {
    let grpc = WorkflowGrpc::new(h.workflows.clone());
    for text in ["one", "two"] {
        grpc.put_definition(put(&definition("deploy", text), "deploy.yaml")).await.expect("put");
    }
    let again = grpc.put_definition(put(&definition("deploy", "two"), "deploy.yaml")).await.expect("again");
    let again = again.into_inner();
    assert!(again.unchanged);
    assert_eq!(again.definition.expect("definition").version, 2);
    let get = |version| Request::new(pb::GetDefinitionRequest { namespace: NS.into(), name: "deploy".into(), version });
    let first = grpc.get_definition(get(1)).await.expect("v1").into_inner();
    assert!(first.source.contains("one"));
    let status = grpc.get_definition(get(7)).await.expect_err("v7");
    assert_eq!(status.code(), Code::NotFound);
    let list = |page_token: String| {
        Request::new(pb::ListDefinitionsRequest {
            namespace: NS.into(),
            name: "deploy".into(),
            page_size: 1,
            page_token,
            ..Default::default()
        })
    };
    let page = grpc.list_definitions(list(String::new())).await.expect("page 1").into_inner();
    assert_eq!(page.definitions[0].version, 2);
    assert!(page.definitions[0].source.is_empty());
    let next = grpc.list_definitions(list(page.next_page_token)).await.expect("page 2").into_inner();
    assert_eq!(next.definitions[0].version, 1);
    assert!(next.next_page_token.is_empty());
    let status = grpc.list_definitions(list("garbage!".into())).await.expect_err("bad token");
    assert_eq!(status.code(), Code::InvalidArgument);
}

async fn validate_answers_problems_in_the_response(h: Harness) {
    let grpc = WorkflowGrpc::new(h.workflows.clone());
    let request = |source: &str| {
        Request::new(pb::ValidateDefinitionRequest {
            namespace: NS.into(),
            source: source.into(),
            file: "v.yaml".into(),
        })
    };
    let answer = grpc.validate_definition(request(&definition("v", "{{ nope.x }}"))).await.expect("validate");
    let answer = answer.into_inner();
    assert!(!answer.valid);
    assert_eq!(answer.name, "v");
    assert_eq!(answer.problems[0].code, "unknown_reference");
    assert_eq!(answer.problems[0].field, "steps[0].message.text");
    // An empty file is a definition with no document, not a missing field.
    let empty = grpc.validate_definition(request("")).await.expect("validate").into_inner();
    assert!(!empty.valid);
    let problem = &empty.problems[0];
    assert_eq!((problem.code.as_str(), problem.line, problem.column), ("document_count", 1, 1));
    assert_eq!(h.stored_rows().await, 0);
}

async fn run_rpcs_answer_bad_input_with_the_field_and_unknown_runs_with_not_found(h: Harness) {
    let grpc = WorkflowGrpc::new(h.workflows.clone());
    let field = |status: &tonic::Status| {
        let details = tonic_types::Status::decode(status.details()).expect("a google.rpc.Status");
        format!("{details:?}")
    };
    let status = grpc.start_run(Request::new(pb::StartRunRequest::default())).await.expect_err("no namespace");
    assert_eq!(status.code(), Code::InvalidArgument);
    let start = pb::StartRunRequest { namespace: NS.into(), workflow: "nope".into(), ..Default::default() };
    let status = grpc.start_run(Request::new(start)).await.expect_err("unknown workflow");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(reason(&status), ("WORKFLOW_NOT_FOUND".to_owned(), "nope".to_owned()));
    for wait_finished in [false, true] {
        let get = pb::GetRunRequest { namespace: NS.into(), run_id: "no-such-run".into(), wait_finished };
        let status = grpc.get_run(Request::new(get)).await.expect_err("unknown run");
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(reason(&status), ("RUN_NOT_FOUND".to_owned(), "no-such-run".to_owned()));
    }
    let decide = pb::DecideGateRequest {
        namespace: NS.into(),
        run_id: "r".into(),
        step_id: "g".into(),
        decision: pb::Decision::Reject.into(),
        decided_by: "ana".into(),
        ..Default::default()
    };
    let status = grpc.decide_gate(Request::new(decide)).await.expect_err("a rejection needs a reason");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(field(&status).contains("reason"), "{status:?}");
    let list = pb::ListRunsRequest { namespace: NS.into(), page_token: "garbage".into(), ..Default::default() };
    let status = grpc.list_runs(Request::new(list)).await.expect_err("bad token");
    assert!(field(&status).contains("page_token"), "{status:?}");
    let watch = pb::WatchRunRequest { namespace: NS.into(), run_id: "r".into(), after_cursor: "x".into() };
    let status = grpc.watch_run(Request::new(watch)).await.err().expect("bad cursor");
    assert_eq!(status.code(), Code::InvalidArgument);
}

async fn whole_numbers_from_the_wire_are_integers(h: Harness) {
    h.put(
        r#"name: counted
inputs:
  count: {type: integer, required: true}
  size: {type: number, required: true}
  retries: {type: integer, default: 3}
steps:
- id: say
  message: {topic: news, text: "{{ inputs.count }} of {{ inputs.size }}, {{ inputs.retries }} tries"}
"#,
    )
    .await;
    let grpc = WorkflowGrpc::new(h.workflows.clone());
    let bare = pb::StartRunRequest { namespace: NS.into(), workflow: "counted".into(), ..Default::default() };
    let status = grpc.start_run(Request::new(bare)).await.expect_err("no input");
    assert!(status.message().contains("misses the required inputs count, size"), "every one named: {status:?}");
    let number = |n: f64| prost_types::Value { kind: Some(prost_types::value::Kind::NumberValue(n)) };
    let input = prost_types::Struct {
        fields: [("count".to_owned(), number(5.0)), ("size".to_owned(), number(10.0))].into_iter().collect(),
    };
    let start = pb::StartRunRequest {
        namespace: NS.into(),
        workflow: "counted".into(),
        input: Some(input),
        ..Default::default()
    };
    let run = grpc.start_run(Request::new(start)).await.expect("an integer input of 5 is an integer").into_inner();
    let whole = serde_json::json!({"count": 5, "retries": 3, "size": 10});
    let input = chorus_proto::json::struct_to_json(&run.input.expect("the run's input"));
    assert_eq!(serde_json::Value::Object(input), whole, "integers, not 5.0");
    let run = h.finished(&run.id).await;
    let say = &run.body.steps[0];
    assert_eq!(say.input["text"], "5 of 10, 3 tries", "{run:#?}");
    assert_eq!(serde_json::Value::Object(run.body.input), whole, "the default is stored as written");
}

/// The reason of `status`'s `google.rpc.ErrorInfo`, in the workflow
/// service's domain, and the first of the ids it is about.
async fn disable_and_enable_answer_the_definition_and_refuse_bad_input(h: Harness) {
    let grpc = WorkflowGrpc::new(h.workflows.clone());
    grpc.put_definition(put(&definition("deploy", "one"), "deploy.yaml")).await.expect("put");
    let disable = |name: &str, reason: String| {
        Request::new(pb::DisableWorkflowRequest {
            namespace: NS.into(),
            name: name.into(),
            reason,
            disabled_by: "ana".into(),
        })
    };
    for (name, reason, code) in [
        ("", String::new(), Code::InvalidArgument),
        ("deploy", "x".repeat(4097), Code::InvalidArgument),
        ("nope", String::new(), Code::NotFound),
    ] {
        let status = grpc.disable_workflow(disable(name, reason)).await.expect_err("refused");
        assert_eq!(status.code(), code, "{status:?}");
    }
    let disabled = grpc.disable_workflow(disable("deploy", "freeze".into())).await.expect("disable").into_inner();
    let record = disabled.disabled.expect("disabled");
    assert_eq!((record.disabled_by.as_str(), record.reason.as_str()), ("ana", "freeze"));
    assert!(record.disabled_at.is_some());
    let start =
        Request::new(pb::StartRunRequest { namespace: NS.into(), workflow: "deploy".into(), ..Default::default() });
    let status = grpc.start_run(start).await.expect_err("disabled");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), ("WORKFLOW_DISABLED".to_owned(), "deploy".to_owned()));
    let enable =
        Request::new(pb::EnableWorkflowRequest { namespace: NS.into(), name: "deploy".into(), ..Default::default() });
    let enabled = grpc.enable_workflow(enable).await.expect("enable").into_inner();
    assert_eq!((enabled.version, enabled.disabled), (1, None));
}

fn reason(status: &tonic::Status) -> (String, String) {
    use tonic_types::StatusExt as _;
    let info = status.get_details_error_info().unwrap_or_else(|| panic!("no ErrorInfo: {status:?}"));
    assert_eq!(info.domain, "workflow.chorus.dev");
    let about = ["file", "workflow", "run_id"].iter().find_map(|key| info.metadata.get(*key)).cloned();
    (info.reason, about.unwrap_or_default())
}
