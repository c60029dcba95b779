//! An in-memory task store that records the worker's calls and lets a test
//! drive each claim stream.

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use chorus_proto::taskstore::{
    task_store_server::{TaskStore, TaskStoreServer},
    *,
};
use futures_util::Stream;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

type Sender<T> = mpsc::UnboundedSender<T>;
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A call the worker made.
#[derive(Debug)]
pub(super) enum Call {
    Claim(ClaimTasksRequest),
    Renew(RenewLeaseRequest),
    Complete(CompleteTaskRequest),
    Fail(FailTaskRequest),
    Status(UpdateStatusRequest),
}

/// What the test controls and observes.
pub(super) struct Fake {
    pub(super) url: String,
    /// One sender per opened claim stream: send to hand out tasks, drop to end the stream.
    pub(super) streams: mpsc::UnboundedReceiver<Sender<Result<ClaimedTask, Status>>>,
    pub(super) calls: mpsc::UnboundedReceiver<Call>,
    pub(super) state: Arc<State>,
    stop: CancellationToken,
}

#[derive(Default)]
pub(super) struct State {
    /// Renewals answer `canceled`.
    pub(super) cancel_on_renew: AtomicBool,
    /// ClaimTasks fails with this status instead of opening a stream.
    pub(super) refuse_claims: Mutex<Option<Status>>,
    /// The `traceparent` of every call about a task, in call order.
    pub(super) traceparents: Mutex<Vec<String>>,
}

struct Store {
    streams: Sender<Sender<Result<ClaimedTask, Status>>>,
    calls: Sender<Call>,
    state: Arc<State>,
}

