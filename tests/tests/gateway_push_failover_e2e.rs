//! Push notifications across gateway restarts and replicas: a gateway killed
//! or stopped has its configs resumed, by itself under its name or by
//! another replica, and no notification is delivered twice.

use std::{collections::BTreeMap, time::Duration};

use chorus_tests::{
    Sandbox,
    a2a::{A2a, Webhook, describe, message, state, unique},
    push::{push_server, with_push},
};
use serde_json::{Value, json};

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

/// Reads notifications until every token in `tokens` saw its task complete;
/// each token's, described in order.
async fn per_token(webhook: &mut Webhook, tokens: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut seen = BTreeMap::<String, Vec<String>>::new();
    let completed = |seen: &BTreeMap<String, Vec<String>>, token: &str| {
        seen.get(token).and_then(|changes| changes.last()).is_some_and(|last| last == "status COMPLETED")
    };
    while !tokens.iter().all(|token| completed(&seen, token)) {
        let notification = webhook.next().await;
        let token = notification.header("x-a2a-notification-token").to_owned();
        seen.entry(token).or_default().push(describe(&notification.body));
    }
    seen
}
