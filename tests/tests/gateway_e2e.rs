//! The A2A gateway end to end, as an external agent sees it: the real
//! `chorus dev` binary, its agent cards, JSON-RPC and HTTP+JSON over real
//! sockets, SSE streams read to their end, multi-turn tasks, and one run on
//! PostgreSQL.

use std::time::{Duration, Instant};

use chorus_proto::taskstore::{AddMessageRequest, Role};
use chorus_runtime::testing::PostgresDatabase;
use chorus_tests::{
    Sandbox,
    a2a::{A2a, REQUEST_ID, assert_rest_error, assert_rpc_error, describe, events, json, message, state, text, unique},
    tasks::{create_task, text_message},
};
use reqwest::{
    Method, StatusCode,
    header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED},
};
use serde_json::{Value, json};

/// `(protocolBinding, url, protocolVersion)` of each interface of a card.
fn interfaces(card: &Value) -> Vec<(String, String, String)> {
    let interfaces = card["supportedInterfaces"].as_array().unwrap_or_else(|| panic!("no interfaces: {card:#}"));
    let field = |interface: &Value, name: &str| interface[name].as_str().unwrap_or_default().to_owned();
    interfaces.iter().map(|i| (field(i, "protocolBinding"), field(i, "url"), field(i, "protocolVersion"))).collect()
}

fn ids(tasks: &Value) -> Vec<String> {
    let tasks = tasks.as_array().unwrap_or_else(|| panic!("not a task list: {tasks:#}"));
    tasks.iter().map(|task| task["id"].as_str().unwrap_or_default().to_owned()).collect()
}

