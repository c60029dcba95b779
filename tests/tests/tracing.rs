//! One request through two processes makes one trace: a client's `traceparent`
//! on CreateTask is continued by the task store, saved on the task, continued
//! by the echo agent that handles it, and sent back with the agent's
//! CompleteTask. Both services export over OTLP/gRPC to a real receiver.
//!
//! Needs `CHORUS_BIN` (set by `make test`): the path of the `chorus` binary.

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher as _, Hasher as _},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use chorus_proto::taskstore::{
    self as pb, CreateTaskRequest, GetTaskRequest, TaskState, WatchTaskRequest, task_store_client::TaskStoreClient,
};
use chorus_tests::otlp::{CollectedSpan, OtlpReceiver, hex};
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    process::{Child, ChildStdout, Command},
    time::Instant,
};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

const TASKSTORE: &str = "chorus-taskstore";
const AGENT: &str = "chorus-agent-echo";
const CREATE_TASK: &str = "chorus.taskstore.v1.TaskStore/CreateTask";
const COMPLETE_TASK: &str = "chorus.taskstore.v1.TaskStore/CompleteTask";
/// An upper bound for each step; every wait ends as soon as its event happens.
const STEP: Duration = Duration::from_secs(30);

/// A `chorus` process with its stderr in a log file; killed when dropped (`kill_on_drop`).
struct Chorus {
    _child: Child,
    log: PathBuf,
    /// Kept open so that the process never writes into a closed pipe.
    stdout: BufReader<ChildStdout>,
    announced: Option<String>,
}

impl Chorus {
    /// Starts `chorus ARGS` exporting spans to `otlp_endpoint`, in `dir`.
    /// With `announces`, waits for its `chorus listening on URL` line.
    async fn start(dir: &Path, name: &str, args: &[&str], otlp_endpoint: &str, announces: bool) -> Self {
        let bin = std::env::var_os("CHORUS_BIN").expect("CHORUS_BIN names the chorus binary (`make test` sets it)");
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file can be created");
        let mut command = Command::new(bin);
        command
            .args(args)
            .current_dir(dir)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        // Whatever the developer's shell says about telemetry must not redirect or rename it.
        for variable in [
            "OTEL_SERVICE_NAME",
            "OTEL_RESOURCE_ATTRIBUTES",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_TRACES_SAMPLER",
            "OTEL_TRACES_SAMPLER_ARG",
            "OTEL_SDK_DISABLED",
            "CHORUS_CONFIG",
        ] {
            command.env_remove(variable);
        }
        let mut child = command.spawn().expect("chorus starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut process = Self { _child: child, log, stdout: BufReader::new(stdout), announced: None };
        if announces {
            process.announced = Some(process.read_announcement().await);
        }
        process
    }

    async fn read_announcement(&mut self) -> String {
        let mut line = String::new();
        let read = tokio::time::timeout(STEP, self.stdout.read_line(&mut line)).await;
        let url = line.trim().strip_prefix("chorus listening on ").map(str::to_owned);
        match (read, url) {
            (Ok(Ok(_)), Some(url)) => url,
            (read, _) => panic!("no `chorus listening on` line ({read:?}, read {line:?}); log:\n{}", self.logs()),
        }
    }

    fn url(&self) -> &str {
        self.announced.as_deref().expect("this process announces its address")
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|error| format!("<cannot read {}: {error}>", self.log.display()))
    }
}

/// Random W3C ids: 16 bytes of trace id, 8 of span id (std's hasher keys are random).
fn random_ids() -> (String, String) {
    let random = || RandomState::new().build_hasher().finish().to_be_bytes();
    let trace_id = [random(), random()].concat();
    (hex(&trace_id), hex(&random()))
}

/// Waits for the gRPC health service to report the task store SERVING.
async fn wait_until_serving(channel: Channel) {
    let mut health = HealthClient::new(channel);
    let request = HealthCheckRequest { service: "chorus.taskstore.v1.TaskStore".to_owned() };
    let mut statuses = health.watch(request).await.expect("health watch opens").into_inner();
    let serving = tokio::time::timeout(STEP, async {
        while let Some(status) = statuses.message().await.expect("health watch stream") {
            if status.status() == ServingStatus::Serving {
                return;
            }
        }
        panic!("health watch ended before the task store was serving");
    });
    serving.await.expect("the task store becomes SERVING");
}

