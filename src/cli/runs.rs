//! `chorus run start|get|list|watch|cancel|signal`.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use chorus_proto::workflow::{
    self as pb, GetDefinitionRequest, GetRunRequest, ListRunsRequest, SignalRunRequest, StartRunRequest,
    WatchRunRequest, run_event, workflow_client::WorkflowClient,
};
use chorus_runtime::transport::{Transport, cut_off};
use chorus_workflow::domain::InputType;
use clap::Args;
use serde_json::{Map, Value};

use super::{Failure, Outcome, Target, view};

type Client = WorkflowClient<Transport>;

#[derive(Debug, Args)]
pub(crate) struct StartArgs {
    workflow: String,
    /// 0: the latest.
    #[arg(long, default_value_t = 0)]
    version: u32,
    /// `key=value`, repeatable; a value that parses as JSON is taken as JSON,
    /// but as text for an input the workflow declares a string.
    #[arg(long = "input")]
    inputs: Vec<String>,
    /// The whole input as a JSON object (`--input` entries are added to it).
    #[arg(long)]
    input_json: Option<String>,
    #[arg(long, default_value = "")]
    idempotency_key: String,
    /// Follow the run until it ends.
    #[arg(long)]
    watch: bool,
    /// Start it even though the workflow is disabled (to try a fix before enabling it again).
    #[arg(long)]
    while_disabled: bool,
}

fn object(what: &str, text: &str) -> Result<Map<String, Value>, Failure> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Failure::Call(format!("{what} must be a JSON object"))),
        Err(error) => Err(Failure::Call(format!("{what} is not JSON: {error}"))),
    }
}

fn input(args: &StartArgs) -> Result<Map<String, Value>, Failure> {
    let mut input = match &args.input_json {
        Some(text) => object("--input-json", text)?,
        None => Map::new(),
    };
    for entry in &args.inputs {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(Failure::Call(format!("--input {entry}: expected key=value")));
        };
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
        input.insert(key.to_owned(), value);
    }
    Ok(input)
}

/// Whether `--input key=value` reads as JSON other than a string (`9`, `1.2`, `true`).
fn read_as_json((_, value): &(&str, &str)) -> bool {
    !matches!(serde_json::from_str(value), Ok(Value::String(_)) | Err(_))
}

/// Takes back as text each `--input` value read as JSON whose input the
/// workflow declares a string (`--input version=9`), as the definition says:
/// left as read when the definition cannot be read.
async fn as_declared(client: &mut Client, target: &Target, args: &StartArgs, input: &mut Map<String, Value>) {
    let entries: Vec<(&str, &str)> =
        args.inputs.iter().filter_map(|entry| entry.split_once('=')).filter(read_as_json).collect();
    if entries.is_empty() {
        return;
    }
    let request = GetDefinitionRequest {
        namespace: target.namespace.clone(),
        name: args.workflow.clone(),
        version: args.version,
    };
    let Ok(definition) = client.get_definition(request).await.map(tonic::Response::into_inner) else { return };
    let Some(spec) = chorus_workflow::parse::parse(&definition.source, &definition.file).spec else { return };
    for (key, value) in entries {
        if spec.inputs.iter().any(|declared| declared.name == key && declared.kind == InputType::String) {
            input.insert(key.to_owned(), Value::String(value.to_owned()));
        }
    }
}

pub(super) async fn start(client: &mut Client, target: &Target, args: StartArgs) -> Outcome {
    let mut input = input(&args)?;
    as_declared(client, target, &args, &mut input).await;
    let request = StartRunRequest {
        namespace: target.namespace.clone(),
        workflow: args.workflow.clone(),
        version: args.version,
        input: Some(chorus_proto::json::struct_from_json(input)),
        idempotency_key: args.idempotency_key.clone(),
        origin: Some(pb::RunOrigin {
            kind: pb::run_origin::Kind::Api.into(),
            started_by: view::user(),
            ..pb::RunOrigin::default()
        }),
        while_disabled: args.while_disabled,
    };
    let run = client.start_run(request).await?.into_inner();
    outln!("{}", run.id);
    if args.watch { watch(client, target, &run.id).await } else { Ok(()) }
}

