//! Push notification configs an A2A client cannot use, refused when made:
//! a URL that is not public HTTP, or a config no notification could be sent
//! with. Nothing is created, and the server keeps serving.

use chorus_tests::{
    Sandbox,
    a2a::{A2a, assert_rest_error, assert_rpc_error, json, message, unique},
};
use reqwest::{Method, StatusCode};
use serde_json::json;

/// After a refused request: the default namespace still holds `tasks` tasks.
async fn still_serving(a2a: &A2a, tasks: u64) {
    assert_eq!(a2a.task_count().await, tasks, "a refused request created no task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_urls_that_are_not_public_http_are_refused() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let task = a2a.send("tck", message(&unique("tck-input-required"), "notify me")).await;
    let id = task["id"].as_str().expect("a task id").to_owned();

    let urls = [
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/hook",
        "http://[::1]:8080/hook",
        "ftp://x/hook",
        "not a url",
        "http://user:password@example.com/hook",
    ];
    for url in urls {
        let error =
            a2a.call_error("tck", "CreateTaskPushNotificationConfig", json!({ "taskId": id, "url": url })).await;
        assert_rpc_error(&error, -32602, "INVALID_PARAMS");
        let path = format!("tasks/{id}/pushNotificationConfigs");
        let (status, body) = json(a2a.rest(Method::POST, "tck", &path).json(&json!({ "url": url }))).await;
        assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMS");
    }
    let listed = a2a.call("tck", "ListTaskPushNotificationConfigs", json!({ "taskId": id })).await;
    assert_eq!(listed["configs"], json!([]), "no config was created: {listed:#}");
    still_serving(&a2a, 1).await;
}

/// A config no notification could be sent with is refused when made, not
/// accepted and then failed at every change: a URL no client builds, a token
/// or credentials no receiver takes in a header, a scheme that is not one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_configs_that_could_never_be_sent_are_refused() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let task = a2a.send("tck", message(&unique("tck-input-required"), "notify me")).await;
    let id = task["id"].as_str().expect("a task id").to_owned();
    let url = "https://example.com/hook";
    let long = "a".repeat(5000);
    let configs = [
        (json!({ "url": format!("{url}/{long}") }), "url: must be at most 2048 bytes"),
        (json!({ "url": url, "token": long }), "token: must be at most 4096 bytes"),
        (
            json!({ "url": url, "authentication": { "scheme": "Bearer", "credentials": long } }),
            "authentication.credentials: must be at most 4096 bytes",
        ),
        (json!({ "url": url, "authentication": { "scheme": "", "credentials": "s3cret" } }), "authentication.scheme"),
        (
            json!({ "url": url, "authentication": { "scheme": "Bear er", "credentials": "s3cret" } }),
            "authentication.scheme",
        ),
    ];
    for (config, said) in configs {
        let mut params = config.clone();
        params["taskId"] = json!(id);
        let error = a2a.call_error("tck", "CreateTaskPushNotificationConfig", params).await;
        assert_rpc_error(&error, -32602, "INVALID_PARAMS");
        assert!(error["message"].as_str().is_some_and(|message| message.contains(said)), "{said}: {error:#}");
    }
    let listed = a2a.call("tck", "ListTaskPushNotificationConfigs", json!({ "taskId": id })).await;
    assert_eq!(listed["configs"], json!([]), "no config was created: {listed:#}");
    still_serving(&a2a, 1).await;
}
