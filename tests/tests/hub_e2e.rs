//! The hub end to end with separate processes — the TEA coordinator–worker
//! example: the real `chorus dev`, three `test-agent` worker processes and
//! the test as the coordinator, all over real gRPC. The coordinator finds
//! the workers by capability, hands out jobs by topic, direct message,
//! delegation and broadcast, and gathers the answers; then one worker is
//! killed with SIGKILL while jobs flow to it, goes stale while more queue
//! for it, and once restarted (same consumer id) gets every one of them.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use chorus_proto::hub::{
    AckRequest, AgentStatus, BroadcastRequest, Content, DelegateRequest, DiscoverRequest, Message, PublishRequest,
    ReceiveRequest, ReceiveResponse, RegisterAgentRequest, SendDirectRequest, SendResponse, SubscribeRequest,
    TimeoutPolicy, hub_client::HubClient, message::Kind,
};
use chorus_tests::{
    DEADLINE, ReadyProcess, Sandbox, TestAgentBuilder,
    agent::{DONE, Handled, answer, read_log},
    test_agent,
};
use futures_util::future::join_all;
use tokio::time::Instant;
use tonic::transport::Channel;

type Client = HubClient<Channel>;
/// (worker, job id): a job handed to a worker, or its answer.
type Pair = (String, String);

const NS: &str = "tea";
const COORDINATOR: &str = "coordinator";
const WORKERS: [&str; 3] = ["worker-1", "worker-2", "worker-3"];
/// What the workers register as able to do, and the coordinator looks for.
const CAPABILITY: &str = "review";
const TOPIC: &str = "jobs";
/// The type of every job the coordinator hands out.
const JOB: &str = "job";
/// The hub's stale threshold (`CHORUS_HUB__STALE_AFTER_MS`), and how often
/// the workers heartbeat.
const STALE_AFTER: Duration = Duration::from_millis(1500);
const HEARTBEAT: Duration = Duration::from_millis(250);
const TOPIC_JOBS: usize = 5;
const DIRECT_JOBS: usize = 6;
/// The worker killed and restarted.
const VICTIM: usize = 1;
/// Jobs sent while the victim crashes, alternately direct to it and
/// published; it is killed once the first [`KILL_AFTER`] are sent.
const CRASH_JOBS: usize = 30;
const KILL_AFTER: usize = 10;
/// How long the restarted victim may take to answer what was queued for
/// it: well under the hub's 30 s lease, so only a resend at the restart
/// (not a lease running out) can bring back what the dead process held.
const RECOVERY_DEADLINE: Duration = Duration::from_secs(15);
/// How long each Receive of the answers waits.
const RECEIVE_WAIT: Duration = Duration::from_millis(500);
/// How often Discover is asked while waiting for a worker to go stale.
const POLL: Duration = Duration::from_millis(100);

fn duration(duration: Duration) -> Option<prost_types::Duration> {
    Some(prost_types::Duration::try_from(duration).expect("a duration in range"))
}

