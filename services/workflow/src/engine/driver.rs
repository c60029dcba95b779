//! Driving one claimed run: issue its side effects, await them, record each
//! result (and what follows from it) in one transaction, until the run needs
//! no engine — it finished, or every active step waits on a timer, a signal
//! or a gate — and is released.

use std::{collections::HashSet, time::Duration};

use futures_util::{FutureExt as _, StreamExt as _, future::BoxFuture, stream::FuturesUnordered};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::plan::find;
use crate::{
    domain::{Action, Run, StepKind, StepRecord, StepState, WorkflowSpec},
    effects::{Destination, EffectError, Effects, Note, Origin, TaskOutcome},
    error::WorkflowError,
    repository::{Claim, Fence},
    service::Workflows,
};

/// What a finished effect reports.
#[derive(Debug)]
enum Done {
    /// A spawn's task exists: its id.
    Issued(String),
    /// An attempt ended: its output, or why it failed.
    Attempt(Result<Value, String>),
    /// An attempt failed so that no retry can succeed: why.
    Refused(String),
    /// A delegation ended: the agent's task, when it made one, and the
    /// attempt's output or why it failed.
    Delegated(Option<String>, Result<Value, String>),
    /// A gate's `gate.required` event is on the bus.
    Announced(u64),
    /// A canceled step's task was canceled.
    Canceled,
    /// A spawn's task is not in the task store (its data was restored from
    /// before the task was made): its id.
    Gone(String),
}

/// How often a driver re-reads its run without a wake-up.
const REFRESH: Duration = Duration::from_secs(5);

