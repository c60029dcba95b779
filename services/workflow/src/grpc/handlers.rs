//! The gRPC handlers: validate and convert the request, call the service,
//! convert the answer. No logic of their own.

use chorus_proto::workflow::{self as pb, workflow_server::WorkflowServer};
use chorus_runtime::{
    grpc::{namespace, stream_of},
    server::Caller,
    time::timestamp_micros,
    validate::{self, FieldViolation},
};
use tonic::{Request, Response, Status};

use super::{
    convert::{definition_out, problem_out, token_in, token_out},
    run_convert::{
        cursor_in, decision_in, event_out, object_in, origin_in, run_out, run_token_in, run_token_out, state_in,
    },
};
use crate::{
    domain::{Decision, RunFilter, has_errors},
    service::{GateCall, SignalCall, StartCall, Workflows},
};

const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 100;
/// The largest definition source accepted.
const MAX_SOURCE_BYTES: usize = 1 << 20;
/// The longest reason a workflow is disabled for.
const MAX_REASON_BYTES: usize = 4096;

/// The `chorus.workflow.v1.Workflow` service over [`Workflows`].
#[derive(Debug, Clone)]
pub struct WorkflowGrpc {
    workflows: Workflows,
}

impl WorkflowGrpc {
    pub fn new(workflows: Workflows) -> Self {
        Self { workflows }
    }

    /// The tonic server, accepting requests up to `max_message_bytes`.
    pub fn into_server(self, max_message_bytes: usize) -> WorkflowServer<Self> {
        WorkflowServer::new(self).max_decoding_message_size(max_message_bytes)
    }
}

/// A definition's source, of any size up to the limit: an empty one (an
/// empty file) is an invalid definition, reported as such by validation.
fn source(value: &str) -> Result<&str, FieldViolation> {
    if value.len() > MAX_SOURCE_BYTES {
        return Err(FieldViolation::new("source", format!("must be at most {MAX_SOURCE_BYTES} bytes")));
    }
    Ok(value)
}

fn file(value: &str) -> &str {
    if value.is_empty() { "<source>" } else { value }
}

#[tonic::async_trait]
impl pb::workflow_server::Workflow for WorkflowGrpc {
    async fn put_definition(
        &self,
        request: Request<pb::PutDefinitionRequest>,
    ) -> Result<Response<pb::PutDefinitionResponse>, Status> {
        let (_, extensions, request) = request.into_parts();
        let namespace = namespace(&request.namespace)?;
        let source = source(&request.source)?;
        let created_by = Caller::attest(&extensions, &request.created_by);
        let outcome = self.workflows.put(&namespace, source, file(&request.file), &created_by).await?;
        Ok(Response::new(pb::PutDefinitionResponse {
            definition: Some(definition_out(outcome.put.definition)),
            unchanged: outcome.put.unchanged,
            warnings: outcome.warnings.into_iter().map(problem_out).collect(),
        }))
    }

    async fn validate_definition(
        &self,
        request: Request<pb::ValidateDefinitionRequest>,
    ) -> Result<Response<pb::ValidateDefinitionResponse>, Status> {
        let request = request.into_inner();
        namespace(&request.namespace)?;
        let parsed = self.workflows.validate(source(&request.source)?, file(&request.file));
        Ok(Response::new(pb::ValidateDefinitionResponse {
            valid: !has_errors(&parsed.problems),
            problems: parsed.problems.into_iter().map(problem_out).collect(),
            name: parsed.name.unwrap_or_default(),
        }))
    }