impl Fake {
    pub(super) async fn start() -> Self {
        let listener =
            tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("bind a local port");
        let addr = listener.local_addr().expect("bound address");
        let (streams_tx, streams) = mpsc::unbounded_channel();
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let state = Arc::new(State::default());
        let store = Store { streams: streams_tx, calls: calls_tx, state: Arc::clone(&state) };
        let stop = CancellationToken::new();
        let serving =
            tonic::transport::Server::builder().add_service(TaskStoreServer::new(store)).serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                stop.clone().cancelled_owned(),
            );
        tokio::spawn(serving);
        Self { url: format!("http://{addr}"), streams, calls, state, stop }
    }

    pub(super) async fn next_stream(&mut self) -> Sender<Result<ClaimedTask, Status>> {
        self.streams.recv().await.expect("a claim stream")
    }

    /// The next call other than a renewal.
    pub(super) async fn next_call(&mut self) -> Call {
        loop {
            match self.calls.recv().await.expect("a call") {
                Call::Renew(_) => {}
                call => return call,
            }
        }
    }

    pub(super) async fn next_renewal(&mut self) -> RenewLeaseRequest {
        loop {
            if let Call::Renew(request) = self.calls.recv().await.expect("a call") {
                return request;
            }
        }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Store {
    async fn record<T>(&self, request: &Request<T>) {
        let traceparent = request.metadata().get("traceparent");
        let traceparent = traceparent.and_then(|value| value.to_str().ok());
        let traceparent = traceparent.unwrap_or_default().to_owned();
        self.state.traceparents.lock().await.push(traceparent);
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not faked"))
}

fn task_reply(calls: &Sender<Call>, call: Call, task_id: &str) -> Result<Response<Task>, Status> {
    let _ = calls.send(call);
    Ok(Response::new(Task { id: task_id.to_owned(), ..Task::default() }))
}

#[tonic::async_trait]
impl TaskStore for Store {
    type ClaimTasksStream = BoxStream<ClaimedTask>;
    type WatchTaskStream = BoxStream<TaskEvent>;
    type WatchTasksStream = BoxStream<TaskEvent>;

    async fn claim_tasks(
        &self,
        request: Request<ClaimTasksRequest>,
    ) -> Result<Response<Self::ClaimTasksStream>, Status> {
        let _ = self.calls.send(Call::Claim(request.into_inner()));
        if let Some(status) = self.state.refuse_claims.lock().await.clone() {
            return Err(status);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = self.streams.send(tx);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn renew_lease(&self, request: Request<RenewLeaseRequest>) -> Result<Response<RenewLeaseResponse>, Status> {
        self.record(&request).await;
        let _ = self.calls.send(Call::Renew(request.into_inner()));
        let canceled = self.state.cancel_on_renew.load(Ordering::SeqCst);
        Ok(Response::new(RenewLeaseResponse { canceled, ..RenewLeaseResponse::default() }))
    }

    async fn complete_task(&self, request: Request<CompleteTaskRequest>) -> Result<Response<Task>, Status> {
        self.record(&request).await;
        let request = request.into_inner();
        let id = request.task_id.clone();
        task_reply(&self.calls, Call::Complete(request), &id)
    }

    async fn fail_task(&self, request: Request<FailTaskRequest>) -> Result<Response<Task>, Status> {
        self.record(&request).await;
        let request = request.into_inner();
        let id = request.task_id.clone();
        task_reply(&self.calls, Call::Fail(request), &id)
    }

    async fn update_status(&self, request: Request<UpdateStatusRequest>) -> Result<Response<Task>, Status> {
        self.record(&request).await;
        let request = request.into_inner();
        let id = request.task_id.clone();
        task_reply(&self.calls, Call::Status(request), &id)
    }

    async fn create_task(&self, _: Request<CreateTaskRequest>) -> Result<Response<Task>, Status> {
        unimplemented()
    }
    async fn get_task(&self, _: Request<GetTaskRequest>) -> Result<Response<Task>, Status> {
        unimplemented()
    }
    async fn list_tasks(&self, _: Request<ListTasksRequest>) -> Result<Response<ListTasksResponse>, Status> {
        unimplemented()
    }
    async fn add_message(&self, _: Request<AddMessageRequest>) -> Result<Response<Task>, Status> {
        unimplemented()
    }
    async fn append_artifact(&self, _: Request<AppendArtifactRequest>) -> Result<Response<Task>, Status> {
        unimplemented()
    }
    async fn cancel_task(&self, _: Request<CancelTaskRequest>) -> Result<Response<CancelTaskResponse>, Status> {
        unimplemented()
    }
    async fn watch_task(&self, _: Request<WatchTaskRequest>) -> Result<Response<Self::WatchTaskStream>, Status> {
        unimplemented()
    }
    async fn watch_tasks(&self, _: Request<WatchTasksRequest>) -> Result<Response<Self::WatchTasksStream>, Status> {
        unimplemented()
    }
    async fn spawn_subtask(&self, _: Request<SpawnSubtaskRequest>) -> Result<Response<SpawnSubtaskResponse>, Status> {
        unimplemented()
    }
    async fn await_subtasks(
        &self,
        _: Request<AwaitSubtasksRequest>,
    ) -> Result<Response<AwaitSubtasksResponse>, Status> {
        unimplemented()
    }
    async fn notify_owner(&self, _: Request<NotifyOwnerRequest>) -> Result<Response<InboxMessage>, Status> {
        unimplemented()
    }
    async fn answer_question(&self, _: Request<AnswerQuestionRequest>) -> Result<Response<Task>, Status> {
        unimplemented()
    }
    async fn read_inbox(&self, _: Request<ReadInboxRequest>) -> Result<Response<ReadInboxResponse>, Status> {
        unimplemented()
    }
    async fn create_push_config(&self, _: Request<CreatePushConfigRequest>) -> Result<Response<PushConfig>, Status> {
        unimplemented()
    }
    async fn get_push_config(&self, _: Request<GetPushConfigRequest>) -> Result<Response<PushConfig>, Status> {
        unimplemented()
    }
    async fn list_push_configs(
        &self,
        _: Request<ListPushConfigsRequest>,
    ) -> Result<Response<ListPushConfigsResponse>, Status> {
        unimplemented()
    }
    async fn delete_push_config(
        &self,
        _: Request<DeletePushConfigRequest>,
    ) -> Result<Response<DeletePushConfigResponse>, Status> {
        unimplemented()
    }
}
