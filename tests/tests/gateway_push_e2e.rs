//! Push notifications end to end: the real `chorus dev` POSTs each task
//! change to a webhook the test runs on loopback (allowed only with
//! `gateway.push.allow_private`), with the caller's credentials, and never
//! hands the secrets back.

use std::time::Duration;

use chorus_tests::{
    Sandbox,
    a2a::{
        A2a, Notification, Webhook, assert_rest_error, assert_rpc_error, describe, json, message, state, text, unique,
    },
    push::{push_server, with_push},
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const TOKEN: &str = "notification-token-4e1f";
const CREDENTIALS: &str = "webhook-credentials-9b2c";

/// Asserts `text` (a response body) holds neither secret.
#[track_caller]
fn assert_no_secrets(text: &str) {
    assert!(!text.contains(TOKEN) && !text.contains(CREDENTIALS), "a secret was echoed: {text}");
}

/// Reads notifications up to the task's completion, and checks what every
/// one carries.
async fn notifications(webhook: &mut Webhook, task_id: &Value, token: &str) -> Vec<Notification> {
    let mut received = Vec::new();
    while received.last().is_none_or(|last: &Notification| describe(&last.body) != "status COMPLETED") {
        received.push(webhook.next().await);
    }
    for notification in &received {
        assert_eq!(notification.header("authorization"), format!("Bearer {CREDENTIALS}"), "{notification:#?}");
        assert_eq!(notification.header("x-a2a-notification-token"), token, "{notification:#?}");
        assert!(notification.header("content-type").starts_with("application/a2a+json"), "{notification:#?}");
        let update = notification.body.get("statusUpdate").or_else(|| notification.body.get("artifactUpdate"));
        assert_eq!(update.map(|update| &update["taskId"]), Some(task_id), "{notification:#?}");
    }
    received
}

fn described(notifications: &[Notification]) -> Vec<String> {
    notifications.iter().map(|notification| describe(&notification.body)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_notifications_reach_the_webhook_in_order_with_their_credentials() {
    let mut webhook = Webhook::start().await;
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().env("CHORUS_GATEWAY__PUSH__ALLOW_PRIVATE", "true").start().await;
    let a2a = A2a::new(&server);

    let push = json!({ "url": webhook.url(), "token": TOKEN,
        "authentication": { "scheme": "Bearer", "credentials": CREDENTIALS } });
    let params = json!({
        "message": message(&unique("tck-stream-artifact-chunked"), "push it"),
        "configuration": { "taskPushNotificationConfig": push },
    });
    let task = a2a.call("tck", "SendMessage", params).await["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task:#}");
    let id = task["id"].clone();

    let received = notifications(&mut webhook, &id, TOKEN).await;
    let every_change = ["status WORKING", "artifact", "artifact", "status COMPLETED"];
    assert_eq!(described(&received), every_change, "every change of the task, in order");
    let (first, last) = (&received[1].body["artifactUpdate"], &received[2].body["artifactUpdate"]);
    assert_eq!((text(&first["artifact"]), text(&last["artifact"])), ("chunk-1 ", "chunk-2"));
    assert_eq!((&last["append"], &last["lastChunk"]), (&json!(true), &json!(true)));
    webhook.assert_quiet(Duration::from_millis(500)).await;
    let page = a2a.get("/metrics").send().await.expect("GET /metrics").text().await.expect("a page");
    assert!(page.contains("chorus_push_notifications_total{outcome=\"delivered\"} 4\n"), "{page}");

    // The config reads back without its secrets, on both bindings.
    let response = a2a.rpc("tck", "ListTaskPushNotificationConfigs", json!({ "taskId": id })).send().await;
    let listed = response.expect("list").text().await.expect("a body");
    assert_no_secrets(&listed);
    let listed: Value = serde_json::from_str(&listed).expect("JSON");
    let [config] = listed["result"]["configs"].as_array().map(Vec::as_slice).unwrap_or_default() else {
        panic!("one config expected: {listed:#}");
    };
    assert_eq!((&config["url"], &config["taskId"]), (&json!(webhook.url()), &id), "{config:#}");
    assert_eq!(config["authentication"], json!({ "scheme": "Bearer" }), "the scheme, not the credentials");
    assert!(config.get("token").is_none(), "{config:#}");
    let config_id = config["id"].as_str().filter(|id| !id.is_empty()).expect("a config id").to_owned();
    let got = a2a.call("tck", "GetTaskPushNotificationConfig", json!({ "taskId": id, "id": config_id })).await;
    assert_eq!(&got, config);
    // The proto's pageSize has no presence: 0 is unset, as over gRPC.
    let unset = a2a.call("tck", "ListTaskPushNotificationConfigs", json!({ "taskId": id, "pageSize": 0 })).await;
    assert_eq!(unset["configs"], json!([config]), "{unset:#}");
    let path = format!("tasks/{}/pushNotificationConfigs/{config_id}", id.as_str().unwrap_or_default());
    let rest = a2a.rest(Method::GET, "tck", &path).send().await.expect("REST get");
    assert_eq!(rest.status(), StatusCode::OK);
    let rest = rest.text().await.expect("a body");
    assert_no_secrets(&rest);
    assert_eq!(serde_json::from_str::<Value>(&rest).expect("JSON"), got);

    // A config registered on a waiting task reports the rest of its turns.
    let waiting = a2a.send("tck", message(&unique("tck-input-required"), "and then?")).await;
    let waiting_id = waiting["id"].clone();
    let path = format!("tasks/{}/pushNotificationConfigs", waiting_id.as_str().unwrap_or_default());
    let later = json!({ "url": webhook.url(), "token": "second-token",
        "authentication": { "scheme": "Bearer", "credentials": CREDENTIALS } });
    let (status, created) = json(a2a.rest(Method::POST, "tck", &path).json(&later)).await;
    assert_eq!(status, StatusCode::OK, "{created:#}");
    assert_eq!((&created["taskId"], created.get("token")), (&waiting_id, None), "{created:#}");
    let mut follow_up = message(&unique("tck-complete-task"), "dessert");
    follow_up["taskId"] = waiting_id.clone();
    assert_eq!(state(&a2a.send("tck", follow_up).await), "TASK_STATE_COMPLETED");
    let received = notifications(&mut webhook, &waiting_id, "second-token").await;
    assert_eq!(described(&received), ["status WORKING", "status COMPLETED"]);

    let created_id = created["id"].clone();
    let deleted =
        a2a.call("tck", "DeleteTaskPushNotificationConfig", json!({ "taskId": waiting_id, "id": created_id }));
    assert_eq!(deleted.await, json!({}));
    let listed = a2a.call("tck", "ListTaskPushNotificationConfigs", json!({ "taskId": waiting_id })).await;
    assert_eq!(listed["configs"], json!([]), "{listed:#}");
    webhook.assert_quiet(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allow_private_a_loopback_push_url_is_refused_and_nothing_is_created() {
    let mut webhook = Webhook::start().await;
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let task = a2a.send("tck", message(&unique("tck-input-required"), "waiting")).await;
    let id = task["id"].clone();

    let config = json!({ "taskId": id, "url": webhook.url(), "token": TOKEN });
    let error = a2a.call_error("tck", "CreateTaskPushNotificationConfig", config).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    assert!(error["message"].as_str().unwrap_or_default().contains("loopback"), "{error:#}");
    let path = format!("tasks/{}/pushNotificationConfigs", id.as_str().unwrap_or_default());
    let (status, body) = json(a2a.rest(Method::POST, "tck", &path).json(&json!({ "url": webhook.url() }))).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMS");
    let listed = a2a.call("tck", "ListTaskPushNotificationConfigs", json!({ "taskId": id })).await;
    assert_eq!(listed["configs"], json!([]), "no config was created: {listed:#}");

    // Refused with a SendMessage too, and then no task is made.
    let before = a2a.task_count().await;
    let params = json!({
        "message": message(&unique("tck-complete-task"), "tell me later"),
        "configuration": { "taskPushNotificationConfig": { "url": webhook.url() } },
    });
    let error = a2a.call_error("tck", "SendMessage", params).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    webhook.assert_quiet(Duration::from_millis(300)).await;
    let listed = a2a.call("tck", "ListTasks", json!({})).await;
    assert_eq!(a2a.task_count().await, before, "a refused SendMessage leaves no task behind: {listed:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_configs_are_listed_in_pages() {
    let webhook = Webhook::start().await;
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().env("CHORUS_GATEWAY__PUSH__ALLOW_PRIVATE", "true").start().await;
    let a2a = A2a::new(&server);
    let waiting = a2a.send("tck", message(&unique("tck-input-required"), "hold on")).await;
    let id = waiting["id"].clone();
    for config_id in ["c3", "c1", "c2"] {
        let config = json!({ "taskId": id, "id": config_id, "url": webhook.url() });
        a2a.call("tck", "CreateTaskPushNotificationConfig", config).await;
    }

    let list = |page: Value| {
        let mut params = json!({ "taskId": id });
        params.as_object_mut().expect("an object").extend(page.as_object().cloned().unwrap_or_default());
        a2a.call("tck", "ListTaskPushNotificationConfigs", params)
    };
    let ids = |page: &Value| -> Vec<String> {
        let configs = page["configs"].as_array().cloned().unwrap_or_default();
        configs.iter().map(|config| config["id"].as_str().unwrap_or_default().to_owned()).collect()
    };
    let all = list(json!({})).await;
    assert_eq!((ids(&all), &all["nextPageToken"]), (vec!["c1".into(), "c2".into(), "c3".into()], &json!("")));
    let first = list(json!({ "pageSize": 2 })).await;
    assert_eq!((ids(&first), &first["nextPageToken"]), (vec!["c1".into(), "c2".into()], &json!("c2")));
    let second = list(json!({ "pageSize": 2, "pageToken": "c2" })).await;
    assert_eq!((ids(&second), &second["nextPageToken"]), (vec!["c3".to_owned()], &json!("")));

    let path = format!("tasks/{}/pushNotificationConfigs?pageSize=1&pageToken=c1", id.as_str().unwrap_or_default());
    let (status, rest) = json(a2a.rest(Method::GET, "tck", &path)).await;
    assert_eq!((status, ids(&rest), &rest["nextPageToken"]), (StatusCode::OK, vec!["c2".to_owned()], &json!("c2")));
    let error = a2a.call_error("tck", "ListTaskPushNotificationConfigs", json!({ "taskId": id, "pageSize": -1 })).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
}

/// Each task's notifications, described, once `tasks` tasks completed.
async fn per_task(webhook: &mut Webhook, tasks: usize) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut seen = std::collections::BTreeMap::<String, Vec<String>>::new();
    while seen.values().filter(|changes| changes.last().is_some_and(|last| last == "status COMPLETED")).count() < tasks
    {
        let body = webhook.next().await.body;
        let update = body.get("statusUpdate").or_else(|| body.get("artifactUpdate")).cloned().unwrap_or_default();
        let task_id = update["taskId"].as_str().unwrap_or_default().to_owned();
        seen.entry(task_id).or_default().push(describe(&body));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_sent_with_the_message_receives_every_change_from_the_first() {
    let mut webhook = Webhook::start().await;
    let sandbox = Sandbox::new();
    let server = push_server(&sandbox, &[]).await;
    let a2a = A2a::new(&server);

    // Each task is created complete, and so before its config is stored:
    // that change must reach the config too.
    let mut ids = Vec::new();
    for _ in 0..20 {
        let message = message(&unique("tck-complete-task"), "hi");
        let task = a2a.call("tck", "SendMessage", with_push(message, json!({ "url": webhook.url() }))).await;
        ids.push(task["task"]["id"].as_str().unwrap_or_default().to_owned());
    }
    let seen = per_task(&mut webhook, ids.len()).await;
    for id in &ids {
        assert_eq!(seen.get(id).cloned().unwrap_or_default(), ["status COMPLETED"], "task {id}");
    }
    webhook.assert_quiet(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_sent_with_a_message_that_continues_a_task_receives_that_turn() {
    let mut webhook = Webhook::start().await;
    let sandbox = Sandbox::new();
    let server = push_server(&sandbox, &[]).await;
    let a2a = A2a::new(&server);
    let waiting = a2a.send("tck", message(&unique("tck-input-required"), "and then?")).await;
    let id = waiting["id"].clone();

    let mut follow_up = message(&unique("tck-complete-task"), "dessert");
    follow_up["taskId"] = id.clone();
    let push = json!({ "url": webhook.url(), "id": "on-continue", "token": TOKEN,
        "authentication": { "scheme": "Bearer", "credentials": CREDENTIALS } });
    let task = a2a.call("tck", "SendMessage", with_push(follow_up, push)).await["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task:#}");

    let received = notifications(&mut webhook, &id, TOKEN).await;
    assert_eq!(described(&received), ["status WORKING", "status COMPLETED"]);
    let listed = a2a.call("tck", "ListTaskPushNotificationConfigs", json!({ "taskId": id })).await;
    assert_eq!(listed["configs"][0]["id"], "on-continue", "{listed:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_config_the_store_or_a_webhook_would_refuse_is_refused_before_the_task_is_made() {
    let mut webhook = Webhook::start().await;
    let sandbox = Sandbox::new();
    let server = push_server(&sandbox, &[]).await;
    let a2a = A2a::new(&server);

    let refused = [
        (json!({ "url": webhook.url(), "id": "x".repeat(201) }), "configuration.taskPushNotificationConfig.id"),
        (
            json!({ "url": webhook.url(), "token": "a\r\nX-Injected: 1" }),
            "configuration.taskPushNotificationConfig.token",
        ),
        (
            json!({ "url": webhook.url(), "authentication": { "scheme": "Bearer", "credentials": "a\nb" } }),
            "configuration.taskPushNotificationConfig.authentication",
        ),
        (json!({ "url": format!("{}/v\u{0}x", webhook.url()) }), "configuration.taskPushNotificationConfig.url"),
        (
            json!({ "url": webhook.url(), "authentication": { "scheme": "Bea\u{0}rer" } }),
            "configuration.taskPushNotificationConfig.authentication.scheme",
        ),
        // HTTP+JSON could not name it in a path to read or delete it.
        (json!({ "url": webhook.url(), "id": "a/b" }), "configuration.taskPushNotificationConfig.id"),
        // A TAB: a header may hold one, the task store refuses it.
        (json!({ "url": webhook.url(), "token": "a\tb" }), "configuration.taskPushNotificationConfig.token"),
        (
            json!({ "url": webhook.url(), "authentication": { "scheme": "Bearer", "credentials": "x\ty" } }),
            "configuration.taskPushNotificationConfig.authentication.credentials",
        ),
    ];
    for (config, field) in refused {
        let before = a2a.task_count().await;
        let error =
            a2a.call_error("tck", "SendMessage", with_push(message(&unique("tck-complete-task"), "hi"), config)).await;
        assert_rpc_error(&error, -32602, "INVALID_PARAMS");
        assert!(error["message"].as_str().unwrap_or_default().contains(field), "{field}: {error:#}");
        assert_eq!(a2a.task_count().await, before, "a refused SendMessage leaves no task behind ({field})");
    }
    webhook.assert_quiet(Duration::from_millis(300)).await;

    // Registered on its own, a config with a token that cannot be sent is
    // refused naming the field, and one without a task names taskId.
    let waiting = a2a.send("tck", message(&unique("tck-input-required"), "waiting")).await;
    let config = json!({ "taskId": waiting["id"], "url": webhook.url(), "token": "a\nb" });
    let error = a2a.call_error("tck", "CreateTaskPushNotificationConfig", config).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    assert!(error["message"].as_str().unwrap_or_default().starts_with("token"), "{error:#}");
    let error = a2a.call_error("tck", "CreateTaskPushNotificationConfig", json!({ "url": webhook.url() })).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    assert_eq!(error["message"], "taskId is required", "{error:#}");

    // A scheme is case-insensitive: `Http://` is an http URL, and is served.
    let shouting = webhook.url().replacen("http", "Http", 1);
    let params = with_push(message(&unique("tck-complete-task"), "hi"), json!({ "url": shouting }));
    let task = a2a.call("tck", "SendMessage", params).await["task"].clone();
    let seen = per_task(&mut webhook, 1).await;
    assert_eq!(seen.keys().collect::<Vec<_>>(), [task["id"].as_str().unwrap_or_default()]);
}

/// A webhook that accepts connections and never answers.
async fn silent_webhook() -> (String, tokio::task::JoinHandle<()>) {
    let (address, held) = chorus_tests::a2a::silent_address().await;
    (format!("http://{address}/hook"), held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_webhook_does_not_delay_the_other_webhooks_of_the_task() {
    let mut webhook = Webhook::start().await;
    let (silent, _held) = silent_webhook().await;
    let sandbox = Sandbox::new();
    let env = [("CHORUS_GATEWAY__PUSH__TIMEOUT_MS", "5000"), ("CHORUS_GATEWAY__PUSH__MAX_ATTEMPTS", "1")];
    let server = push_server(&sandbox, &env).await;
    let a2a = A2a::new(&server);
    let waiting = a2a.send("tck", message(&unique("tck-input-required"), "waiting")).await;
    let id = waiting["id"].clone();
    // Listed (and, before each config had its own follower, served) first.
    for (config_id, url) in [("a-silent", silent), ("b-listening", webhook.url())] {
        a2a.call("tck", "CreateTaskPushNotificationConfig", json!({ "taskId": id, "id": config_id, "url": url })).await;
    }

    let mut follow_up = message(&unique("tck-complete-task"), "go on");
    follow_up["taskId"] = id.clone();
    let sent = std::time::Instant::now();
    assert_eq!(state(&a2a.send("tck", follow_up).await), "TASK_STATE_COMPLETED");
    let seen = per_task(&mut webhook, 1).await;
    assert_eq!(seen.get(id.as_str().unwrap_or_default()).map(Vec::len), Some(2), "{seen:#?}");
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(3), "the listening webhook waited {took:?} for the silent one");
}