    async fn get_definition(
        &self,
        request: Request<pb::GetDefinitionRequest>,
    ) -> Result<Response<pb::Definition>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let name = validate::id("name", &request.name)?;
        let version = (request.version != 0).then_some(request.version);
        let definition = self.workflows.get(&namespace, &name, version).await?;
        Ok(Response::new(definition_out(definition)))
    }

    async fn list_definitions(
        &self,
        request: Request<pb::ListDefinitionsRequest>,
    ) -> Result<Response<pb::ListDefinitionsResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let name = validate::optional_id("name", &request.name)?;
        let limit = validate::count("page_size", request.page_size, DEFAULT_PAGE, MAX_PAGE)?;
        let after = token_in(&request.page_token)?;
        let page = self.workflows.list(&namespace, name.as_deref(), request.include_source, after, limit).await?;
        Ok(Response::new(pb::ListDefinitionsResponse {
            definitions: page.definitions.into_iter().map(definition_out).collect(),
            next_page_token: page.next.map(token_out).unwrap_or_default(),
        }))
    }

    async fn disable_workflow(
        &self,
        request: Request<pb::DisableWorkflowRequest>,
    ) -> Result<Response<pb::Definition>, Status> {
        let (_, extensions, request) = request.into_parts();
        let namespace = namespace(&request.namespace)?;
        let name = validate::id("name", &request.name)?;
        if request.reason.len() > MAX_REASON_BYTES {
            return Err(FieldViolation::new("reason", format!("must be at most {MAX_REASON_BYTES} bytes")).into());
        }
        let disabled_by = Caller::attest(&extensions, &request.disabled_by);
        let definition = self.workflows.disable(&namespace, &name, &disabled_by, &request.reason).await?;
        Ok(Response::new(definition_out(definition)))
    }

    async fn enable_workflow(
        &self,
        request: Request<pb::EnableWorkflowRequest>,
    ) -> Result<Response<pb::Definition>, Status> {
        let (_, extensions, request) = request.into_parts();
        let namespace = namespace(&request.namespace)?;
        let name = validate::id("name", &request.name)?;
        let enabled_by = Caller::attest(&extensions, &request.enabled_by);
        let definition = self.workflows.enable(&namespace, &name, &enabled_by).await?;
        Ok(Response::new(definition_out(definition)))
    }

    async fn start_run(&self, request: Request<pb::StartRunRequest>) -> Result<Response<pb::Run>, Status> {
        let (_, extensions, request) = request.into_parts();
        let mut origin = origin_in(request.origin);
        origin.started_by = Caller::attest(&extensions, &origin.started_by);
        let call = StartCall {
            namespace: namespace(&request.namespace)?,
            workflow: validate::id("workflow", &request.workflow)?,
            version: (request.version != 0).then_some(request.version),
            input: object_in("input", request.input)?,
            idempotency_key: validate::optional_id("idempotency_key", &request.idempotency_key)?,
            origin,
            trigger: serde_json::Value::Null,
            while_disabled: request.while_disabled,
        };
        let run = self.workflows.start_run(call).await?;
        Ok(Response::new(run_out(run)))
    }

    async fn get_run(&self, request: Request<pb::GetRunRequest>) -> Result<Response<pb::Run>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let run_id = validate::id("run_id", &request.run_id)?;
        let run = if request.wait_finished {
            self.workflows.finished_run(&namespace, &run_id).await?
        } else {
            self.workflows.get_run(&namespace, &run_id).await?
        };
        Ok(Response::new(run_out(run)))
    }

    async fn list_runs(&self, request: Request<pb::ListRunsRequest>) -> Result<Response<pb::ListRunsResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let filter = RunFilter {
            workflow: validate::optional_id("workflow", &request.workflow)?,
            version: (request.version != 0).then_some(request.version),
            states: request.states.iter().map(|state| state_in("states", *state)).collect::<Result<_, _>>()?,
            created_after: timestamp_micros("created_after", request.created_after)?,
            include_steps: request.include_steps,
        };
        let limit = validate::count("page_size", request.page_size, DEFAULT_PAGE, MAX_PAGE)?;
        let after = run_token_in(&request.page_token)?;
        let page = self.workflows.list_runs(&namespace, &filter, after, limit).await?;
        Ok(Response::new(pb::ListRunsResponse {
            runs: page.runs.into_iter().map(run_out).collect(),
            next_page_token: page.next.map(run_token_out).unwrap_or_default(),
        }))
    }

    async fn cancel_run(&self, request: Request<pb::CancelRunRequest>) -> Result<Response<pb::Run>, Status> {
        let (_, extensions, request) = request.into_parts();
        let namespace = namespace(&request.namespace)?;
        let run_id = validate::id("run_id", &request.run_id)?;
        let canceled_by = Caller::attest(&extensions, &request.canceled_by);
        let run = self.workflows.cancel_run(&namespace, &run_id, &request.reason, &canceled_by).await?;
        Ok(Response::new(run_out(run)))
    }

    async fn signal_run(
        &self,
        request: Request<pb::SignalRunRequest>,
    ) -> Result<Response<pb::SignalRunResponse>, Status> {
        let (_, extensions, request) = request.into_parts();
        let namespace = namespace(&request.namespace)?;
        let run_id = validate::id("run_id", &request.run_id)?;
        let signal_id = match validate::optional_id("signal_id", &request.signal_id)? {
            Some(id) => id,
            None => uuid::Uuid::now_v7().to_string(),
        };
        let call = SignalCall {
            name: validate::id("name", &request.name)?,
            payload: object_in("payload", request.payload)?,
            signal_id: signal_id.clone(),
            sent_by: Caller::attest(&extensions, &request.sent_by),
        };
        let duplicate = self.workflows.signal_run(&namespace, &run_id, call).await?;
        Ok(Response::new(pb::SignalRunResponse { signal_id, duplicate }))
    }

    async fn decide_gate(&self, request: Request<pb::DecideGateRequest>) -> Result<Response<pb::Run>, Status> {
        let (_, extensions, request) = request.into_parts();
        let namespace = namespace(&request.namespace)?;
        let run_id = validate::id("run_id", &request.run_id)?;
        let decision = decision_in(request.decision)?;
        if decision == Decision::Reject && request.reason.trim().is_empty() {
            return Err(FieldViolation::new("reason", "is required to reject: it is the feedback").into());
        }
        let call = GateCall {
            step_id: validate::id("step_id", &request.step_id)?,
            decision,
            decided_by: Caller::attest(&extensions, &validate::id("decided_by", &request.decided_by)?),
            reason: request.reason,
            data: object_in("data", request.data)?,
            iteration: request.iteration,
        };
        let (run, _) = self.workflows.decide_gate(&namespace, &run_id, call).await?;
        Ok(Response::new(run_out(run)))
    }

    type WatchRunStream = chorus_runtime::grpc::ResponseStream<pb::RunEvent>;

    async fn watch_run(&self, request: Request<pb::WatchRunRequest>) -> Result<Response<Self::WatchRunStream>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let run_id = validate::id("run_id", &request.run_id)?;
        let after = cursor_in(&request.after_cursor)?;
        let events = self.workflows.watch_run(&namespace, &run_id, after).await?;
        Ok(Response::new(stream_of(events, event_out)))
    }
}