/// Drives a claimed run until it is released, lost or the engine stops.
/// `fences` carries newer claims of the same run by this engine; `stop`
/// decides, atomically with such claims, whether the driver may end.
pub(crate) async fn drive(
    workflows: Workflows,
    claim: Claim,
    mut fences: watch::Receiver<Fence>,
    stop: impl Fn(&mut watch::Receiver<Fence>) -> bool,
    shutdown: CancellationToken,
) {
    let Claim { namespace, run_id, workflow, version, .. } = claim;
    let spec = match workflows.spec(&namespace, &workflow, version).await {
        Ok(spec) => spec,
        Err(error) => return tracing::error!(%run_id, %error, "cannot read the run's definition"),
    };
    let mut inflight: FuturesUnordered<BoxFuture<'static, ((u32, bool), Done)>> = FuturesUnordered::new();
    // Effects in flight, by record and whether they cancel its task.
    let mut busy: HashSet<(u32, bool)> = HashSet::new();
    let mut refresh = true;
    let mut done: Option<(u32, Done)> = None;
    // The run's next timer (a wait, a retry's backoff, a deadline) while held.
    let mut next_timer: Option<tokio::time::Instant> = None;
    loop {
        let fence = fences.borrow_and_update().clone();
        let mut waiter = workflows.wakeups.waiter(&crate::service::drive_key(&run_id));
        if refresh || done.is_some() {
            refresh = false;
            let result = done.take();
            let outcome = workflows
                .transition(&namespace, &run_id, &spec, Some(&fence), |planner, run| {
                    if let Some((seq, done)) = &result {
                        apply(planner, run, *seq, done);
                    }
                    Ok(())
                })
                .await;
            let run = match outcome {
                Ok(run) => run,
                Err(WorkflowError::LeaseLost(_) | WorkflowError::RunNotFound(_)) if stop(&mut fences) => return,
                Err(WorkflowError::LeaseLost(_) | WorkflowError::RunNotFound(_)) => continue,
                Err(error) => {
                    tracing::warn!(%run_id, %error, "cannot record the run's progress; retrying");
                    done = result;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if !super::schedule::needs_driver(&run) {
                if stop(&mut fences) {
                    return;
                }
                refresh = true;
                continue;
            }
            next_timer = super::schedule::next_timer(&run).map(|at| {
                let left = u64::try_from(at - chorus_runtime::time::now_micros()).unwrap_or_default();
                tokio::time::Instant::now() + Duration::from_micros(left)
            });
            for record in &run.body.steps {
                let key = (record.seq, record.cancel_pending);
                if !busy.contains(&key)
                    && let Some(effect) = effect(&workflows, &spec, &run, record)
                {
                    busy.insert(key);
                    inflight.push(effect.map(move |(_, done)| (key, done)).boxed());
                }
            }
        }
        tokio::select! {
            Some((key, finished)) = inflight.next() => {
                busy.remove(&key);
                done = Some((key.0, finished));
            }
            () = waiter.wait(REFRESH) => refresh = true,
            () = tokio::time::sleep_until(next_timer.unwrap_or_else(tokio::time::Instant::now)), if next_timer.is_some() => {
                next_timer = None;
                refresh = true;
            }
            changed = fences.changed() => refresh = changed.is_ok(),
            () = shutdown.cancelled() => return,
        }
    }
}

/// Records a finished effect on its step record, if the record still waits for it.
fn apply(planner: &super::plan::Planner<'_>, run: &mut Run, seq: u32, done: &Done) {
    let Some(index) = run.body.steps.iter().position(|record| record.seq == seq) else { return };
    let record = &run.body.steps[index];
    match done {
        Done::Issued(task_id) if record.state == StepState::Running && record.external_id.is_none() => {
            run.body.step_mut(index).external_id = Some(task_id.clone());
        }
        Done::Attempt(result) if record.state == StepState::Running => {
            planner.attempt_ended(run, index, result.clone(), true);
        }
        Done::Refused(error) if record.state == StepState::Running => {
            planner.attempt_ended(run, index, Err(error.clone()), false);
        }
        Done::Delegated(task_id, result) if record.state == StepState::Running => {
            if task_id.is_some() {
                run.body.step_mut(index).external_id.clone_from(task_id);
            }
            planner.attempt_ended(run, index, result.clone(), true);
        }
        Done::Announced(sequence) if record.state == StepState::Waiting => {
            run.body.step_mut(index).external_id = Some(format!("event:{sequence}"));
        }
        Done::Canceled if record.cancel_pending => run.body.step_mut(index).cancel_pending = false,
        // Made again under the same key, which the task store no longer knows either.
        Done::Gone(task_id) if record.state == StepState::Running && record.external_id.as_ref() == Some(task_id) => {
            let (run_id, step_id) = (&run.id, &record.step_id);
            let why = "the step's task is not in the task store (was its database restored?): making it again";
            tracing::warn!(%run_id, %step_id, %task_id, "{why}");
            run.body.step_mut(index).external_id = None;
        }
        Done::Issued(_)
        | Done::Attempt(_)
        | Done::Refused(_)
        | Done::Delegated(..)
        | Done::Announced(_)
        | Done::Canceled
        | Done::Gone(_) => {}
    }
}

/// The effect a record needs now, if any.
fn effect(
    workflows: &Workflows,
    spec: &WorkflowSpec,
    run: &Run,
    record: &StepRecord,
) -> Option<BoxFuture<'static, (u32, Done)>> {
    if !super::schedule::needs_effect(record) {
        return None;
    }
    let effects = std::sync::Arc::clone(&workflows.effects);
    let origin = Origin {
        namespace: run.namespace.clone(),
        workflow: run.workflow.clone(),
        run_id: run.id.clone(),
        step_id: record.step_id.clone(),
        iteration: record.iteration,
        attempt: record.attempt,
        key: record.effect_key(&run.id),
    };
    let seq = record.seq;
    let input = &record.input;
    if record.cancel_pending {
        let task_id = record.external_id.clone()?;
        let future = async move {
            retrying(|| effects.cancel_task(&origin.namespace, &task_id, "its workflow step was canceled")).await.ok();
            (seq, Done::Canceled)
        };
        return Some(future.boxed());
    }
    let step = find(&spec.steps, &record.step_id, None)?.step;
    match (record.kind, record.state, &step.action) {
        (StepKind::Spawn, StepState::Running, Action::Spawn(spawn)) => match record.external_id.clone() {
            None => {
                let agent = input["agent"].as_str().or(input["role"].as_str()).unwrap_or_default().to_owned();
                let input = input.clone();
                let future = async move {
                    let issued = retrying(|| effects.spawn(&origin, &agent, &input)).await;
                    (seq, issued.map_or_else(|error| Done::Attempt(Err(error)), Done::Issued))
                };
                Some(future.boxed())
            }
            Some(task_id) => {
                let started = record.started_at.unwrap_or(record.created_at);
                let deadline = spawn.timeout.map(|timeout| (timeout, started + chorus_runtime::time::micros(timeout)));
                Some(await_task(effects, origin.namespace, task_id, deadline).map(move |done| (seq, done)).boxed())
            }
        },
        // A delegate attempt is one call, as a webhook message's is: its
        // failure, even one worth trying again, ends the attempt, and the
        // step's retry decides.
        (StepKind::Delegate, StepState::Running, Action::Delegate(delegate)) => {
            let agent = delegate.agent.clone();
            let timeout = delegate.timeout;
            let input = input.clone();
            let future = async move {
                let call = effects.delegate(&origin, &agent, &input, timeout);
                let outcome = match timeout {
                    Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                        Err(EffectError::Failed(format!("no answer within {}", chorus_runtime::time::humanize(limit))))
                    }),
                    None => call.await,
                };
                let done = match outcome {
                    Ok(delegated) => Done::Delegated(delegated.task_id, task_result(delegated.outcome)),
                    Err(error) => Done::Attempt(Err(error.to_string())),
                };
                (seq, done)
            };
            Some(future.boxed())
        }
        (StepKind::Message, StepState::Running, _) => {
            let to = &input["to"];
            let to = match (&to["topic"], &to["agent"], &to["webhook"], &to["event"]) {
                (Value::String(topic), ..) => Destination::Topic(topic.clone()),
                (_, Value::String(agent), ..) => Destination::Agent(agent.clone()),
                (_, _, Value::String(url), _) => Destination::Webhook(url.clone()),
                (.., Value::String(event_type)) => Destination::Event(event_type.clone()),
                _ => return None,
            };
            let note = Note {
                text: input["text"].as_str().map(str::to_owned),
                data: input["data"].clone(),
                kind: input["type"].as_str().unwrap_or("workflow.message").to_owned(),
            };
            let future = async move {
                let send = || effects.message(&origin, &to, &note);
                let done = match &to {
                    // The hub and the bus are chorus's own: an outage (a
                    // restart) is waited out, as the task store's is for a
                    // spawn, and the step's idempotency key makes a repeated
                    // send harmless.
                    Destination::Topic(_) | Destination::Agent(_) | Destination::Event(_) => {
                        Done::Attempt(retrying(send).await)
                    }
                    Destination::Webhook(_) => match send().await {
                        Err(EffectError::Refused(error)) => Done::Refused(error),
                        sent => Done::Attempt(sent.map_err(|error| error.to_string())),
                    },
                };
                (seq, done)
            };
            Some(future.boxed())
        }
        (StepKind::Gate, StepState::Waiting, _) if record.external_id.is_none() => {
            let payload = json!({
                "run_id": run.id,
                "workflow": run.workflow,
                "version": run.version,
                "step_id": record.step_id,
                "iteration": record.iteration,
                "reviewers": input["reviewers"],
                "escalated": input["escalated"],
                "artifacts": input["artifacts"],
                "expires_at": input["expires_at"],
            });
            let future = async move {
                match retrying(|| effects.publish(&origin, "gate.required", &payload)).await {
                    Ok(sequence) => (seq, Done::Announced(sequence)),
                    // The bus refused the event; the gate still waits and can be decided.
                    Err(error) => {
                        tracing::warn!(run_id = %origin.run_id, step_id = %origin.step_id, %error, "gate.required not published");
                        (seq, Done::Announced(0))
                    }
                }
            };
            Some(future.boxed())
        }
        _ => None,
    }
}