/// Creates an echo task carrying `traceparent` and waits for it to complete.
async fn create_and_finish(channel: Channel, traceparent: &str) -> Result<String, String> {
    let mut client = TaskStoreClient::new(channel);
    let text = pb::Part { content: Some(pb::part::Content::Text("hello, traces".to_owned())), ..Default::default() };
    let message = pb::Message {
        message_id: format!("tracing-{traceparent}"),
        role: pb::Role::User.into(),
        parts: vec![text],
        ..Default::default()
    };
    let create = CreateTaskRequest {
        namespace: "default".to_owned(),
        agent_id: "echo".to_owned(),
        message: Some(message),
        ..Default::default()
    };
    let mut request = tonic::Request::new(create);
    request.metadata_mut().insert("traceparent", traceparent.parse().expect("a traceparent is valid metadata"));
    let task = client.create_task(request).await.map_err(|status| format!("CreateTask failed: {status}"))?;
    let task_id = task.into_inner().id;
    let watch = WatchTaskRequest { namespace: "default".to_owned(), task_id: task_id.clone(), ..Default::default() };
    let mut events = client.watch_task(watch).await.map_err(|status| format!("WatchTask failed: {status}"))?;
    let events = events.get_mut();
    loop {
        let event = events.message().await.map_err(|status| format!("WatchTask stream broke: {status}"))?;
        let Some(event) = event else {
            return Err(format!("WatchTask ended before task {task_id} finished"));
        };
        let state = event.status.map(|status| status.state());
        match state {
            Some(TaskState::Completed) => return Ok(task_id),
            Some(state @ (TaskState::Failed | TaskState::Canceled | TaskState::Rejected)) => {
                return Err(format!("task {task_id} ended {state:?}"));
            }
            _ => {}
        }
    }
}

/// The spans of one request, found among everything collected.
struct Trace<'a> {
    spans: &'a [CollectedSpan],
    create: &'a CollectedSpan,
    handle: &'a CollectedSpan,
    complete: &'a CollectedSpan,
}

/// Finds the three spans the request must have made in trace `trace_id`, or
/// says which is missing.
fn find_trace<'a>(spans: &'a [CollectedSpan], trace_id: &str, task_id: &str) -> Result<Trace<'a>, String> {
    let find = |service: &str, name: &str| {
        spans
            .iter()
            .find(|span| span.trace_id == trace_id && span.service_name == service && span.name == name)
            .ok_or_else(|| format!("no `{name}` span from {service} in trace {trace_id}"))
    };
    let create = find(TASKSTORE, CREATE_TASK)?;
    let handle = find(AGENT, "handle_task")?;
    // The store has one CompleteTask span per call; this trace has this task's only.
    let complete = spans
        .iter()
        .find(|span| {
            span.service_name == TASKSTORE && span.name == COMPLETE_TASK && span.attribute("task_id") == Some(task_id)
        })
        .ok_or_else(|| format!("no `{COMPLETE_TASK}` span from {TASKSTORE} with task_id {task_id}"))?;
    Ok(Trace { spans, create, handle, complete })
}

fn descends_from(spans: &[CollectedSpan], span: &CollectedSpan, ancestor: &CollectedSpan) -> bool {
    span.ancestors(spans).contains(&ancestor)
}

/// A task store on SQLite in `dir`, exporting to `otlp_endpoint`, once it serves; a channel to it.
async fn serving_taskstore(dir: &Path, otlp_endpoint: &str) -> (Chorus, Channel) {
    let database_url = format!("sqlite://{}?mode=rwc", dir.join("tasks.db").display());
    let serve_args = ["serve", "taskstore", "--listen", "127.0.0.1:0", "--database-url", &database_url];
    let taskstore = Chorus::start(dir, "taskstore", &serve_args, otlp_endpoint, true).await;
    let channel = Channel::from_shared(taskstore.url().to_owned()).expect("announced URL").connect().await;
    let channel = channel.expect("the task store accepts connections");
    wait_until_serving(channel.clone()).await;
    (taskstore, channel)
}

