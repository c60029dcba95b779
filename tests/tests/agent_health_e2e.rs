//! `chorus agent --listen`: its `/healthz` follows its claim stream, and its
//! `/metrics` counts the tasks it did.

use std::time::Duration;

use chorus_tests::{
    DEADLINE, Sandbox,
    a2a::A2a,
    tasks::{TaskWatch, create_task},
};
use tokio::time::Instant;

const NS: &str = "e2e";

/// A port nothing listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// The status and body of `GET path`, once something answers there.
async fn get(agent: &A2a, path: &str) -> (u16, String) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        match agent.get(path).send().await {
            Ok(response) => return (response.status().as_u16(), response.text().await.unwrap_or_default()),
            Err(error) => assert!(Instant::now() < deadline, "nothing answers at {path}: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `GET path` answers `status`; returns its body.
async fn until_status(agent: &A2a, path: &str, status: u16) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (answered, body) = get(agent, path).await;
        if answered == status {
            return body;
        }
        assert!(Instant::now() < deadline, "{path} still answers {answered} ({body}), not {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of `series` on the metrics page `page`.
fn sample(page: &str, series: &str) -> f64 {
    let line = page.lines().find(|line| line.rsplit_once(' ').is_some_and(|(name, _)| name == series));
    let line = line.unwrap_or_else(|| panic!("no {series} in:\n{page}"));
    line.rsplit_once(' ').and_then(|(_, value)| value.parse().ok()).expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_serves_its_health_and_counts_its_tasks() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let listen = format!("127.0.0.1:{}", free_port());
    let _agent = sandbox.builtin_agent_with("echo", server.url(), NS, &["--listen", &listen]);
    let agent = A2a::at(&format!("http://{listen}"));
    until_status(&agent, "/healthz", 200).await;

    let mut client = server.task_store().await;
    let task = create_task(&mut client, NS, "echo", "hello").await;
    TaskWatch::open(&mut client, NS, &task.id, "").await.until_end().await;
    // The task ends as its worker reports it; the worker lets go of it just after.
    let deadline = Instant::now() + DEADLINE;
    let page = loop {
        let page = until_status(&agent, "/metrics", 200).await;
        if sample(&page, "chorus_worker_tasks_in_flight") == 0.0 {
            break page;
        }
        assert!(Instant::now() < deadline, "the task stays in flight:\n{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(sample(&page, "chorus_worker_tasks_total{outcome=\"completed\"}"), 1.0);
    assert_eq!(sample(&page, "chorus_worker_tasks_total{outcome=\"failed\"}"), 0.0);
    assert_eq!(sample(&page, "chorus_worker_claim_streams"), 1.0);

    // Its task store gone, the agent cannot work: not ready, and says why.
    assert!(server.stop().await.success());
    let why = until_status(&agent, "/healthz", 503).await;
    assert!(why.contains("0 of the agent's 1 claim streams open"), "{why}");
    assert_eq!(sample(&get(&agent, "/metrics").await.1, "chorus_worker_claim_streams"), 0.0);
}
