//! Gateway settings (`[gateway]` in `chorus.toml`) and the agent catalog.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::push::PushPolicy;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// The base URL external agents reach this gateway at, advertised in
    /// agent cards (`https://agents.example.com`). Unset: `http://` and the
    /// address the server is bound to.
    pub public_url: Option<String>,
    /// The agent `/.well-known/agent-card.json` describes.
    pub default_agent: String,
    /// The namespace of a request that names no tenant and whose credential
    /// is not scoped to exactly one namespace.
    pub default_namespace: String,
    /// The namespaces a request's tenant may name; `["*"]`: any. None listed:
    /// the default namespace and those the credentials name. A tenant that
    /// names another is not found, rather than queue tasks no worker takes.
    pub namespaces: Vec<String>,
    /// The task store (`http://host:port`). Unset: this process's own.
    pub taskstore_url: Option<String>,
    /// The workflow service `workflow` agents start runs on. Unset: this process's own.
    pub workflow_url: Option<String>,
    /// Largest accepted HTTP request body (JSON-RPC and REST).
    pub max_body_bytes: usize,
    /// How long a blocking `SendMessage` waits for the task to finish or
    /// need input before answering with the task as it is (at most an hour).
    pub blocking_timeout_ms: u64,
    /// How often an SSE stream sends a keep-alive comment.
    pub keep_alive_ms: u64,
    /// Where the registry of the agents this gateway serves is written at
    /// start-up (JSON). Unset: not written.
    pub registry_file: Option<PathBuf>,
    /// A YAML file of agents (`agents: [...]`), read in addition to `agents`.
    pub agents_file: Option<PathBuf>,
    /// The catalog. Empty (and no `agents_file`): the built-in agents.
    pub agents: Vec<AgentConfig>,
    pub auth: AuthConfig,
    pub push: PushPolicy,
    pub delegate: DelegateConfig,
    /// Origins whose web pages may call the gRPC services (grpc-web) and open
    /// the ACP WebSocket; `["*"]` allows any. None by default: a page on any
    /// site could otherwise drive a chorus that checks no credentials.
    pub cors_origins: Vec<String>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            public_url: None,
            default_agent: "echo".to_owned(),
            default_namespace: "default".to_owned(),
            namespaces: Vec::new(),
            taskstore_url: None,
            workflow_url: None,
            max_body_bytes: 1024 * 1024,
            blocking_timeout_ms: 60_000,
            keep_alive_ms: 15_000,
            registry_file: None,
            agents_file: None,
            agents: Vec::new(),
            auth: AuthConfig::default(),
            push: PushPolicy::default(),
            delegate: DelegateConfig::default(),
            cors_origins: Vec::new(),
        }
    }
}

/// Outbound delegation to external A2A agents (the `Delegate` call and
/// `remote` agents).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DelegateConfig {
    /// Call agents at loopback, private, link-local and other non-public
    /// addresses (development and single-network deployments only). The
    /// gateway's own addresses are always allowed.
    pub allow_private: bool,
    /// Hosts exempt from the address check, matched exactly and
    /// case-insensitively against a URL's host.
    pub allowed_hosts: Vec<String>,
    /// How long a delegation may take when the caller gives no timeout.
    pub timeout_ms: u64,
    /// How long a fetched agent card is reused.
    pub card_ttl_ms: u64,
    /// Polling of agents that do not stream: first interval, then doubling
    /// up to the maximum.
    pub poll_initial_ms: u64,
    pub poll_max_ms: u64,
}

impl Default for DelegateConfig {
    fn default() -> Self {
        Self {
            allow_private: false,
            allowed_hosts: Vec::new(),
            timeout_ms: 300_000,
            card_ttl_ms: 60_000,
            poll_initial_ms: 250,
            poll_max_ms: 5_000,
        }
    }
}

/// Who serves an agent's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// Task-store workers claim its tasks.
    Worker,
    /// An external A2A agent this gateway proxies (`url`).
    Remote,
    /// Code inside chorus (`echo`, `tck`).
    Builtin,
    /// A workflow: a message starts a run of `workflow` (default: the id),
    /// whose progress is the task's status; a HITL gate is `input-required`.
    Workflow,
}

impl AgentKind {
    /// The gateway runs the agent's turns itself: its tasks are created run
    /// by their creator, and no worker claims them.
    pub fn runs_in_gateway(self) -> bool {
        self != Self::Worker
    }
}

/// One agent of the catalog, in the spirit of an `agents.yaml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The id in URLs and in the task store (`[a-z0-9-_.]`).
    pub id: String,
    pub name: String,
    pub description: String,
    pub kind: AgentKind,
    /// For `remote` agents: the agent's base URL (its card is read there).
    #[serde(default)]
    pub url: Option<String>,
    /// For `remote` agents: the environment variable holding the bearer
    /// token sent to it (the file names the variable, never the secret).
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// For `remote` agents: the environment variable holding the API key
    /// sent to it, in the header `api_key_header` (default `X-API-Key`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub api_key_header: Option<String>,
    /// For `workflow` agents: the workflow definition's name (default: the id).
    #[serde(default)]
    pub workflow: Option<String>,
    #[serde(default = "default_version")]
    pub version: String,
    #[serde(default)]
    pub skills: Vec<SkillConfig>,
    #[serde(default = "default_modes")]
    pub input_modes: Vec<String>,
    #[serde(default = "default_modes")]
    pub output_modes: Vec<String>,
    #[serde(default = "default_true")]
    pub streaming: bool,
}