/// A job's content: its id is also its payload and correlation id.
fn job(id: &str) -> Option<Content> {
    Some(Content { r#type: JOB.to_owned(), payload: id.as_bytes().to_vec(), content_type: "text/plain".to_owned() })
}

fn owned(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|&id| id.to_owned()).collect()
}

/// What each worker must have logged: the kind and job id of every message
/// handed to it.
#[derive(Debug, Default)]
struct Handed(BTreeMap<String, Vec<(Kind, String)>>);

impl Handed {
    fn add(&mut self, worker: &str, kind: Kind, id: &str) {
        self.0.entry(worker.to_owned()).or_default().push((kind, id.to_owned()));
    }

    /// The `job.done` answers due: one per job but the delegated requests
    /// (answered by Reply) and the broadcasts (gathered on their own).
    fn answers(&self) -> BTreeSet<Pair> {
        let jobs = self.0.iter().flat_map(|(worker, jobs)| jobs.iter().map(move |job| (worker, job)));
        let answered = jobs.filter(|(_, (kind, _))| matches!(kind, Kind::Topic | Kind::Direct));
        answered.map(|(worker, (_, id))| (worker.clone(), id.clone())).collect()
    }

    fn extend(&mut self, other: Self) {
        for (worker, jobs) in other.0 {
            self.0.entry(worker).or_default().extend(jobs);
        }
    }

    /// What `worker` was handed, sorted.
    fn of(&self, worker: &str) -> Vec<(Kind, String)> {
        let mut jobs = self.0.get(worker).cloned().unwrap_or_default();
        jobs.sort();
        jobs
    }
}

/// The lines `builder`'s agent logged from line `from` on.
fn log_since(builder: &TestAgentBuilder, from: usize) -> Vec<Handled> {
    let mut log = read_log(&builder.log_path());
    log.split_off(from.min(log.len()))
}

/// The kind and job id of each line, sorted.
fn jobs(lines: &[Handled]) -> Vec<(Kind, String)> {
    let mut jobs: Vec<(Kind, String)> = lines.iter().map(|handled| (handled.kind, handled.job.clone())).collect();
    jobs.sort();
    jobs
}

/// The lines repeating a message logged on an earlier one.
fn repeats(lines: &[Handled]) -> Vec<&Handled> {
    let mut seen = BTreeSet::new();
    lines.iter().filter(|handled| !seen.insert(handled.id.as_str())).collect()
}

async fn register_coordinator(client: &mut Client) {
    let request = RegisterAgentRequest {
        namespace: NS.to_owned(),
        agent_id: COORDINATOR.to_owned(),
        agent_type: "coordinator".to_owned(),
        capabilities: owned(&["plan"]),
        ..RegisterAgentRequest::default()
    };
    client.register_agent(request).await.expect("register the coordinator");
    // Subscribed too, to show that a publisher never gets its own publish.
    let request =
        SubscribeRequest { namespace: NS.to_owned(), agent_id: COORDINATOR.to_owned(), topic: TOPIC.to_owned() };
    client.subscribe(request).await.expect("subscribe the coordinator");
}

/// Publishes job `id` on the topic: queued for each worker.
async fn publish(client: &mut Client, handed: &mut Handed, id: &str) {
    let request = PublishRequest {
        namespace: NS.to_owned(),
        topic: TOPIC.to_owned(),
        sender: COORDINATOR.to_owned(),
        content: job(id),
        correlation_id: id.to_owned(),
        ..PublishRequest::default()
    };
    let sent = client.publish(request).await.unwrap_or_else(|status| panic!("publish {id}: {status:?}")).into_inner();
    assert_eq!(sent.recipients, 3, "{id} is queued for every worker, never for its publisher: {sent:?}");
    for worker in WORKERS {
        handed.add(worker, Kind::Topic, id);
    }
}

/// Sends job `id` to `worker`; with `confirm`, waits that long for its ack.
async fn send_direct(
    client: &mut Client,
    handed: &mut Handed,
    worker: &str,
    id: &str,
    confirm: Option<Duration>,
) -> SendResponse {
    let request = SendDirectRequest {
        namespace: NS.to_owned(),
        sender: COORDINATOR.to_owned(),
        recipient: worker.to_owned(),
        content: job(id),
        correlation_id: id.to_owned(),
        confirm_timeout: confirm.and_then(duration),
        ..SendDirectRequest::default()
    };
    let sent = client.send_direct(request).await.unwrap_or_else(|status| panic!("send {id}: {status:?}")).into_inner();
    assert_eq!(sent.recipients, 1, "{sent:?}");
    handed.add(worker, Kind::Direct, id);
    sent
}

async fn receive(client: &mut Client, request: ReceiveRequest) -> ReceiveResponse {
    client.receive(request).await.expect("receive").into_inner()
}

async fn ack(client: &mut Client, messages: &[Message]) {
    let message_ids = messages.iter().map(|message| message.id.clone()).collect();
    let request = AckRequest { namespace: NS.to_owned(), agent_id: COORDINATOR.to_owned(), message_ids };
    let acked = client.ack(request).await.expect("ack").into_inner();
    assert!(acked.unknown_ids.is_empty(), "the coordinator acks only what it holds: {acked:?}");
}

/// Asserts `message` is a worker's answer to a job: a direct `job.done`
/// with the job's id as correlation id and reversed as payload.
#[track_caller]
fn answered(message: &Message) -> Pair {
    let content = message.content.as_ref().expect("a message has content");
    assert_eq!((message.kind(), content.r#type.as_str()), (Kind::Direct, DONE), "{message:?}");
    assert_eq!(content.payload, answer(message.correlation_id.as_bytes()), "the job's id reversed: {message:?}");
    (message.sender.clone(), message.correlation_id.clone())
}

/// Receives (and acks) the workers' answers until each of `expected` came,
/// within `within`; fails on any other answer, on an answer that comes twice
/// (the workers answer under an idempotency key) and when a worker process
/// exits.
async fn gather(client: &mut Client, expected: &BTreeSet<Pair>, within: Duration, workers: &mut [ReadyProcess]) {
    let deadline = Instant::now() + within;
    let mut got = BTreeSet::new();
    while got != *expected {
        let request = ReceiveRequest {
            namespace: NS.to_owned(),
            agent_id: COORDINATOR.to_owned(),
            types: owned(&[DONE]),
            timeout: duration(RECEIVE_WAIT),
            ..ReceiveRequest::default()
        };
        let received = receive(client, request).await;
        for message in &received.messages {
            let answer = answered(message);
            assert!(expected.contains(&answer), "an answer nobody waits for: {message:?}");
            assert!(got.insert(answer), "an answer came twice: {message:?}");
        }
        if !received.messages.is_empty() {
            ack(client, &received.messages).await;
        }
        for worker in workers.iter_mut() {
            worker.assert_running().await;
        }
        if got != *expected && Instant::now() >= deadline {
            let missing: Vec<&Pair> = expected.difference(&got).collect();
            panic!("no answer within {within:?} for these (worker, job) pairs: {missing:?}");
        }
    }
}

/// Discover, as (id, status) by id.
async fn discover(client: &mut Client, request: DiscoverRequest) -> Vec<(String, AgentStatus)> {
    let agents = client.discover(request).await.expect("discover").into_inner().agents;
    agents.iter().map(|agent| (agent.id.clone(), agent.status())).collect()
}

/// Discover by capability, as the coordinator finds its workers.
async fn reviewers(client: &mut Client) -> Vec<(String, AgentStatus)> {
    let request =
        DiscoverRequest { namespace: NS.to_owned(), capabilities: owned(&[CAPABILITY]), ..DiscoverRequest::default() };
    discover(client, request).await
}

/// The three workers, all active except `stale`.
fn workers_with_stale(stale: Option<&str>) -> Vec<(String, AgentStatus)> {
    let status = |worker: &str| if Some(worker) == stale { AgentStatus::Stale } else { AgentStatus::Active };
    WORKERS.iter().map(|&worker| (worker.to_owned(), status(worker))).collect()
}

/// Waits until Discover reports `worker` stale (and only it); returns how
/// long after `silent_since` that was.
async fn wait_until_stale(client: &mut Client, worker: &str, silent_since: Instant) -> Duration {
    let started = Instant::now();
    let expected = workers_with_stale(Some(worker));
    loop {
        let found = reviewers(client).await;
        if found == expected {
            break;
        }
        assert_eq!(found, workers_with_stale(None), "while {worker} is not stale yet, every worker is active");
        assert!(started.elapsed() < DEADLINE, "{worker} was not reported stale within {DEADLINE:?}: {found:?}");
        tokio::time::sleep(POLL).await;
    }
    // (The coordinator, which never heartbeats, is stale too by now.)
    let request = DiscoverRequest {
        namespace: NS.to_owned(),
        capabilities: owned(&[CAPABILITY]),
        status: AgentStatus::Stale.into(),
        ..DiscoverRequest::default()
    };
    assert_eq!(discover(client, request).await, [(worker.to_owned(), AgentStatus::Stale)], "only {worker} is stale");
    silent_since.elapsed()
}

/// Delegates a review to each worker at once; checks that each reply is
/// that worker's answer to that request.
async fn delegate_to_each(client: &Client, handed: &mut Handed) {
    let delegations = WORKERS.map(|worker| {
        let mut client = client.clone();
        let draft = format!("draft for {worker}");
        async move {
            let request = DelegateRequest {
                namespace: NS.to_owned(),
                sender: COORDINATOR.to_owned(),
                recipient: worker.to_owned(),
                content: Some(Content {
                    r#type: "review.request".to_owned(),
                    payload: draft.clone().into_bytes(),
                    content_type: "text/plain".to_owned(),
                }),
                timeout: duration(DEADLINE),
                on_timeout: TimeoutPolicy::Raise.into(),
                ..DelegateRequest::default()
            };
            let delegated = client.delegate(request).await.expect("delegate").into_inner();
            let reply = delegated.reply.as_ref().expect("a reply");
            assert_eq!((reply.kind(), reply.sender.as_str()), (Kind::Reply, worker), "{delegated:?}");
            assert_eq!(reply.correlation_id, delegated.correlation_id, "the reply to this request: {delegated:?}");
            let content = reply.content.as_ref().expect("a reply has content");
            assert_eq!(content.payload, answer(draft.as_bytes()), "{delegated:?}");
            assert_eq!((delegated.attempts, delegated.timed_out), (1, false), "{delegated:?}");
            (worker, delegated.correlation_id)
        }
    });
    let correlations = join_all(delegations).await;
    let distinct: BTreeSet<&String> = correlations.iter().map(|(_, correlation)| correlation).collect();
    assert_eq!(distinct.len(), WORKERS.len(), "a fresh correlation id per Delegate: {correlations:?}");
    for (worker, correlation) in &correlations {
        handed.add(worker, Kind::Request, correlation);
    }
}

/// Broadcasts job `id` to the workers (by agent type) and gathers their
/// three answers with one `require_all` Receive.
async fn broadcast_and_gather_all(client: &mut Client, handed: &mut Handed, id: &str) {
    let require_all = |timeout: Duration| ReceiveRequest {
        namespace: NS.to_owned(),
        agent_id: COORDINATOR.to_owned(),
        senders: owned(&WORKERS),
        types: owned(&[DONE]),
        require_all: true,
        timeout: duration(timeout),
        ..ReceiveRequest::default()
    };
    // Before the broadcast: at once, nothing taken, every worker missing.
    let early = receive(client, require_all(Duration::ZERO)).await;
    assert!(early.timed_out && early.messages.is_empty(), "{early:?}");
    let mut missing = early.missing_senders.clone();
    missing.sort();
    assert_eq!(missing, WORKERS, "{early:?}");

    let request = BroadcastRequest {
        namespace: NS.to_owned(),
        sender: COORDINATOR.to_owned(),
        agent_type: "worker".to_owned(),
        content: job(id),
        correlation_id: id.to_owned(),
        ..BroadcastRequest::default()
    };
    let sent = client.broadcast(request).await.expect("broadcast").into_inner();
    assert_eq!(sent.recipients, 3, "every worker, not the coordinator: {sent:?}");
    for worker in WORKERS {
        handed.add(worker, Kind::Broadcast, id);
    }

    let all = receive(client, require_all(DEADLINE)).await;
    assert!(!all.timed_out, "{all:?}");
    let answers: BTreeSet<Pair> = all.messages.iter().map(answered).collect();
    let expected: BTreeSet<Pair> = WORKERS.iter().map(|&worker| (worker.to_owned(), id.to_owned())).collect();
    assert_eq!(answers, expected, "one answer from each worker: {all:?}");
    ack(client, &all.messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_and_three_worker_processes_one_killed_and_restarted() {
    let started = Instant::now();
    let sandbox = Sandbox::new();
    let stale_after = STALE_AFTER.as_millis().to_string();
    let server = sandbox.dev().no_agents().env("CHORUS_HUB__STALE_AFTER_MS", stale_after).start().await;
    let mut client = server.hub().await;
    register_coordinator(&mut client).await;
    let builders = WORKERS.map(|worker| {
        test_agent!(sandbox, server.url(), NS, worker).capabilities(&[CAPABILITY]).topics(&[TOPIC]).heartbeat(HEARTBEAT)
    });
    let mut workers = join_all(builders.iter().map(TestAgentBuilder::start)).await;
    let ready = started.elapsed();

    assert_eq!(reviewers(&mut client).await, workers_with_stale(None), "the workers by capability, by id");

    // Topic: each worker gets every job once; the publisher (subscribed
    // too) never does.
    let mut handed = Handed::default();
    for n in 1..=TOPIC_JOBS {
        publish(&mut client, &mut handed, &format!("topic-{n}")).await;
    }
    gather(&mut client, &handed.answers(), DEADLINE, &mut workers).await;
    let kinds = vec![Kind::Topic.into()];
    let own =
        ReceiveRequest { namespace: NS.to_owned(), agent_id: COORDINATOR.to_owned(), kinds, ..Default::default() };
    let own = receive(&mut client, own).await;
    assert!(own.messages.is_empty(), "the coordinator got its own publish: {own:?}");

    // Direct, round-robin; the first one waits for its ack.
    let mut direct = Handed::default();
    for n in 1..=DIRECT_JOBS {
        let confirm = (n == 1).then_some(DEADLINE);
        let sent = send_direct(&mut client, &mut direct, WORKERS[(n - 1) % 3], &format!("direct-{n}"), confirm).await;
        assert_eq!(sent.confirmed, n == 1, "only a send with confirm_timeout is confirmed: {sent:?}");
    }
    gather(&mut client, &direct.answers(), DEADLINE, &mut workers).await;
    handed.extend(direct);

    delegate_to_each(&client, &mut handed).await;
    broadcast_and_gather_all(&mut client, &mut handed, "broadcast-1").await;

    let mut lines = Vec::new();
    for builder in &builders {
        let log = log_since(builder, 0);
        let worker = builder.agent_id();
        assert_eq!(jobs(&log), handed.of(worker), "{worker} handled each message handed to it, once");
        lines.push(log.len());
    }
    let tea_flow = started.elapsed();

    // The crash: the victim is killed while jobs flow to it, and more queue
    // for it while it is down, and then while it is stale.
    let victim = WORKERS[VICTIM];
    let mut crash = Handed::default();
    let mut killed_at = started;
    for n in 1..=CRASH_JOBS {
        let id = format!("crash-{n}");
        if n % 2 == 1 {
            send_direct(&mut client, &mut crash, victim, &id, None).await;
        } else {
            publish(&mut client, &mut crash, &id).await;
        }
        if n == KILL_AFTER {
            workers[VICTIM].kill().await;
            killed_at = Instant::now();
        }
    }
    let before_death = log_since(&builders[VICTIM], lines[VICTIM]);
    let went_stale = wait_until_stale(&mut client, victim, killed_at).await;
    send_direct(&mut client, &mut crash, victim, "stale-1", None).await;
    publish(&mut client, &mut crash, "stale-2").await;

    let restarted = Instant::now();
    workers[VICTIM] = builders[VICTIM].start().await;
    assert_eq!(reviewers(&mut client).await, workers_with_stale(None), "registering again makes it active");
    gather(&mut client, &crash.answers(), RECOVERY_DEADLINE, &mut workers).await;
    let recovered = restarted.elapsed();

    let mut duplicates = Vec::new();
    for (n, builder) in builders.iter().enumerate() {
        let worker = builder.agent_id();
        let log = log_since(builder, lines[n]);
        let distinct: BTreeSet<(Kind, String)> = jobs(&log).into_iter().collect();
        let expected: BTreeSet<(Kind, String)> = crash.of(worker).into_iter().collect();
        assert_eq!(distinct, expected, "{worker} handled every job queued for it, and no other");
        let repeated = repeats(&log);
        // A worker logs a message, answers it and acks it before it reads
        // the next: only the one the victim was handling when it was killed
        // may come twice.
        let may_repeat = if n == VICTIM { before_death.last() } else { None };
        let unexpected: Vec<&&Handled> =
            repeated.iter().filter(|handled| may_repeat.is_none_or(|last| last.id != handled.id)).collect();
        assert!(unexpected.is_empty(), "{worker} got these twice: {unexpected:?}");
        let details: Vec<String> = repeated
            .iter()
            .map(|handled| format!(" ({}, delivery_attempt {})", handled.job, handled.attempt))
            .collect();
        duplicates.push(format!("{worker}={}{}", repeated.len(), details.concat()));
    }
    eprintln!(
        "hub e2e: workers ready after {ready:.1?}; TEA flow done after {tea_flow:.1?}; {victim} killed after \
         handling {} of the {KILL_AFTER} jobs sent to it, reported stale {went_stale:.1?} after it was killed, \
         had handled all {} jobs sent to it {recovered:.1?} after its restart; log duplicates {}; total {:.1?}",
        before_death.len(),
        crash.of(victim).len(),
        duplicates.join(", "),
        started.elapsed()
    );
}