pub(super) async fn get(client: &mut Client, target: &Target, run_id: &str, json: bool, wait: bool) -> Outcome {
    let request = GetRunRequest { namespace: target.namespace.clone(), run_id: run_id.to_owned(), wait_finished: wait };
    let run = if wait { finished(client, target, request).await? } else { client.get_run(request).await?.into_inner() };
    if json {
        outln!("{}", view::pretty(&run_json(&run)));
    } else {
        out!("{}", view::run(&run));
    }
    Ok(())
}

/// A run as JSON: its fields in the proto's names.
fn run_json(run: &pb::Run) -> Value {
    let steps: Vec<Value> = run
        .steps
        .iter()
        .map(|step| {
            serde_json::json!({
                "seq": step.seq,
                "step_id": step.step_id,
                "kind": step.kind().as_str_name(),
                "state": step.state().as_str_name(),
                "parent_step_id": step.parent_step_id,
                "iteration": step.iteration,
                "attempt": step.attempt,
                "input": view::struct_json(step.input.as_ref()),
                "output": view::struct_json(step.output.as_ref()),
                "error": step.error,
                "skip_reason": step.skip_reason,
                "external_id": step.external_id,
                "waiting_for_signal": step.waiting_for_signal,
                "wake_at": view::timestamp_json(step.wake_at.as_ref()),
                "created_at": view::timestamp_json(step.created_at.as_ref()),
                "started_at": view::timestamp_json(step.started_at.as_ref()),
                "finished_at": view::timestamp_json(step.finished_at.as_ref()),
            })
        })
        .collect();
    let decisions: Vec<Value> = run
        .gate_decisions
        .iter()
        .map(|d| {
            serde_json::json!({
                "step_id": d.step_id, "iteration": d.iteration, "decision": d.decision().as_str_name(),
                "outcome": d.outcome().as_str_name(), "decided_by": d.decided_by, "reason": d.reason,
                "automatic": d.automatic, "data": view::struct_json(d.data.as_ref()),
                "decided_at": view::timestamp_json(d.decided_at.as_ref()),
            })
        })
        .collect();
    let signals: Vec<Value> = run
        .signals
        .iter()
        .map(|signal| {
            serde_json::json!({
                "id": signal.id, "name": signal.name, "payload": view::struct_json(signal.payload.as_ref()),
                "sent_by": signal.sent_by, "consumed_by_step_id": signal.consumed_by_step_id,
                "received_at": view::timestamp_json(signal.received_at.as_ref()),
            })
        })
        .collect();
    let origin = run.origin.clone().unwrap_or_default();
    serde_json::json!({
        "id": run.id,
        "workflow": run.workflow,
        "version": run.version,
        "state": run.state().as_str_name(),
        "input": view::struct_json(run.input.as_ref()),
        "output": view::struct_json(run.output.as_ref()),
        "error": run.error,
        "cancel_reason": run.cancel_reason,
        "pending_reason": run.pending_reason,
        "origin": {
            "kind": origin.kind().as_str_name(), "started_by": origin.started_by,
            "event_sequence": origin.event_sequence, "event_type": origin.event_type, "task_id": origin.task_id,
        },
        "idempotency_key": run.idempotency_key,
        "created_at": view::timestamp_json(run.created_at.as_ref()),
        "updated_at": view::timestamp_json(run.updated_at.as_ref()),
        "finished_at": view::timestamp_json(run.finished_at.as_ref()),
        "steps": steps,
        "gate_decisions": decisions,
        "signals": signals,
    })
}

/// A run as a listing shows it: without steps, gate decisions and signals,
/// which a listing does not carry (`run get --json` has them).
fn listed_run_json(run: &pb::Run) -> Value {
    let mut listed = run_json(run);
    if let Some(fields) = listed.as_object_mut() {
        for key in ["steps", "gate_decisions", "signals"] {
            fields.remove(key);
        }
    }
    listed
}