#[tokio::test]
async fn one_request_through_two_services_is_one_trace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (receiver, otlp_endpoint) = OtlpReceiver::start().await.expect("the OTLP receiver starts");
    let (taskstore, channel) = serving_taskstore(dir.path(), &otlp_endpoint).await;
    let agent_args = ["agent", "echo", "--server", taskstore.url()];
    let agent = Chorus::start(dir.path(), "agent", &agent_args, &otlp_endpoint, false).await;
    let logs = || format!("task store log:\n{}\necho agent log:\n{}", taskstore.logs(), agent.logs());

    let (trace_id, parent_span_id) = random_ids();
    let traceparent = format!("00-{trace_id}-{parent_span_id}-01");
    let finished = tokio::time::timeout(STEP, create_and_finish(channel, &traceparent)).await;
    let task_id = match finished {
        Ok(Ok(task_id)) => task_id,
        Ok(Err(error)) => panic!("{error}\n{}", logs()),
        Err(_) => panic!("task did not complete within {STEP:?}\n{}", logs()),
    };

    let found = |spans: &[CollectedSpan]| find_trace(spans, &trace_id, &task_id).is_ok();
    let spans = match receiver.wait_for(found, Instant::now() + STEP).await {
        Ok(spans) => spans,
        Err(timed_out) => {
            let missing = find_trace(&timed_out.spans, &trace_id, &task_id).err().unwrap_or_default();
            panic!("{missing}\n{timed_out}\n{}", logs());
        }
    };
    let trace = find_trace(&spans, &trace_id, &task_id).expect("wait_for checked it");
    let dump = || spans.iter().map(|span| format!("\n  {span}")).collect::<String>();

    // The task store continued the client's trace, under the client's span, and tagged the task.
    assert_eq!(trace.create.parent_span_id.as_deref(), Some(parent_span_id.as_str()), "{}", dump());
    assert_eq!(trace.create.attribute("task_id"), Some(task_id.as_str()), "{}", dump());
    // The agent, another process, continued the trace saved on the task.
    assert_eq!(trace.handle.attribute("task_id"), Some(task_id.as_str()), "{}", dump());
    assert!(descends_from(trace.spans, trace.handle, trace.create), "handle_task is not under CreateTask:{}", dump());
    // The agent's CompleteTask call reached the task store inside the same trace, under handle_task.
    assert_eq!(trace.complete.trace_id, trace_id, "CompleteTask is in another trace:{}", dump());
    assert!(
        descends_from(trace.spans, trace.complete, trace.handle),
        "CompleteTask does not lead back to handle_task:{}",
        dump()
    );
}

/// Asks the task store for a task it does not have: one traced request.
async fn traced_request(channel: Channel) {
    let request =
        GetTaskRequest { namespace: "default".to_owned(), id: "no-such-task".to_owned(), ..Default::default() };
    let status = TaskStoreClient::new(channel).get_task(request).await.expect_err("there is no such task");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status}");
}

/// Spans lost to a collector that does not answer are said in the log once,
/// however many batches fail, and so is the collector's return; spans then
/// flow again without a restart.
#[tokio::test]
async fn a_collector_that_does_not_answer_is_logged_once_and_so_is_its_return() {
    const DOWN: &str = "cannot export spans";
    const BACK: &str = "span export works again";
    let dir = tempfile::tempdir().expect("temp dir");
    let free = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
    let address = free.local_addr().expect("its address");
    drop(free);
    let otlp_endpoint = format!("http://{address}");
    let (taskstore, channel) = serving_taskstore(dir.path(), &otlp_endpoint).await;

    let said = |line: &str| taskstore.logs().matches(line).count();
    let deadline = Instant::now() + STEP;
    while said(DOWN) == 0 {
        assert!(Instant::now() < deadline, "no `{DOWN}` warning:\n{}", taskstore.logs());
        traced_request(channel.clone()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Batches go every 100 ms: these lose several more.
    for _ in 0..5 {
        traced_request(channel.clone()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(said(DOWN), 1, "the outage is said once:\n{}", taskstore.logs());
    assert!(taskstore.logs().contains(&otlp_endpoint), "the warning names the endpoint:\n{}", taskstore.logs());

    let listener = tokio::net::TcpListener::bind(address).await.expect("the collector's port is free again");
    let (receiver, _) = OtlpReceiver::serve(listener).expect("the OTLP receiver starts");
    let deadline = Instant::now() + STEP;
    while receiver.spans().iter().all(|span| !span.name.ends_with("/GetTask")) || said(BACK) == 0 {
        assert!(Instant::now() < deadline, "spans did not flow again:\n{}", taskstore.logs());
        traced_request(channel.clone()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!((said(DOWN), said(BACK)), (1, 1), "{}", taskstore.logs());
}