fn header(response: &reqwest::Response, name: reqwest::header::HeaderName) -> String {
    let value = response.headers().get(&name).and_then(|value| value.to_str().ok());
    value.unwrap_or_else(|| panic!("no {name} header: {:?}", response.headers())).to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_cards_describe_every_agent_at_the_address_it_serves() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let base = server.url();

    let response = a2a.get("/.well-known/agent-card.json").send().await.expect("the default card");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(header(&response, CONTENT_TYPE).starts_with("application/json"));
    assert!(header(&response, CACHE_CONTROL).contains("max-age="), "{:?}", response.headers());
    let changed = header(&response, LAST_MODIFIED);
    assert!(!changed.is_empty());
    let etag = header(&response, ETAG);
    let card: Value = response.json().await.expect("a JSON card");
    assert_eq!(card["name"], "Echo", "the default agent is echo: {card:#}");
    for field in ["description", "version"] {
        assert!(card[field].as_str().is_some_and(|value| !value.is_empty()), "{field}: {card:#}");
    }
    let expected = [
        ("JSONRPC".to_owned(), format!("{base}/a2a/echo"), "1.0".to_owned()),
        ("HTTP+JSON".to_owned(), format!("{base}/a2a/echo/rest"), "1.0".to_owned()),
        ("GRPC".to_owned(), server.address().to_string(), "1.0".to_owned()),
    ];
    assert_eq!(interfaces(&card), expected);
    assert_eq!(card["capabilities"]["streaming"], true);
    assert_eq!(card["capabilities"]["pushNotifications"], true);
    assert!(card["defaultInputModes"].as_array().is_some_and(|modes| modes.contains(&json!("text/plain"))));
    assert_eq!(card["skills"][0]["id"], "echo");
    assert!(card.get("securitySchemes").is_none(), "an open gateway declares no security: {card:#}");

    let cached = a2a.get("/.well-known/agent-card.json").header(IF_NONE_MATCH, &etag).send().await.expect("304");
    assert_eq!(cached.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(header(&cached, ETAG), etag);
    assert!(cached.bytes().await.expect("no body").is_empty());
    let stale = a2a.get("/.well-known/agent-card.json").header(IF_NONE_MATCH, "\"stale\"").send().await;
    assert_eq!(stale.expect("200").status(), StatusCode::OK, "another ETag gets the card");
    let weak = a2a.get("/.well-known/agent-card.json").header(IF_NONE_MATCH, format!("\"x\", W/{etag}")).send().await;
    assert_eq!(weak.expect("304").status(), StatusCode::NOT_MODIFIED, "If-None-Match compares weakly");
    let since = a2a.get("/.well-known/agent-card.json").header(IF_MODIFIED_SINCE, &changed).send().await;
    assert_eq!(since.expect("304").status(), StatusCode::NOT_MODIFIED, "not modified since {changed}");
    let before = "Sat, 01 Jan 2000 00:00:00 GMT";
    let older = a2a.get("/.well-known/agent-card.json").header(IF_MODIFIED_SINCE, before).send().await;
    assert_eq!(older.expect("200").status(), StatusCode::OK, "modified since 2000");
    let alias = a2a.get("/.well-known/agent.json").send().await.expect("the 0.2 alias");
    assert_eq!(header(&alias, ETAG), etag);
    assert_eq!(alias.json::<Value>().await.expect("a JSON card"), card);

    let (status, catalog) = json(a2a.get("/a2a")).await;
    assert_eq!(status, StatusCode::OK);
    let agents = catalog["agents"].as_array().unwrap_or_else(|| panic!("no agents: {catalog:#}"));
    let names: Vec<&str> = agents.iter().filter_map(|agent| agent["name"].as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(agents.contains(&card), "the catalog lists the default card");
    let Some(tck) = agents.iter().find(|agent| agent["skills"][0]["id"] == "tck") else {
        panic!("no tck agent in {catalog:#}");
    };
    let (status, tck_card) = json(a2a.get("/a2a/tck/.well-known/agent-card.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&tck_card, tck, "the per-agent card is the catalog's");
    let tck_interfaces = interfaces(tck);
    assert_eq!(tck_interfaces[0], ("JSONRPC".to_owned(), format!("{base}/a2a/tck"), "1.0".to_owned()));
    assert_eq!(tck_interfaces[1].1, format!("{base}/a2a/tck/rest"));
    assert_eq!(tck["supportedInterfaces"][2]["tenant"], "default/tck", "gRPC reaches tck through a tenant");
    let (status, missing) = json(a2a.get("/a2a/nobody/.well-known/agent-card.json")).await;
    assert_rest_error(status, &missing, StatusCode::NOT_FOUND, "AGENT_NOT_FOUND");

    // The advertised URLs are the ones that work.
    let jsonrpc_url = &tck_interfaces[0].1;
    let send = json!({ "jsonrpc": "2.0", "id": 7, "method": "SendMessage",
        "params": { "message": message(&unique("tck-complete-task"), "hi") } });
    let (status, answer) = json(a2a.http().post(jsonrpc_url).header("A2A-Version", "1.0").json(&send)).await;
    assert_eq!((status, &answer["id"]), (StatusCode::OK, &json!(7)), "{answer:#}");
    assert_eq!(state(&answer["result"]["task"]), "TASK_STATE_COMPLETED", "{answer:#}");
    let rest_url = format!("{}/message:send", tck_interfaces[1].1);
    let body = json!({ "message": message(&unique("tck-complete-task"), "hi") });
    let request = a2a.http().post(rest_url).header("A2A-Version", "1.0").json(&body);
    let (status, answer) = json(request).await;
    assert_eq!(status, StatusCode::OK, "{answer:#}");
    assert_eq!(text(&answer["task"]["status"]["message"]), "Hello from TCK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_rpc_sends_gets_lists_and_cancels_tasks() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let a2a = A2a::new(&server);

    let task = a2a.send("echo", message("m-1", "hello gateway")).await;
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "a blocking send waits for the end: {task:#}");
    let [artifact] = task["artifacts"].as_array().map(Vec::as_slice).unwrap_or_default() else {
        panic!("one artifact expected: {task:#}");
    };
    assert_eq!((&artifact["name"], text(artifact)), (&json!("echo"), "hello gateway"));
    assert_eq!(task["status"]["message"]["role"], "ROLE_AGENT");
    assert_eq!(text(&task["status"]["message"]), "hello gateway");
    let history = task["history"].as_array().unwrap_or_else(|| panic!("no history: {task:#}"));
    let roles: Vec<&Value> = history.iter().map(|message| &message["role"]).collect();
    assert_eq!(roles, [&json!("ROLE_USER"), &json!("ROLE_AGENT")]);
    assert_eq!(history[0]["messageId"], "m-1");
    let id = task["id"].as_str().expect("a task id").to_owned();

    let whole = a2a.call("echo", "GetTask", json!({ "id": id })).await;
    assert_eq!(whole, task, "GetTask reads what SendMessage answered");
    let none = a2a.call("echo", "GetTask", json!({ "id": id, "historyLength": 0 })).await;
    assert!(none.get("history").is_none(), "historyLength 0 omits the history: {none:#}");
    assert_eq!(none["artifacts"], task["artifacts"]);
    let last = a2a.call("echo", "GetTask", json!({ "id": id, "historyLength": 1 })).await;
    assert_eq!(last["history"], json!([history[1]]), "historyLength 1 keeps the latest message");

    let waiting = a2a.send("tck", message(&unique("tck-input-required"), "which table?")).await;
    assert_eq!(state(&waiting), "TASK_STATE_INPUT_REQUIRED", "a blocking send returns when input is required");
    let waiting_id = waiting["id"].as_str().unwrap_or_default().to_owned();
    let third = a2a.send("echo", message("m-3", "again")).await;
    let fourth = a2a.send("echo", message("m-4", "once more")).await;
    let newest_first = [&fourth, &third, &task].map(|task| task["id"].as_str().unwrap_or_default().to_owned());

    let mut listed = Vec::new();
    let mut token = String::new();
    for _ in 0..3 {
        let page = a2a.call("echo", "ListTasks", json!({ "pageSize": 1, "pageToken": token })).await;
        assert_eq!((&page["pageSize"], &page["totalSize"]), (&json!(1), &json!(3)), "{page:#}");
        assert!(page["tasks"][0].get("artifacts").is_none(), "listed without artifacts by default: {page:#}");
        listed.extend(ids(&page["tasks"]));
        token = page["nextPageToken"].as_str().unwrap_or_else(|| panic!("no nextPageToken: {page:#}")).to_owned();
        if listed.len() < 3 {
            assert!(!token.is_empty(), "a page before the last has a nextPageToken: {page:#}");
        }
    }
    assert_eq!(listed, newest_first, "pages list every task of the agent once, newest first");
    assert_eq!(token, "", "the last page has an empty nextPageToken");
    let completed =
        a2a.call("echo", "ListTasks", json!({ "status": "TASK_STATE_COMPLETED", "includeArtifacts": true }));
    let completed = completed.await;
    assert_eq!(ids(&completed["tasks"]), newest_first);
    assert_eq!(completed["tasks"][2]["artifacts"], task["artifacts"], "includeArtifacts lists them");
    let interrupted = a2a.call("echo", "ListTasks", json!({ "status": "TASK_STATE_INPUT_REQUIRED" })).await;
    assert_eq!(ids(&interrupted["tasks"]), Vec::<String>::new(), "the tck agent's task is not echo's: {interrupted:#}");

    // Each agent's endpoint serves its own tasks: another's is not found there.
    let theirs = a2a.call("tck", "ListTasks", json!({})).await;
    assert_eq!((ids(&theirs["tasks"]), &theirs["totalSize"]), (vec![waiting_id.clone()], &json!(1)), "{theirs:#}");
    let foreign = a2a.call_error("tck", "GetTask", json!({ "id": id })).await;
    assert_rpc_error(&foreign, -32001, "TASK_NOT_FOUND");
    let foreign = a2a.call_error("echo", "CancelTask", json!({ "id": waiting_id })).await;
    assert_rpc_error(&foreign, -32001, "TASK_NOT_FOUND");
    let push = json!({ "taskId": waiting_id, "url": "https://example.com/hook" });
    let foreign = a2a.call_error("echo", "CreateTaskPushNotificationConfig", push).await;
    assert_rpc_error(&foreign, -32001, "TASK_NOT_FOUND");
    assert_eq!(state(&a2a.call("tck", "GetTask", json!({ "id": waiting_id })).await), "TASK_STATE_INPUT_REQUIRED");

    let canceled = a2a.call("tck", "CancelTask", json!({ "id": waiting_id })).await;
    assert_eq!(state(&canceled), "TASK_STATE_CANCELED", "{canceled:#}");
    let read = a2a.call("tck", "GetTask", json!({ "id": waiting_id })).await;
    assert_eq!(state(&read), "TASK_STATE_CANCELED");
    let again = a2a.call_error("tck", "CancelTask", json!({ "id": waiting_id })).await;
    assert_rpc_error(&again, -32002, "TASK_NOT_CANCELABLE");
    let finished = a2a.call_error("echo", "CancelTask", json!({ "id": id })).await;
    assert_rpc_error(&finished, -32002, "TASK_NOT_CANCELABLE");
    let said = finished["message"].as_str().unwrap_or_default();
    assert!(said.contains("is TASK_STATE_COMPLETED and"), "the state as the wire names it: {finished:#}");
}

/// The tck agent's `tck-stream-artifact-chunked` scenario, as 1.0 StreamResponses.
#[track_caller]
fn assert_chunked(events: &[Value]) {
    let described: Vec<String> = events.iter().map(describe).collect();
    assert_eq!(described, ["task SUBMITTED", "status WORKING", "artifact", "artifact", "status COMPLETED"]);
    let task_id = &events[0]["task"]["id"];
    for update in &events[1..] {
        let update = update.get("statusUpdate").or_else(|| update.get("artifactUpdate")).expect("an update");
        assert_eq!(&update["taskId"], task_id, "{events:#?}");
        assert_eq!(update["contextId"], events[0]["task"]["contextId"], "{events:#?}");
    }
    let (first, last) = (&events[2]["artifactUpdate"], &events[3]["artifactUpdate"]);
    assert_eq!(text(&first["artifact"]), "chunk-1 ");
    assert_ne!(first["append"], true, "the first chunk starts the artifact: {first:#}");
    assert_ne!(first["lastChunk"], true, "{first:#}");
    assert_eq!(text(&last["artifact"]), "chunk-2");
    assert_eq!((&last["append"], &last["lastChunk"]), (&json!(true), &json!(true)), "{last:#}");
    assert_eq!(first["artifact"]["artifactId"], last["artifact"]["artifactId"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_artifacts_stream_in_order_over_json_rpc_and_rest() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);

    let params = json!({ "message": message(&unique("tck-stream-artifact-chunked"), "in pieces") });
    let rpc = events(a2a.rpc("tck", "SendStreamingMessage", params)).await;
    for event in &rpc {
        assert_eq!((&event["jsonrpc"], &event["id"]), (&json!("2.0"), &json!(REQUEST_ID)), "{event:#}");
        assert!(event.get("error").is_none(), "{event:#}");
    }
    let results: Vec<Value> = rpc.iter().map(|event| event["result"].clone()).collect();
    assert_chunked(&results);

    let body = json!({ "message": message(&unique("tck-stream-artifact-chunked"), "in pieces") });
    let rest = events(a2a.rest(Method::POST, "tck", "message:stream").json(&body)).await;
    assert_chunked(&rest);
    assert_ne!(rest[0]["task"]["id"], results[0]["task"]["id"], "each send makes its own task");

    // The task store joined the chunks into one artifact.
    let task = a2a.call("tck", "GetTask", json!({ "id": rest[0]["task"]["id"] })).await;
    assert_eq!(state(&task), "TASK_STATE_COMPLETED");
    let parts: Vec<&Value> = task["artifacts"][0]["parts"].as_array().into_iter().flatten().collect();
    assert_eq!(parts, [&json!({ "text": "chunk-1 " }), &json!({ "text": "chunk-2" })], "{task:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_get_the_task_then_its_changes_until_it_completes() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);

    let sent = Instant::now();
    let params = json!({
        "message": message(&unique("test-resubscribe-message-id"), "take your time"),
        "configuration": { "returnImmediately": true },
    });
    let started = a2a.call("tck", "SendMessage", params).await;
    assert!(sent.elapsed() < Duration::from_secs(3), "returnImmediately answered after {:?}", sent.elapsed());
    let id = started["task"]["id"].as_str().unwrap_or_else(|| panic!("no task: {started:#}")).to_owned();
    assert!(["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"].contains(&state(&started["task"])), "{started:#}");
    // A task created before the agent's worker was waiting (the server has
    // just started) waits its turn in the queue for a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    while state(&a2a.call("tck", "GetTask", json!({ "id": id })).await) != "TASK_STATE_WORKING" {
        assert!(Instant::now() < deadline, "the tck agent did not take the task");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Two subscribers at once, one per binding, see the same changes.
    let rpc = events(a2a.rpc("tck", "SubscribeToTask", json!({ "id": id })));
    let rest = events(a2a.rest(Method::POST, "tck", &format!("tasks/{id}:subscribe")));
    let (rpc, rest) = tokio::join!(rpc, rest);
    let rpc: Vec<Value> = rpc.iter().map(|event| event["result"].clone()).collect();
    for events in [&rpc, &rest] {
        let described: Vec<String> = events.iter().map(describe).collect();
        assert_eq!(described.first().map(String::as_str), Some("task WORKING"), "the task comes first: {events:#?}");
        assert_eq!(events[0]["task"]["id"], id);
        assert_eq!(described.last().map(String::as_str), Some("status COMPLETED"), "{events:#?}");
        assert_eq!(described.len(), 2, "nothing but the completion happened meanwhile: {events:#?}");
    }
    assert!(sent.elapsed() >= Duration::from_secs(4), "the scenario keeps the task working for 4 s");

    let done = a2a.call_error("tck", "SubscribeToTask", json!({ "id": id })).await;
    assert_rpc_error(&done, -32004, "UNSUPPORTED_OPERATION");
    let (status, body) = json(a2a.rest(Method::GET, "tck", &format!("tasks/{id}:subscribe"))).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "UNSUPPORTED_OPERATION");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_message_continues_an_input_required_task() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);

    let first = a2a.send("tck", message(&unique("tck-input-required"), "book a table")).await;
    assert_eq!(state(&first), "TASK_STATE_INPUT_REQUIRED");
    assert_eq!(text(&first["status"]["message"]), "Please provide more input");
    let (id, context) = (first["id"].clone(), first["contextId"].clone());

    let mut follow_up = message(&unique("tck-complete-task"), "for two");
    follow_up["taskId"] = id.clone();
    let done = a2a.send("tck", follow_up).await;
    assert_eq!((&done["id"], &done["contextId"]), (&id, &context), "the same task and context: {done:#}");
    assert_eq!(state(&done), "TASK_STATE_COMPLETED");
    assert_eq!(text(&done["status"]["message"]), "Hello from TCK");
    let history = done["history"].as_array().unwrap_or_else(|| panic!("no history: {done:#}"));
    let said: Vec<&str> = history.iter().filter(|message| message["role"] == "ROLE_USER").map(text).collect();
    assert_eq!(said, ["book a table", "for two"]);
    let added = history.iter().find(|message| text(message) == "for two").expect("the follow-up in the history");
    assert_eq!((&added["taskId"], &added["contextId"]), (&id, &context), "the context is inferred from the task");

    let other = a2a.send("tck", message(&unique("tck-input-required"), "another")).await;
    let mut wrong = message(&unique("tck-complete-task"), "elsewhere");
    wrong["taskId"] = other["id"].clone();
    wrong["contextId"] = json!("not-its-context");
    let error = a2a.call_error("tck", "SendMessage", json!({ "message": wrong })).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    assert!(error["message"].as_str().unwrap_or_default().contains("contextId"), "{error:#}");
    let unchanged = a2a.call("tck", "GetTask", json!({ "id": other["id"] })).await;
    assert_eq!(state(&unchanged), "TASK_STATE_INPUT_REQUIRED");
    assert_eq!(unchanged["history"], other["history"], "the refused message was not added");

    let mut elsewhere = message(&unique("tck-complete-task"), "through echo");
    elsewhere["taskId"] = other["id"].clone();
    let error = a2a.call_error("echo", "SendMessage", json!({ "message": elsewhere })).await;
    assert_rpc_error(&error, -32001, "TASK_NOT_FOUND");
    let unchanged = a2a.call("tck", "GetTask", json!({ "id": other["id"] })).await;
    assert_eq!(unchanged["history"], other["history"], "a message to another agent's URL was not added");

    // Answers sent at once: the first to land continues the task, the others
    // are refused and leave no trace.
    let answers = (0..4).map(|n| {
        let mut answer = message(&unique("plain-answer"), &format!("answer {n}"));
        answer["taskId"] = other["id"].clone();
        let request = a2a.rpc("tck", "SendMessage", json!({ "message": answer }));
        async { json(request).await.1 }
    });
    let replies = futures_util::future::join_all(answers).await;
    let completed = replies.iter().filter(|reply| reply["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED");
    let refused = replies.iter().filter(|reply| reply["error"]["code"] == -32004);
    assert_eq!((completed.count(), refused.count()), (1, 3), "{replies:#?}");
    let settled = a2a.call("tck", "GetTask", json!({ "id": other["id"] })).await;
    let said = settled["history"].as_array().expect("history").iter().filter(|m| m["role"] == "ROLE_USER").count();
    assert_eq!(said, 2, "the question's message and one answer: {settled:#}");
    assert_eq!(settled["artifacts"].as_array().map_or(0, Vec::len), 1, "one turn ran: {settled:#}");

    let mut too_late = message(&unique("tck-complete-task"), "and dessert");
    too_late["taskId"] = id.clone();
    let error = a2a.call_error("tck", "SendMessage", json!({ "message": too_late })).await;
    assert_rpc_error(&error, -32004, "UNSUPPORTED_OPERATION");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_dev_on_postgres_serves_a2a() {
    let Some(database) = PostgresDatabase::create_or_skip().await else { return };
    let sandbox = Sandbox::new();
    let server = sandbox.dev().env("CHORUS_STORAGE__DATABASE_URL", database.url()).start().await;
    let a2a = A2a::new(&server);

    let task = a2a.send("echo", message("pg-1", "kept in postgres")).await;
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task:#}");
    assert_eq!(text(&task["artifacts"][0]), "kept in postgres");
    let id = task["id"].as_str().expect("a task id");
    let (status, read) = json(a2a.rest(Method::GET, "echo", &format!("tasks/{id}"))).await;
    assert_eq!((status, &read), (StatusCode::OK, &task));
    assert_eq!(a2a.task_count().await, 1);
    let streamed =
        events(a2a.rpc("tck", "SendStreamingMessage", json!({ "message": message(&unique("tck-stream-001"), "pg") })));
    let described: Vec<String> = streamed.await.iter().map(|event| describe(&event["result"])).collect();
    assert_eq!(described, ["task SUBMITTED", "status WORKING", "artifact", "status COMPLETED"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_larger_than_a_grpc_message_are_read_whole_and_listed_in_pages() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let mut tasks = server.task_store().await.max_decoding_message_size(usize::MAX);
    let megabyte = "m".repeat(1 << 20);

    // Five messages of 1 MiB: more than the 4 MiB a gRPC answer holds by default.
    let big = create_task(&mut tasks, "default", "echo", &megabyte).await;
    for _ in 0..4 {
        let message = text_message(Role::User, &megabyte);
        let request = AddMessageRequest {
            namespace: "default".into(),
            task_id: big.id.clone(),
            message: Some(message),
            lease_id: String::new(),
            brief: true,
        };
        tasks.add_message(request).await.expect("a message of 1 MiB");
    }
    let read = a2a.call("echo", "GetTask", json!({ "id": big.id })).await;
    assert_eq!(read["history"].as_array().map_or(0, Vec::len), 5, "the whole history");
    for _ in 0..3 {
        create_task(&mut tasks, "default", "echo", &megabyte).await;
    }

    // Pages stay under the limit: the 5 MiB task alone, then the others as they fit.
    let (mut listed, mut pages, mut token) = (Vec::new(), 0, String::new());
    loop {
        let page = a2a.call("echo", "ListTasks", json!({ "pageToken": token })).await;
        pages += 1;
        let ids = ids(&page["tasks"]);
        assert!(!ids.is_empty(), "every page holds a task: {}", page["nextPageToken"]);
        listed.extend(ids);
        token = page["nextPageToken"].as_str().unwrap_or_default().to_owned();
        if token.is_empty() {
            break;
        }
    }
    listed.sort();
    listed.dedup();
    assert_eq!((listed.len(), pages > 1), (4, true), "every task once, over {pages} pages");
}