pub(super) async fn list(
    client: &mut Client,
    target: &Target,
    workflow: Option<String>,
    states: &[String],
    limit: usize,
    json: bool,
) -> Outcome {
    let states = states_in(states)?;
    let (runs, more) = runs_of(client, target, workflow.as_deref(), &states, limit).await?;
    let unfiltered = workflow.is_none() && states.is_empty();
    super::definitions::check_known(client, target, workflow, runs.is_empty()).await?;
    if more {
        eprintln!("(more runs than the {limit} listed: raise --limit, or narrow with --workflow and --state)");
    }
    if runs.is_empty() && unfiltered {
        eprintln!("(namespace `{}` holds no runs)", target.namespace);
    }
    if json {
        return view::print_json(runs.iter().map(listed_run_json));
    }
    let mut rows = vec![["RUN", "WORKFLOW", "VERSION", "STATE", "CREATED"].map(str::to_owned).to_vec()];
    rows.extend(runs.iter().map(|run| {
        vec![
            run.id.clone(),
            run.workflow.clone(),
            run.version.to_string(),
            view::run_state(run.state()),
            view::time(run.created_at.as_ref()),
        ]
    }));
    out!("{}", view::table(&rows));
    Ok(())
}

/// `--state` values as the API's states.
pub(super) fn states_in(states: &[String]) -> Result<Vec<i32>, Failure> {
    states
        .iter()
        .map(|state| {
            pb::RunState::from_str_name(&format!("RUN_STATE_{}", state.to_uppercase())).map(i32::from).ok_or_else(
                || {
                    Failure::Call(format!(
                        "--state {state}: expected pending, running, waiting, completed, failed or canceled"
                    ))
                },
            )
        })
        .collect()
}

/// Up to `limit` runs, newest first, of `workflow` (any when `None`) in
/// `states` (any when empty), and whether there are more.
pub(super) async fn runs_of(
    client: &mut Client,
    target: &Target,
    workflow: Option<&str>,
    states: &[i32],
    limit: usize,
) -> Result<(Vec<pb::Run>, bool), Failure> {
    let mut runs = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = ListRunsRequest {
            namespace: target.namespace.clone(),
            workflow: workflow.unwrap_or_default().to_owned(),
            states: states.to_vec(),
            page_size: u32::try_from(limit.saturating_sub(runs.len()).clamp(1, 100)).unwrap_or(100),
            page_token: page_token.clone(),
            ..ListRunsRequest::default()
        };
        let page = client.list_runs(request).await?.into_inner();
        runs.extend(page.runs);
        if page.next_page_token.is_empty() {
            return Ok((runs, false));
        }
        if runs.len() >= limit {
            runs.truncate(limit);
            return Ok((runs, true));
        }
        page_token = page.next_page_token;
    }
}

/// How long a watch or a wait that lost its server keeps trying to get back to it.
const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// A call that lost its server, trying again with a growing pause until
/// [`RECONNECT_FOR`] has passed since the server was last heard from.
#[derive(Default)]
struct Reconnect(Option<(Instant, Duration)>);

impl Reconnect {
    /// The server answered: a later loss starts its own count.
    fn heard(&mut self) {
        self.0 = None;
    }

    /// Pauses before the next try after `status`; an error once it is too late.
    async fn pause(&mut self, target: &Target, status: &tonic::Status, what: &str) -> Result<(), Failure> {
        let (since, delay) = self.0.get_or_insert_with(|| (Instant::now(), Duration::from_millis(100)));
        if since.elapsed() > RECONNECT_FOR {
            return Err(Failure::Call(format!("lost {}: {}", target.server(), status.message())));
        }
        eprintln!("lost {} ({}); {what} again in {} ms", target.server(), status.message(), delay.as_millis());
        tokio::time::sleep(*delay).await;
        *delay = (*delay * 2).min(Duration::from_secs(2));
        Ok(())
    }
}

