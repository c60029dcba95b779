//! `chorus run cancel`: one run, several, or every unfinished run of a
//! workflow.

use chorus_proto::workflow::{self as pb, CancelRunRequest, GetRunRequest, workflow_client::WorkflowClient};
use chorus_runtime::transport::Transport;
use tokio::task::JoinSet;

use super::{Failure, Outcome, Target, runs, view};

type Client = WorkflowClient<Transport>;

/// How many cancels a bulk cancel has in flight at once.
const AT_ONCE: usize = 8;

/// What to cancel, and why.
pub(super) struct Cancel {
    pub(super) run_ids: Vec<String>,
    /// Every unfinished run of this workflow (in `states`, when given).
    pub(super) workflow: Option<String>,
    pub(super) states: Vec<String>,
    pub(super) reason: String,
}

/// Cancels the runs named, or those of a workflow; exit 1 when a run named
/// had completed or failed (a run of a workflow that finished meanwhile is
/// passed over).
pub(super) async fn cancel(client: &mut Client, target: &Target, cancel: Cancel) -> Outcome {
    let Cancel { run_ids, workflow, states, reason } = cancel;
    let Some(workflow) = workflow else {
        if run_ids.is_empty() {
            return Err(Failure::Call("name the runs to cancel, or a --workflow whose runs to cancel".into()));
        }
        let mut refused = false;
        for run_id in &run_ids {
            refused |= !one(client, target, run_id, &reason).await?;
        }
        return if refused { Err(Failure::No) } else { Ok(()) };
    };
    if !run_ids.is_empty() {
        return Err(Failure::Call("name runs or a --workflow, not both".into()));
    }
    let unfinished = ["pending", "running", "waiting"].map(str::to_owned);
    let states = runs::states_in(if states.is_empty() { &unfinished } else { &states })?;
    let (found, _) = runs::runs_of(client, target, Some(&workflow), &states, usize::MAX).await?;
    super::definitions::check_known(client, target, Some(workflow.clone()), found.is_empty()).await?;
    let mut calls = JoinSet::new();
    let (mut canceled, mut passed) = (0_usize, 0_usize);
    for run in found {
        if calls.len() >= AT_ONCE {
            tally(calls.join_next().await, &mut canceled, &mut passed)?;
        }
        let request = cancel_request(target, &run.id, &reason);
        let mut client = client.clone();
        calls.spawn(async move { client.cancel_run(request).await.map(tonic::Response::into_inner) });
    }
    while let Some(joined) = calls.join_next().await {
        tally(Some(joined), &mut canceled, &mut passed)?;
    }
    eprintln!("canceled {canceled} runs of {workflow}{}", passed_over(passed));
    Ok(())
}

fn passed_over(passed: usize) -> String {
    if passed == 0 { String::new() } else { format!(" ({passed} had finished meanwhile)") }
}

/// Counts one bulk cancel's answer, printing the run it canceled.
fn tally(
    joined: Option<Result<Result<pb::Run, tonic::Status>, tokio::task::JoinError>>,
    canceled: &mut usize,
    passed: &mut usize,
) -> Result<(), Failure> {
    match joined {
        Some(Ok(Ok(run))) => {
            outln!("{} {}", run.id, view::run_state(run.state()));
            *canceled += 1;
        }
        Some(Ok(Err(status))) if status.code() == tonic::Code::FailedPrecondition => *passed += 1,
        Some(Ok(Err(status))) => return Err(status.into()),
        Some(Err(error)) => return Err(Failure::Call(format!("a cancel did not finish: {error}"))),
        None => {}
    }
    Ok(())
}

fn cancel_request(target: &Target, run_id: &str, reason: &str) -> CancelRunRequest {
    CancelRunRequest {
        namespace: target.namespace.clone(),
        run_id: run_id.to_owned(),
        reason: reason.to_owned(),
        canceled_by: view::user(),
    }
}

/// Cancels one run; whether it ended canceled. A run canceled already (a
/// retry of a cancel whose answer was lost) is what was asked; one that had
/// ended otherwise is not.
async fn one(client: &mut Client, target: &Target, run_id: &str, reason: &str) -> Result<bool, Failure> {
    let status = match client.cancel_run(cancel_request(target, run_id, reason)).await {
        Ok(run) => {
            let run = run.into_inner();
            outln!("{} {}", run.id, view::run_state(run.state()));
            return Ok(true);
        }
        Err(status) if status.code() == tonic::Code::FailedPrecondition => status,
        Err(status) => return Err(status.into()),
    };
    let get = GetRunRequest { namespace: target.namespace.clone(), run_id: run_id.to_owned(), wait_finished: false };
    let run = client.get_run(get).await?.into_inner();
    if run.state() == pb::RunState::Canceled {
        outln!("{} {} (already)", run.id, view::run_state(run.state()));
        return Ok(true);
    }
    eprintln!("{}", status.message());
    Ok(false)
}