/// One skill of an agent's card.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillConfig {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub examples: Vec<String>,
}

/// The agents file: `agents: [...]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentsFile {
    pub(crate) agents: Vec<AgentConfig>,
}

fn default_version() -> String {
    "1.0.0".to_owned()
}

fn default_modes() -> Vec<String> {
    vec!["text/plain".to_owned(), "application/json".to_owned()]
}

fn default_true() -> bool {
    true
}

/// Credentials accepted by the gateway. With none configured, requests are
/// not authenticated (a local `chorus dev`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The header API keys travel in.
    pub api_key_header: String,
    pub api_keys: Vec<Credential>,
    /// Tokens accepted as `Authorization: Bearer <token>`.
    pub bearer_tokens: Vec<Credential>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self { api_key_header: "X-API-Key".to_owned(), api_keys: Vec::new(), bearer_tokens: Vec::new() }
    }
}

impl AuthConfig {
    /// Whether any credential is configured.
    pub fn enabled(&self) -> bool {
        !self.api_keys.is_empty() || !self.bearer_tokens.is_empty()
    }

    /// Refuses credentials that could never be presented as written (an
    /// empty secret, one with spaces around it, a namespace no request can
    /// name) or that would let anyone in.
    pub(crate) fn check(&self) -> Result<(), String> {
        if http::HeaderName::from_bytes(self.api_key_header.as_bytes()).is_err() {
            return Err(format!("gateway.auth.api_key_header {:?} is not a header name", self.api_key_header));
        }
        let listed = [("api_keys", &self.api_keys), ("bearer_tokens", &self.bearer_tokens)];
        for (list, credentials) in listed {
            let mut secrets = std::collections::HashSet::new();
            if let Some(twice) = credentials.iter().find(|credential| !secrets.insert(credential.secret.as_str())) {
                return Err(format!(
                    "gateway.auth.{list} {:?}: another credential has the same secret, so only one of them could be used",
                    twice.name
                ));
            }
            for credential in credentials.iter() {
                let at = format!("gateway.auth.{list} {:?}", credential.name);
                if credential.secret.trim().is_empty() {
                    return Err(format!("{at}: the secret must not be empty"));
                }
                if credential.secret.trim() != credential.secret || credential.secret.contains(['\r', '\n']) {
                    return Err(format!("{at}: the secret must not start or end with spaces or hold line breaks"));
                }
                if !credential.secret.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
                    return Err(format!("{at}: the secret must be printable ASCII, as HTTP headers carry it"));
                }
                if credential.namespaces.is_empty() {
                    return Err(format!("{at}: namespaces must list at least one namespace, or \"*\" for all"));
                }
                for namespace in credential.namespaces.iter().filter(|namespace| *namespace != "*") {
                    if let Err(violation) = chorus_runtime::validate::namespace(namespace) {
                        return Err(format!("{at}: namespace {namespace:?} {}", violation.reason));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A secret and the namespaces it may act in (`*` for all).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// Who holds it, for logs.
    pub name: String,
    pub secret: String,
    pub namespaces: Vec<String>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("name", &self.name).field("namespaces", &self.namespaces).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_key(secret: &str, namespaces: &[&str]) -> AuthConfig {
        let namespaces = namespaces.iter().map(|namespace| (*namespace).to_owned()).collect();
        let key = Credential { name: "k".to_owned(), secret: secret.to_owned(), namespaces };
        AuthConfig { api_keys: vec![key], ..AuthConfig::default() }
    }

    #[test]
    fn credentials_that_could_never_be_presented_are_refused() {
        assert!(with_key("s3cret", &["team-a", "*"]).check().is_ok());
        let refused = [
            (with_key("", &["team-a"]), "must not be empty"),
            (with_key("  ", &["team-a"]), "must not be empty"),
            (with_key(" s3cret", &["team-a"]), "spaces"),
            (with_key("s3\ncret", &["team-a"]), "line breaks"),
            (with_key("s3cret", &[]), "at least one namespace"),
            (with_key("s3cret", &["Team-A"]), "\"Team-A\""),
            (with_key("pässwörd", &["team-a"]), "printable ASCII"),
        ];
        for (config, expected) in refused {
            let error = config.check().expect_err(expected);
            assert!(error.contains(expected) && error.contains("gateway.auth.api_keys \"k\""), "{error}");
        }
        let mut twice = with_key("s3cret", &["team-a"]);
        twice.api_keys.push(Credential {
            name: "ops".to_owned(),
            secret: "s3cret".to_owned(),
            namespaces: vec!["*".to_owned()],
        });
        assert!(twice.check().expect_err("one secret, two credentials").contains("same secret"));
        let header = AuthConfig { api_key_header: "x key".to_owned(), ..AuthConfig::default() };
        assert!(header.check().is_err());
    }
}