/// The run once it has finished, however long that takes: a server answers
/// a wait at the latest when its request timeout (`server.request_timeout_ms`)
/// passes, and may restart meanwhile; the wait is asked for again.
async fn finished(client: &mut Client, target: &Target, request: GetRunRequest) -> Result<pb::Run, Failure> {
    let mut reconnect = Reconnect::default();
    loop {
        match client.get_run(request.clone()).await {
            Ok(run) => return Ok(run.into_inner()),
            Err(status) if status.code() == tonic::Code::Cancelled && !cut_off(&status) => reconnect.heard(),
            Err(status) if cut_off(&status) => reconnect.pause(target, &status, "waiting").await?,
            Err(status) => return Err(status.into()),
        }
    }
}

pub(super) async fn watch(client: &mut Client, target: &Target, run_id: &str) -> Outcome {
    let mut request = WatchRunRequest {
        namespace: target.namespace.clone(),
        run_id: run_id.to_owned(),
        ..WatchRunRequest::default()
    };
    let mut last = pb::RunState::Unspecified;
    // A record written again with nothing a person sees changed (a gate
    // waiting, then announced) is printed once; one that only learned more
    // (a spawn's task) prints what it learned.
    let mut shown: HashMap<(String, u32, u32), (i32, String)> = HashMap::new();
    let mut reconnect = Reconnect::default();
    loop {
        // The run goes on while the server is away (a restart, a deploy):
        // the watch picks it up again after the last event it printed.
        let outcome = async {
            let mut events = client.watch_run(request.clone()).await?.into_inner();
            while let Some(event) = events.message().await? {
                reconnect.heard();
                last = event.state();
                request.after_cursor.clone_from(&event.cursor);
                let mut line = view::event(&event);
                if event.kind() == run_event::Kind::RunStateChanged
                    && matches!(event.state(), pb::RunState::Failed | pb::RunState::Canceled)
                {
                    // Why it ended: the run says (its TTL, a failed step, who canceled it).
                    let request = GetRunRequest {
                        namespace: target.namespace.clone(),
                        run_id: run_id.to_owned(),
                        wait_finished: false,
                    };
                    let run = client.get_run(request).await?.into_inner();
                    let why = if run.cancel_reason.is_empty() { run.error } else { run.cancel_reason };
                    if !why.is_empty() {
                        line = format!("{line}: {why}");
                    }
                }
                if let Some(step) = event.step.as_ref().filter(|_| event.kind() == run_event::Kind::StepUpdated) {
                    let record = (step.step_id.clone(), step.iteration, step.attempt);
                    let before = shown.insert(record, (step.state, line.clone()));
                    match before {
                        Some((_, seen)) if seen == line => continue,
                        Some((state, _)) if state == step.state => {
                            line = format!("{} {}", view::step_name(step), view::step_detail(step));
                        }
                        _ => {}
                    }
                }
                outln!("{}  {line}", view::time(event.time.as_ref()));
            }
            Ok::<_, tonic::Status>(())
        }
        .await;
        match outcome {
            Ok(()) => break,
            Err(status) if cut_off(&status) => reconnect.pause(target, &status, "watching").await?,
            Err(status) => return Err(status.into()),
        }
    }
    if last == pb::RunState::Completed { Ok(()) } else { Err(Failure::No) }
}

/// A signal from the command line.
pub(super) struct Signal {
    pub(super) name: String,
    /// JSON object text.
    pub(super) payload: Option<String>,
    pub(super) id: Option<String>,
}

pub(super) async fn signal(client: &mut Client, target: &Target, run_id: &str, signal: Signal) -> Outcome {
    let Signal { name, payload, id } = signal;
    let payload = payload.map(|text| object("--payload", &text)).transpose()?.unwrap_or_default();
    let request = SignalRunRequest {
        namespace: target.namespace.clone(),
        run_id: run_id.to_owned(),
        name,
        payload: Some(chorus_proto::json::struct_from_json(payload)),
        sent_by: view::user(),
        signal_id: id.unwrap_or_default(),
    };
    let sent = client.signal_run(request).await?.into_inner();
    outln!("{}{}", sent.signal_id, if sent.duplicate { " (duplicate)" } else { "" });
    Ok(())
}
