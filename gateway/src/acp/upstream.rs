//! The bridge's side towards chorus: one agent behind the gateway's A2A API,
//! reached with the outbound A2A client, and the credentials it is called with.

use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use a2a::{
    AgentCard, CancelTaskRequest, GetTaskRequest, ListTasksRequest, ListTasksResponse, SendMessageRequest,
    StreamResponse, SubscribeToTaskRequest, Task,
};
use futures_util::Stream;
use tokio::sync::OnceCell;

use super::error::{AcpError, Result};
use crate::delegate::{A2aClient, Credentials, DelegateError, Endpoint, pick_interface};

/// The environment variable a token may come from.
pub const TOKEN_ENV: &str = "CHORUS_TOKEN";

/// Where the bridge's credentials for the gateway come from.
#[derive(Debug, Clone)]
pub(crate) enum TokenSource {
    /// Credentials handed over once (the WebSocket endpoint: the connection's own).
    Fixed(Option<Credentials>),
    /// `--token-file`, else `CHORUS_TOKEN`, as a bearer token; read again by `authenticate`.
    FileOrEnv(Option<PathBuf>),
}

/// The bearer token in `file`, else in `CHORUS_TOKEN`, trimmed; none when
/// neither holds one. What every `chorus` command that calls a server
/// presents.
pub fn bearer_token(file: Option<&std::path::Path>) -> std::io::Result<Option<String>> {
    let token = match file {
        Some(path) => std::fs::read_to_string(path)?,
        None => std::env::var(TOKEN_ENV).unwrap_or_default(),
    };
    let token = token.trim();
    Ok((!token.is_empty()).then(|| token.to_owned()))
}

impl TokenSource {
    /// The credentials, if there are any; an unreadable file is an error.
    fn read(&self) -> Result<Option<Credentials>> {
        let file = match self {
            Self::Fixed(credentials) => return Ok(credentials.clone()),
            Self::FileOrEnv(file) => file.as_deref(),
        };
        let from = || match file {
            Some(path) => format!("the token file {}", path.display()),
            None => TOKEN_ENV.to_owned(),
        };
        let token = bearer_token(file)
            .map_err(|error| AcpError::AuthRequired(format!("{} cannot be read: {error}", from())))?;
        if token.as_ref().is_some_and(|token| token.chars().any(char::is_control)) {
            return Err(AcpError::AuthRequired(format!(
                "the token in {} holds a line break or another control character, which no header can carry",
                from()
            )));
        }
        Ok(token.map(Credentials::Bearer))
    }
}

/// One agent behind the gateway. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    inner: Arc<Inner>,
    /// How long a turn whose gateway went away waits for it to come back.
    gateway_wait: Duration,
}

/// How long a turn waits for its gateway by default: a restart or a deploy.
const GATEWAY_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Inner {
    client: A2aClient,
    http: reqwest::Client,
    /// The gateway's base URL (`http://host:port`).
    gateway: String,
    agent: String,
    card: OnceCell<(AgentCard, Endpoint)>,
    tokens: TokenSource,
    credentials: RwLock<Option<Credentials>>,
    /// Why the token could not be read, when it could not: what a refusal
    /// of the bridge's missing credentials then names.
    token_problem: RwLock<Option<String>>,
}

impl Upstream {
    /// The agent `agent` of the gateway at `gateway`; its card is read on first use.
    pub(crate) fn new(http: reqwest::Client, gateway: &str, agent: &str, tokens: TokenSource) -> Self {
        let (credentials, token_problem) = match tokens.read() {
            Ok(credentials) => (credentials, None),
            Err(error) => {
                tracing::warn!(%error, "no gateway token until authenticate");
                (None, Some(error.to_string()))
            }
        };
        let inner = Inner {
            client: A2aClient::new(http.clone()),
            http,
            gateway: gateway.trim_end_matches('/').to_owned(),
            agent: agent.to_owned(),
            card: OnceCell::new(),
            tokens,
            credentials: RwLock::new(credentials),
            token_problem: RwLock::new(token_problem),
        };
        Self { inner: Arc::new(inner), gateway_wait: GATEWAY_WAIT }
    }

    /// The same, waiting `wait` for a gateway that went away mid-turn.
    pub(crate) fn with_gateway_wait(self, wait: Duration) -> Self {
        Self { gateway_wait: wait, ..self }
    }

    pub(crate) fn gateway_wait(&self) -> Duration {
        self.gateway_wait
    }

    /// The agent's id.
    pub(crate) fn agent(&self) -> &str {
        &self.inner.agent
    }

    /// The agent's card and the interface chosen from it.
    async fn card(&self) -> Result<&(AgentCard, Endpoint)> {
        let fetch = || async {
            let url = format!("{}/a2a/{}", self.inner.gateway, self.inner.agent);
            let card = self.inner.client.fetch_card(&url).await?;
            let endpoint = pick_interface(&card)?;
            Ok::<_, DelegateError>((card, endpoint))
        };
        self.inner.card.get_or_try_init(fetch).await.map_err(|error| match error {
            DelegateError::Status { status: 404, .. } => {
                AcpError::UnknownAgent { agent: self.inner.agent.clone(), gateway: self.inner.gateway.clone() }
            }
            other => other.into(),
        })
    }