/// Waits for a task to end, canceling it when the step's timeout passes first.
async fn await_task(
    effects: std::sync::Arc<dyn Effects>,
    namespace: String,
    task_id: String,
    deadline: Option<(Duration, i64)>,
) -> Done {
    let wait = retrying(|| effects.await_task(&namespace, &task_id));
    let outcome = match deadline {
        None => wait.await,
        Some((limit, at)) => {
            let left = u64::try_from(at - chorus_runtime::time::now_micros()).unwrap_or_default();
            match tokio::time::timeout(Duration::from_micros(left), wait).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    let reason =
                        format!("its workflow step's timeout ({}) passed", chorus_runtime::time::humanize(limit));
                    let unclaimed =
                        retrying(|| effects.cancel_task(&namespace, &task_id, &reason)).await.ok().flatten();
                    let hint = unclaimed
                        .map(|agent| format!(": no worker of agent `{agent}` claimed it (is one running?)"))
                        .unwrap_or_default();
                    Err(format!("task {task_id} did not finish within {}{hint}", chorus_runtime::time::humanize(limit)))
                }
            }
        }
    };
    match outcome {
        // Not at once: a task store that keeps losing the task made again
        // is asked about it once a second, not in a loop.
        Ok(None) => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Done::Gone(task_id)
        }
        Ok(Some(outcome)) => Done::Attempt(task_result(outcome)),
        Err(error) => Done::Attempt(Err(error)),
    }
}

