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

/// A `tck` server that may deliver to loopback, with `env` on top.
async fn push_server(sandbox: &Sandbox, env: &[(&str, &str)]) -> chorus_tests::Server {
    let mut builder = sandbox.dev().no_agents().env("CHORUS_GATEWAY__PUSH__ALLOW_PRIVATE", "true");
    for (key, value) in env {
        builder = builder.env(key, value);
    }
    builder.start().await
}

/// `SendMessage` params for a message with `config` as its push config.
fn with_push(message: Value, config: Value) -> Value {
    json!({ "message": message, "configuration": { "taskPushNotificationConfig": config } })
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

/// Reads notifications until every token in `tokens` saw its task complete;
/// each token's, described in order.
async fn per_token(webhook: &mut Webhook, tokens: &[&str]) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut seen = std::collections::BTreeMap::<String, Vec<String>>::new();
    let completed = |seen: &std::collections::BTreeMap<String, Vec<String>>, token: &str| {
        seen.get(token).and_then(|changes| changes.last()).is_some_and(|last| last == "status COMPLETED")
    };
    while !tokens.iter().all(|token| completed(&seen, token)) {
        let notification = webhook.next().await;
        let token = notification.header("x-a2a-notification-token").to_owned();
        seen.entry(token).or_default().push(describe(&notification.body));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_resumes_the_push_deliveries_of_waiting_tasks() {
    // Killed and restarted on another port, the gateway has another name: it
    // takes its configs over once the leases of its previous run lapse.
    resumes_after_a_restart(&[], Restart::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_and_started_under_its_name_resumes_the_push_deliveries_of_waiting_tasks() {
    // Under one name, as a gateway restarted on its address is by default:
    // it hands back as it starts the leases of its previous run, and claims
    // them like any other (it used to renew them, and so never claimed them).
    resumes_after_a_restart(&[("CHORUS_GATEWAY__PUSH__FOLLOWER_ID", "gateway-1")], Restart::Stop).await;
}

/// How a test ends the gateway's first run.
#[derive(Clone, Copy)]
enum Restart {
    /// `SIGKILL`: it hands nothing back.
    Kill,
    /// `SIGTERM`: it hands its leases back as it stops.
    Stop,
}

/// A task waiting for input has two push configs; the gateway restarts
/// (`env` on top of the defaults for both runs); the task's next turn
/// reaches both webhooks.
async fn resumes_after_a_restart(env: &[(&str, &str)], restart: Restart) {
    let mut webhook = Webhook::start().await;
    let sandbox = Sandbox::new();
    let env: Vec<(&str, &str)> =
        [("CHORUS_GATEWAY__PUSH__LEASE_MS", "1000")].into_iter().chain(env.iter().copied()).collect();
    let server = push_server(&sandbox, &env).await;
    let a2a = A2a::new(&server);

    // One config sent with the message that makes the task, one added once
    // it waits for input.
    let sent = json!({ "url": webhook.url(), "id": "sent", "token": "sent-token" });
    let params = with_push(message(&unique("tck-input-required"), "and then?"), sent);
    let task = a2a.call("tck", "SendMessage", params).await["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_INPUT_REQUIRED", "{task:#}");
    let id = task["id"].clone();
    let mut before = Vec::new();
    while before.last().is_none_or(|last| last != "status INPUT_REQUIRED") {
        before.push(describe(&webhook.next().await.body));
    }
    let added = json!({ "taskId": id, "url": webhook.url(), "id": "added", "token": "added-token" });
    a2a.call("tck", "CreateTaskPushNotificationConfig", added).await;
    webhook.assert_quiet(Duration::from_millis(300)).await;

    match restart {
        Restart::Kill => drop(server.kill().await),
        Restart::Stop => drop(server.stop().await),
    }
    let server = push_server(&sandbox, &env).await;
    let a2a = A2a::new(&server);
    let mut follow_up = message(&unique("tck-complete-task"), "dessert");
    follow_up["taskId"] = id.clone();
    let task = a2a.call("tck", "SendMessage", json!({ "message": follow_up })).await["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task:#}");

    let mut seen = per_token(&mut webhook, &["sent-token", "added-token"]).await;
    let after_restart = ["status WORKING", "status COMPLETED"];
    assert_eq!(seen["added-token"], after_restart, "the config added while the task waited");
    let sent = seen.get_mut("sent-token").expect("the config sent with the message");
    // At least once: a change delivered just before the gateway died, but
    // not yet recorded as delivered, comes again.
    if sent.first().is_some_and(|first| first == "status INPUT_REQUIRED") {
        sent.remove(0);
    }
    assert_eq!(*sent, after_restart, "the config sent with the message, which got {before:?} before the restart");
    webhook.assert_quiet(Duration::from_millis(300)).await;
}

/// Two or more `chorus serve gateway` processes on one task store, which may
/// deliver to loopback.
struct Replicas {
    sandbox: Sandbox,
    database: String,
    store: chorus_tests::Server,
}

impl Replicas {
    async fn start() -> Self {
        let sandbox = Sandbox::new();
        let database = format!("sqlite://{}?mode=rwc", sandbox.path().join("tasks.db").display());
        let store = sandbox.serve_taskstore(&database).start().await;
        Self { sandbox, database, store }
    }

    /// A gateway whose push config leases last `lease_ms`.
    async fn gateway(&self, name: &str, lease_ms: u64) -> chorus_tests::Server {
        self.sandbox
            .serve("gateway", &self.database)
            .name(name)
            .env("CHORUS_GATEWAY__TASKSTORE_URL", self.store.url())
            .env("CHORUS_GATEWAY__PUSH__ALLOW_PRIVATE", "true")
            .env("CHORUS_GATEWAY__PUSH__LEASE_MS", lease_ms.to_string())
            .start()
            .await
    }
}

/// Sends the task another turn, by `message_id`'s scenario, and waits for
/// its answer.
async fn turn(a2a: &A2a, id: &Value, scenario: &str, expected: &str) {
    let mut follow_up = message(&unique(scenario), "go on");
    follow_up["taskId"] = id.clone();
    assert_eq!(state(&a2a.send("tck", follow_up).await), expected);
}

/// The next `count` notifications, described.
async fn next(webhook: &mut Webhook, count: usize) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..count {
        seen.push(describe(&webhook.next().await.body));
    }
    seen
}

const LEASE_MS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_dies_has_its_push_configs_taken_over_by_another_and_none_is_delivered_twice() {
    let mut webhook = Webhook::start().await;
    let replicas = Replicas::start().await;
    let a = replicas.gateway("gateway A", LEASE_MS).await;
    let on_a = A2a::new(&a);
    let config = json!({ "url": webhook.url(), "id": "hook" });
    let params = with_push(message(&unique("tck-input-required"), "and then?"), config);
    let task = on_a.call("tck", "SendMessage", params).await["task"].clone();
    let id = task["id"].clone();
    assert_eq!(next(&mut webhook, 1).await, ["status INPUT_REQUIRED"]);

    // B starts beside A, and lives through several of its leases: A still
    // follows the config, and B does not follow it too.
    let b = replicas.gateway("gateway B", LEASE_MS).await;
    let on_b = A2a::new(&b);
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS)).await;
    turn(&on_b, &id, "tck-input-required", "TASK_STATE_INPUT_REQUIRED").await;
    assert_eq!(next(&mut webhook, 2).await, ["status WORKING", "status INPUT_REQUIRED"]);
    webhook.assert_quiet(Duration::from_millis(2 * LEASE_MS)).await;

    a.kill().await;
    let killed = std::time::Instant::now();
    turn(&on_b, &id, "tck-complete-task", "TASK_STATE_COMPLETED").await;
    assert_eq!(next(&mut webhook, 2).await, ["status WORKING", "status COMPLETED"], "the rest, once each");
    let took = killed.elapsed();
    assert!(took < Duration::from_millis(4 * LEASE_MS), "B took {took:?} to take the config over");
    webhook.assert_quiet(Duration::from_millis(LEASE_MS)).await;
    b.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_stops_hands_its_push_configs_to_another_at_once() {
    let mut webhook = Webhook::start().await;
    let replicas = Replicas::start().await;
    // A's leases would last a minute: B gets the config only because A
    // hands it back as it stops.
    let a = replicas.gateway("gateway A", 60_000).await;
    let on_a = A2a::new(&a);
    let waiting = on_a.send("tck", message(&unique("tck-input-required"), "and then?")).await;
    let id = waiting["id"].clone();
    on_a.call("tck", "CreateTaskPushNotificationConfig", json!({ "taskId": id, "url": webhook.url() })).await;
    let b = replicas.gateway("gateway B", LEASE_MS).await;
    let on_b = A2a::new(&b);

    assert!(a.stop().await.success(), "A stops cleanly");
    let stopped = std::time::Instant::now();
    turn(&on_b, &id, "tck-complete-task", "TASK_STATE_COMPLETED").await;
    assert_eq!(next(&mut webhook, 2).await, ["status WORKING", "status COMPLETED"]);
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(10), "B took {took:?}, as long as A's lease, to take the config over");
    webhook.assert_quiet(Duration::from_millis(LEASE_MS)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_replaced_through_another_gateway_is_delivered_by_that_gateway_alone() {
    let mut webhook = Webhook::start().await;
    let replicas = Replicas::start().await;
    let (a, b) = (replicas.gateway("gateway A", LEASE_MS).await, replicas.gateway("gateway B", LEASE_MS).await);
    let (on_a, on_b) = (A2a::new(&a), A2a::new(&b));
    let waiting = on_a.send("tck", message(&unique("tck-input-required"), "and then?")).await;
    let id = waiting["id"].clone();
    let config = |token: &str| json!({ "taskId": id, "id": "hook", "url": webhook.url(), "token": token });
    on_a.call("tck", "CreateTaskPushNotificationConfig", config("first")).await;
    on_b.call("tck", "CreateTaskPushNotificationConfig", config("second")).await;

    // A learns at its next renewal that B follows the config now.
    tokio::time::sleep(Duration::from_millis(LEASE_MS)).await;
    turn(&on_a, &id, "tck-complete-task", "TASK_STATE_COMPLETED").await;
    let seen = per_token(&mut webhook, &["second"]).await;
    assert_eq!(seen["second"], ["status WORKING", "status COMPLETED"], "{seen:#?}");
    webhook.assert_quiet(Duration::from_millis(LEASE_MS)).await;
}
