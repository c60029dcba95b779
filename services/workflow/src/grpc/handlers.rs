//! The gRPC handlers: validate and convert the request, call the service,
//! convert the answer. No logic of their own.

use chorus_proto::workflow::{self as pb, workflow_server::WorkflowServer};
use chorus_runtime::{
    grpc::namespace,
    validate::{self, FieldViolation},
};
use tonic::{Request, Response, Status};

use super::convert::{definition_out, problem_out, token_in, token_out};
use crate::{domain::has_errors, service::Workflows};

const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 100;
/// The largest definition source accepted.
const MAX_SOURCE_BYTES: usize = 1 << 20;

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

/// Runs are the next slice of the engine; their RPCs say so plainly.
fn runs_not_built() -> Status {
    Status::unimplemented("workflow runs are not built yet: only definitions are served")
}

fn source(value: &str) -> Result<&str, FieldViolation> {
    match value.len() {
        0 => Err(FieldViolation::required("source")),
        len if len > MAX_SOURCE_BYTES => {
            Err(FieldViolation::new("source", format!("must be at most {MAX_SOURCE_BYTES} bytes")))
        }
        _ => Ok(value),
    }
}

fn file(value: &str) -> &str {
    if value.is_empty() { "<source>" } else { value }
}

fn page_size(value: u32) -> Result<u32, FieldViolation> {
    match value {
        0 => Ok(DEFAULT_PAGE),
        value if value <= MAX_PAGE => Ok(value),
        _ => Err(FieldViolation::new("page_size", format!("must be at most {MAX_PAGE}"))),
    }
}

#[tonic::async_trait]
impl pb::workflow_server::Workflow for WorkflowGrpc {
    async fn put_definition(
        &self,
        request: Request<pb::PutDefinitionRequest>,
    ) -> Result<Response<pb::PutDefinitionResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let source = source(&request.source)?;
        let outcome = self.workflows.put(&namespace, source, file(&request.file), &request.created_by).await?;
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
        let limit = page_size(request.page_size)?;
        let after = token_in(&request.page_token)?;
        let page = self.workflows.list(&namespace, name.as_deref(), request.include_source, after, limit).await?;
        Ok(Response::new(pb::ListDefinitionsResponse {
            definitions: page.definitions.into_iter().map(definition_out).collect(),
            next_page_token: page.next.map(token_out).unwrap_or_default(),
        }))
    }

    async fn start_run(&self, _request: Request<pb::StartRunRequest>) -> Result<Response<pb::Run>, Status> {
        Err(runs_not_built())
    }

    async fn get_run(&self, _request: Request<pb::GetRunRequest>) -> Result<Response<pb::Run>, Status> {
        Err(runs_not_built())
    }

    async fn list_runs(
        &self,
        _request: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        Err(runs_not_built())
    }

    async fn cancel_run(&self, _request: Request<pb::CancelRunRequest>) -> Result<Response<pb::Run>, Status> {
        Err(runs_not_built())
    }

    async fn signal_run(
        &self,
        _request: Request<pb::SignalRunRequest>,
    ) -> Result<Response<pb::SignalRunResponse>, Status> {
        Err(runs_not_built())
    }

    async fn decide_gate(&self, _request: Request<pb::DecideGateRequest>) -> Result<Response<pb::Run>, Status> {
        Err(runs_not_built())
    }

    type WatchRunStream = chorus_runtime::grpc::ResponseStream<pb::RunEvent>;

    async fn watch_run(
        &self,
        _request: Request<pb::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        Err(runs_not_built())
    }
}