fn task_result(outcome: TaskOutcome) -> Result<Value, String> {
    match outcome {
        TaskOutcome::Completed(output) => Ok(output),
        TaskOutcome::Failed(error) => Err(error),
    }
}

/// Runs `call` until it succeeds or fails for good; transient failures are
/// retried with a growing pause (the step stays running meanwhile). For the
/// calls to the task store, the hub and the bus (a spawn's task, a cancel, a
/// message to a topic or an agent, a gate's announcement), whose outage a run
/// waits out; a spawn's timeout bounds its task.
async fn retrying<T, F, Fut>(call: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, EffectError>>,
{
    retrying_with(Duration::from_millis(100), Duration::from_secs(5), call).await
}

/// As [`retrying`], the pauses from `first` doubling up to `longest`.
async fn retrying_with<T, F, Fut>(first: Duration, longest: Duration, mut call: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, EffectError>>,
{
    let mut pause = first;
    let mut warned = false;
    loop {
        match call().await {
            Ok(value) => {
                if warned {
                    tracing::info!("side effect done after all: the service answers again");
                }
                return Ok(value);
            }
            Err(EffectError::Failed(error) | EffectError::Refused(error)) => return Err(error),
            // A blip is retried quietly; an outage is said once, when the
            // pauses reach their longest, so that a step that waits on a
            // service that is down shows in the log.
            Err(EffectError::Transient(error)) if pause == longest && !warned => {
                let every = chorus_runtime::time::humanize(longest);
                tracing::warn!(%error, "a service a step needs does not answer; the step waits, trying every {every}");
                warned = true;
                tokio::time::sleep(pause).await;
            }
            Err(EffectError::Transient(error)) => {
                tracing::debug!(%error, "side effect failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(longest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_transient_failure_is_tried_again_with_growing_pauses_until_it_passes() {
        let calls = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let (first, longest) = (Duration::from_millis(10), Duration::from_millis(40));
        let outcome = retrying_with(first, longest, || {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            async move { if call < 5 { Err(EffectError::Transient("down".into())) } else { Ok(call) } }
        })
        .await;
        assert_eq!(outcome, Ok(5), "tried until it passed, past the longest pause");
        // 10 + 20 + 40 ms, then the longest pause twice more.
        assert!(started.elapsed() >= Duration::from_millis(150), "{:?}", started.elapsed());
        let failed = retrying(|| async { Err::<(), _>(EffectError::Failed("no such agent".into())) }).await;
        assert_eq!(failed, Err("no such agent".to_owned()), "a lasting failure is not tried again");
    }
}