    async fn endpoint(&self) -> Result<Endpoint> {
        Ok(self.card().await?.1.clone())
    }

    /// Whether the agent's card asks for credentials.
    pub(crate) async fn needs_token(&self) -> Result<bool> {
        let (card, _) = self.card().await?;
        Ok(card.security_requirements.as_ref().is_some_and(|requirements| !requirements.is_empty()))
    }

    fn credentials(&self) -> Option<Credentials> {
        self.inner.credentials.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// `authenticate`: reads the token again and checks the gateway takes it.
    pub(crate) async fn authenticate(&self) -> Result<()> {
        let read = self.inner.tokens.read();
        *self.inner.token_problem.write().unwrap_or_else(PoisonError::into_inner) =
            read.as_ref().err().map(ToString::to_string);
        *self.inner.credentials.write().unwrap_or_else(PoisonError::into_inner) = read?;
        self.check_access().await
    }

    /// Fails with [`AcpError::AuthRequired`] unless the gateway lets the
    /// bridge's credentials in (an authenticated `ListTasks` of one task).
    pub(crate) async fn check_access(&self) -> Result<()> {
        self.card().await?;
        let url = format!("{}/a2a/{}/rest/tasks?pageSize=1", self.inner.gateway, self.inner.agent);
        let mut request = self.inner.http.get(&url).header(a2a::SVC_PARAM_VERSION, a2a::VERSION);
        request = match self.credentials() {
            Some(Credentials::Bearer(token)) => request.bearer_auth(token),
            Some(Credentials::ApiKey { header, value }) => request.header(header, value),
            None => request,
        };
        let response = request.send().await.map_err(|source| DelegateError::Http { url: url.clone(), source })?;
        match response.status().as_u16() {
            // A token for several namespaces, none of them the default one:
            // the bridge names no tenant, so it acts in the default one.
            403 => {
                let body: serde_json::Value = response.json().await.unwrap_or_default();
                let reason = body["error"]["message"].as_str().unwrap_or("access denied").to_owned();
                Err(AcpError::AuthRequired(format!(
                    "the gateway took the token but refused agent {}: {reason}; a token for several namespaces \
                     acts in the gateway's default namespace, so it must include it (or name one namespace only)",
                    self.agent()
                )))
            }
            401 => Err(AcpError::AuthRequired(match self.credentials() {
                Some(_) => {
                    format!("the gateway refused the token for agent {}; fix it and authenticate again", self.agent())
                }
                None => match self.inner.token_problem.read().unwrap_or_else(PoisonError::into_inner).as_deref() {
                    Some(problem) => {
                        format!(
                            "the gateway at {} needs a token, and {problem}; fix it, then authenticate",
                            self.inner.gateway
                        )
                    }
                    None => format!(
                        "the gateway at {} needs a token: give chorus acp --token-file or set {TOKEN_ENV}, then \
                         authenticate",
                        self.inner.gateway
                    ),
                },
            })),
            _ => Ok(()),
        }
    }

    /// `SendStreamingMessage`: the task's events until it settles.
    pub(crate) async fn stream(
        &self,
        request: SendMessageRequest,
    ) -> Result<impl Stream<Item = Result<StreamResponse, DelegateError>> + Send + 'static> {
        let endpoint = self.endpoint().await?;
        Ok(self.inner.client.stream(&endpoint, request, self.credentials().as_ref()))
    }

    /// `SubscribeToTask`: the task as it is, then its events until it settles.
    pub(crate) async fn subscribe(
        &self,
        task_id: &str,
    ) -> Result<impl Stream<Item = Result<StreamResponse, DelegateError>> + Send + 'static> {
        let endpoint = self.endpoint().await?;
        let request = SubscribeToTaskRequest { id: task_id.to_owned(), tenant: None };
        Ok(self.inner.client.subscribe(&endpoint, request, self.credentials().as_ref()))
    }

    /// `GetTask`, its history whole.
    pub(crate) async fn get(&self, task_id: &str) -> Result<Task> {
        let endpoint = self.endpoint().await?;
        let request = GetTaskRequest { id: task_id.to_owned(), history_length: None, tenant: None };
        Ok(self.inner.client.get_task(&endpoint, request, self.credentials().as_ref()).await?)
    }

    /// `CancelTask`.
    pub(crate) async fn cancel(&self, task_id: &str) -> Result<Task> {
        let endpoint = self.endpoint().await?;
        let request = CancelTaskRequest { id: task_id.to_owned(), metadata: None, tenant: None };
        Ok(self.inner.client.cancel_task(&endpoint, request, self.credentials().as_ref()).await?)
    }

    /// One page of `ListTasks`.
    pub(crate) async fn list(&self, request: ListTasksRequest) -> Result<ListTasksResponse> {
        let endpoint = self.endpoint().await?;
        Ok(self.inner.client.list_tasks(&endpoint, request, self.credentials().as_ref()).await?)
    }
}
