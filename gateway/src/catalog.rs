//! The agent catalog and each agent's A2A 1.0 Agent Card.
//!
//! Every agent lives under `{base}/a2a/{id}`: JSON-RPC there, HTTP+JSON under
//! `{base}/a2a/{id}/rest`, its card at `{base}/a2a/{id}/.well-known/agent-card.json`.
//! gRPC has one endpoint per host; an agent other than the default one is
//! addressed there through the `tenant` its card's gRPC interface carries.

use std::collections::{BTreeMap, HashMap};

use a2a::{
    AgentCapabilities, AgentCard, AgentInterface, AgentProvider, AgentSkill, ApiKeySecurityScheme,
    HttpAuthSecurityScheme, SecurityScheme,
};
use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::config::{AgentConfig, AgentKind, AgentsFile, AuthConfig, GatewayConfig, SkillConfig};

/// The built-in agents' ids.
pub(crate) const ECHO: &str = "echo";
pub(crate) const TCK: &str = "tck";

/// A card, serialized once, with its cache validators.
#[derive(Debug, Clone)]
pub(crate) struct CardEntry {
    pub(crate) card: AgentCard,
    pub(crate) json: Bytes,
    pub(crate) etag: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Catalog {
    agents: BTreeMap<String, AgentConfig>,
    cards: BTreeMap<String, CardEntry>,
    default_agent: String,
    default_namespace: String,
    /// `Last-Modified` of every card: when this process built them.
    pub(crate) last_modified: String,
}

impl Catalog {
    /// The catalog `config` describes, with cards for `base_url`
    /// (`http://host:port`, no trailing slash).
    pub(crate) fn new(config: &GatewayConfig, base_url: &str) -> Result<Self, String> {
        let mut configured = config.agents.clone();
        if let Some(path) = &config.agents_file {
            let text =
                std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            let file: AgentsFile =
                serde_norway::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))?;
            configured.extend(file.agents);
        }
        if configured.is_empty() {
            configured = builtin_agents();
        }
        let mut agents = BTreeMap::new();
        for agent in configured {
            validate(&agent)?;
            if agents.insert(agent.id.clone(), agent.clone()).is_some() {
                return Err(format!("agent {:?} is listed twice", agent.id));
            }
        }
        if !agents.contains_key(&config.default_agent) {
            return Err(format!("gateway.default_agent {:?} is not in the catalog", config.default_agent));
        }
        let cards = agents
            .values()
            .map(|agent| {
                let (namespace, default) = (&config.default_namespace, &config.default_agent);
                let tenant = grpc_tenant_of(namespace, default, namespace, &agent.id);
                let card = card(agent, base_url, tenant, &config.auth);
                (agent.id.clone(), entry(card))
            })
            .collect();
        let last_modified = chrono::Utc::now().format("%a, %d %b %Y %H:%M:%S GMT").to_string();
        Ok(Self {
            agents,
            cards,
            default_agent: config.default_agent.clone(),
            default_namespace: config.default_namespace.clone(),
            last_modified,
        })
    }

    /// `agent`'s card as a caller acting in `namespace` uses it: its gRPC
    /// interface names that namespace's tenant (the public card names the
    /// default namespace's, which a credential for another cannot use).
    pub(crate) fn card_in(&self, namespace: &str, agent: &str) -> Option<AgentCard> {
        let mut card = self.cards.get(agent)?.card.clone();
        let tenant = grpc_tenant_of(&self.default_namespace, &self.default_agent, namespace, agent);
        let grpc = card.supported_interfaces.iter_mut().filter(|i| i.protocol_binding == a2a::TRANSPORT_PROTOCOL_GRPC);
        for interface in grpc {
            interface.tenant.clone_from(&tenant);
        }
        Some(card)
    }

    /// The ids of the agents of `kind`.
    pub(crate) fn ids_of(&self, kind: AgentKind) -> Vec<&str> {
        self.agents.values().filter(|agent| agent.kind == kind).map(|agent| agent.id.as_str()).collect()
    }

    pub(crate) fn agent(&self, id: &str) -> Option<&AgentConfig> {
        self.agents.get(id)
    }

    pub(crate) fn default_agent(&self) -> &AgentConfig {
        &self.agents[&self.default_agent]
    }

    pub(crate) fn card(&self, id: &str) -> Option<&CardEntry> {
        self.cards.get(id)
    }

    pub(crate) fn cards(&self) -> impl Iterator<Item = &CardEntry> {
        self.cards.values()
    }

    /// The registry of the running agents (seed 002): id, kind and card URL.
    pub(crate) fn registry(&self, base_url: &str) -> Value {
        let agents: Vec<Value> = self
            .agents
            .values()
            .map(|agent| {
                json!({
                    "id": agent.id,
                    "name": agent.name,
                    "kind": agent.kind,
                    "url": format!("{base_url}/a2a/{}", agent.id),
                    "card": format!("{base_url}/a2a/{}/.well-known/agent-card.json", agent.id),
                })
            })
            .collect();
        json!({ "gateway": base_url, "defaultAgent": self.default_agent, "agents": agents })
    }
}

fn validate(agent: &AgentConfig) -> Result<(), String> {
    chorus_runtime::validate::id("agents.id", &agent.id).map_err(|violation| violation.to_string())?;
    if !agent.id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c)) {
        return Err(format!("agent id {:?} may only hold a-z, 0-9, '-', '_' and '.'", agent.id));
    }
    let credentials = [("bearer_token_env", &agent.bearer_token_env), ("api_key_env", &agent.api_key_env)];
    let named: Vec<(&str, &String)> =
        credentials.into_iter().filter_map(|(field, variable)| Some((field, variable.as_ref()?))).collect();
    if agent.kind != AgentKind::Remote && (!named.is_empty() || agent.api_key_header.is_some()) {
        return Err(format!("agent {:?}: credentials are for remote agents only", agent.id));
    }
    if named.len() > 1 {
        return Err(format!("agent {:?}: set bearer_token_env or api_key_env, not both", agent.id));
    }
    if let Some((field, variable)) = named.first()
        && std::env::var(variable).map_or(true, |value| value.is_empty())
    {
        return Err(format!("agent {:?}: the environment variable {variable} ({field}) is not set", agent.id));
    }
    match agent.kind {
        AgentKind::Remote if agent.url.is_none() => Err(format!("remote agent {:?} needs a url", agent.id)),
        AgentKind::Builtin if agent.id != TCK => {
            Err(format!("there is no built-in agent {:?} (built-in: {TCK}; {ECHO} is a worker)", agent.id))
        }
        AgentKind::Worker | AgentKind::Remote | AgentKind::Builtin | AgentKind::Workflow => Ok(()),
    }
}

/// The catalog when none is configured: the echo worker and the TCK agent.
fn builtin_agents() -> Vec<AgentConfig> {
    let skill = |id: &str, name: &str, description: &str, examples: &[&str]| SkillConfig {
        id: id.to_owned(),
        name: name.to_owned(),
        description: description.to_owned(),
        tags: vec![id.to_owned()],
        examples: examples.iter().map(|example| (*example).to_owned()).collect(),
    };
    let modes = vec!["text/plain".to_owned(), "application/json".to_owned()];
    vec![
        AgentConfig {
            id: ECHO.to_owned(),
            name: "Echo".to_owned(),
            description: "Answers every message with its own text, as a message and an artifact.".to_owned(),
            kind: AgentKind::Worker,
            url: None,
            bearer_token_env: None,
            api_key_env: None,
            api_key_header: None,
            workflow: None,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            skills: vec![skill(ECHO, "Echo", "Echoes text back", &["hello"])],
            input_modes: modes.clone(),
            output_modes: modes.clone(),
            streaming: true,
        },
        AgentConfig {
            id: TCK.to_owned(),
            name: "A2A TCK agent".to_owned(),
            description: "Behaves as the A2A conformance kit's scenarios ask, by messageId prefix.".to_owned(),
            kind: AgentKind::Builtin,
            url: None,
            bearer_token_env: None,
            api_key_env: None,
            api_key_header: None,
            workflow: None,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            skills: vec![skill(
                TCK,
                "TCK conformance",
                "Handles TCK conformance test messages",
                &["tck-complete-task"],
            )],
            input_modes: modes.clone(),
            output_modes: modes,
            streaming: true,
        },
    ]
}

/// The `tenant` a gRPC call to `agent` acting in `namespace` names: the
/// namespace and the agent, either left out where it is the default.
fn grpc_tenant_of(default_namespace: &str, default_agent: &str, namespace: &str, agent: &str) -> Option<String> {
    match (namespace == default_namespace, agent == default_agent) {
        (true, true) => None,
        (false, true) => Some(namespace.to_owned()),
        (_, false) => Some(format!("{namespace}/{agent}")),
    }
}

/// Where a gRPC client dials the gateway that `base_url` names: its host
/// and port (the scheme's when the URL has none). A gRPC target has no path,
/// so one that a proxy puts before the gateway's URLs is left out.
fn grpc_target(base_url: &str) -> String {
    let Ok(url) = reqwest::Url::parse(base_url) else {
        return base_url.split_once("://").map_or(base_url, |(_, rest)| rest).to_owned();
    };
    let host = url.host_str().unwrap_or_default();
    match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// The card's skills: those configured or, where none are, one for the
/// agent as a whole. A2A requires at least one, and a tag on each: a skill
/// configured without tags is tagged with its id.
fn card_skills(agent: &AgentConfig) -> Vec<AgentSkill> {
    let whole = || SkillConfig {
        id: agent.id.clone(),
        name: agent.name.clone(),
        description: agent.description.clone(),
        tags: Vec::new(),
        examples: Vec::new(),
    };
    let skills = if agent.skills.is_empty() { vec![whole()] } else { agent.skills.clone() };
    skills
        .into_iter()
        .map(|skill| AgentSkill {
            tags: if skill.tags.is_empty() { vec![skill.id.clone()] } else { skill.tags },
            examples: (!skill.examples.is_empty()).then_some(skill.examples),
            id: skill.id,
            name: skill.name,
            description: skill.description,
            input_modes: None,
            output_modes: None,
            security_requirements: None,
        })
        .collect()
}

fn card(agent: &AgentConfig, base_url: &str, grpc_tenant: Option<String>, auth: &AuthConfig) -> AgentCard {
    let url = format!("{base_url}/a2a/{}", agent.id);
    let interface = |url: String, binding: &str| AgentInterface {
        url,
        protocol_binding: binding.to_owned(),
        protocol_version: a2a::VERSION.to_owned(),
        tenant: None,
    };
    let mut grpc = interface(grpc_target(base_url), a2a::TRANSPORT_PROTOCOL_GRPC);
    grpc.tenant = grpc_tenant;
    let (security_schemes, security_requirements) = security(auth);
    AgentCard {
        name: agent.name.clone(),
        description: agent.description.clone(),
        version: agent.version.clone(),
        supported_interfaces: vec![
            interface(url.clone(), a2a::TRANSPORT_PROTOCOL_JSONRPC),
            interface(format!("{url}/rest"), a2a::TRANSPORT_PROTOCOL_HTTP_JSON),
            grpc,
        ],
        capabilities: AgentCapabilities {
            streaming: Some(agent.streaming),
            push_notifications: Some(true),
            extensions: None,
            extended_agent_card: Some(auth.enabled()),
        },
        default_input_modes: agent.input_modes.clone(),
        default_output_modes: agent.output_modes.clone(),
        skills: card_skills(agent),
        provider: Some(AgentProvider {
            organization: "chorus".to_owned(),
            url: "https://github.com/chorus-fabric/chorus".to_owned(),
        }),
        documentation_url: None,
        icon_url: None,
        security_schemes,
        security_requirements,
        signatures: None,
    }
}

/// The schemes in force and the requirement that any one of them suffices.
type Security = (Option<HashMap<String, SecurityScheme>>, Option<Vec<a2a::SecurityRequirement>>);

fn security(auth: &AuthConfig) -> Security {
    let mut schemes = HashMap::new();
    if !auth.api_keys.is_empty() {
        schemes.insert(
            "apiKey".to_owned(),
            SecurityScheme::ApiKey(ApiKeySecurityScheme {
                location: "header".to_owned(),
                name: auth.api_key_header.clone(),
                description: Some("An API key scoped to namespaces".to_owned()),
            }),
        );
    }
    if !auth.bearer_tokens.is_empty() {
        schemes.insert(
            "bearer".to_owned(),
            SecurityScheme::HttpAuth(HttpAuthSecurityScheme {
                scheme: "bearer".to_owned(),
                description: Some("A bearer token scoped to namespaces".to_owned()),
                bearer_format: None,
            }),
        );
    }
    if schemes.is_empty() {
        return (None, None);
    }
    let requirements = schemes.keys().map(|name| HashMap::from([(name.clone(), Vec::new())])).collect();
    (Some(schemes), Some(requirements))
}

fn entry(card: AgentCard) -> CardEntry {
    let json = Bytes::from(serde_json::to_vec(&card).expect("an agent card serializes"));
    let etag = format!("\"{:x}\"", Sha256::digest(&json));
    CardEntry { card, json, etag }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// deploy/agents.yaml, the catalog docker-compose.yml gives its gateway.
    #[test]
    fn the_compose_stack_s_catalog_loads_and_names_example_workflows() {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let config = GatewayConfig { agents_file: Some(repo.join("deploy/agents.yaml")), ..GatewayConfig::default() };
        let catalog = Catalog::new(&config, "http://localhost:7803").expect("deploy/agents.yaml is a catalog");
        assert!(catalog.agent(TCK).is_none(), "the conformance kit's agent stays off a user's stack");
        assert_eq!(catalog.default_agent().id, ECHO);
        let workflows = catalog.ids_of(AgentKind::Workflow);
        assert_eq!(workflows, ["delivery", "deploy"]);
        let examples: String = std::fs::read_dir(repo.join("workflows"))
            .expect("workflows/")
            .map(|entry| std::fs::read_to_string(entry.expect("an entry").path()).expect("a definition"))
            .collect();
        for id in workflows {
            let workflow = catalog.agent(id).and_then(|agent| agent.workflow.clone()).expect("a workflow");
            assert!(examples.contains(&format!("\nname: {workflow}\n")), "no example workflow {workflow}");
        }
    }

    #[test]
    fn every_agent_card_lists_all_three_bindings() {
        let catalog = Catalog::new(&GatewayConfig::default(), "http://127.0.0.1:7800").expect("default catalog");
        let card = &catalog.card(TCK).expect("tck card").card;
        let urls: Vec<(&str, &str)> =
            card.supported_interfaces.iter().map(|i| (i.protocol_binding.as_str(), i.url.as_str())).collect();
        assert_eq!(
            urls,
            [
                ("JSONRPC", "http://127.0.0.1:7800/a2a/tck"),
                ("HTTP+JSON", "http://127.0.0.1:7800/a2a/tck/rest"),
                ("GRPC", "127.0.0.1:7800"),
            ]
        );
        assert_eq!(card.supported_interfaces[2].tenant.as_deref(), Some("default/tck"));
        let default = &catalog.card(ECHO).expect("echo card").card;
        assert_eq!(default.supported_interfaces[2].tenant, None, "the default agent needs no tenant");
    }

    #[test]
    fn the_grpc_interface_is_the_public_url_s_host_and_port() {
        let grpc = |public: &str| {
            let catalog = Catalog::new(&GatewayConfig::default(), public).expect("catalog");
            catalog.card(ECHO).expect("echo card").card.supported_interfaces[2].url.clone()
        };
        assert_eq!(grpc("https://agents.example.com/base"), "agents.example.com:443", "a proxy's path is left out");
        assert_eq!(grpc("http://agents.example.com"), "agents.example.com:80");
        assert_eq!(grpc("http://[::1]:7800"), "[::1]:7800");
        let catalog = Catalog::new(&GatewayConfig::default(), "https://agents.example.com/base").expect("catalog");
        let jsonrpc = &catalog.card(ECHO).expect("echo card").card.supported_interfaces[0].url;
        assert_eq!(jsonrpc, "https://agents.example.com/base/a2a/echo", "the other bindings keep it");
    }

    #[test]
    fn every_card_has_a_skill_and_every_skill_a_tag() {
        let mut plain = builtin_agents().remove(0);
        plain.id = "plain".to_owned();
        plain.skills.clear();
        let mut untagged = plain.clone();
        untagged.id = "untagged".to_owned();
        untagged.skills = vec![SkillConfig {
            id: "sum".to_owned(),
            name: "Sum".to_owned(),
            description: "Adds numbers".to_owned(),
            tags: Vec::new(),
            examples: Vec::new(),
        }];
        let config =
            GatewayConfig { agents: vec![plain, untagged], default_agent: "plain".into(), ..Default::default() };
        let catalog = Catalog::new(&config, "http://h").expect("catalog");
        let skills = |id: &str| catalog.card(id).expect("card").card.skills.clone();
        let whole = &skills("plain")[0];
        assert_eq!((whole.id.as_str(), whole.tags.as_slice()), ("plain", ["plain".to_owned()].as_slice()));
        assert!(whole.description.starts_with("Answers every message"), "the agent's own description");
        assert_eq!(skills("untagged")[0].tags, ["sum"]);
    }

    #[test]
    fn a_bad_catalog_is_refused() {
        let config = GatewayConfig { default_agent: "nobody".to_owned(), ..GatewayConfig::default() };
        assert!(Catalog::new(&config, "http://h").unwrap_err().contains("nobody"));
        let mut remote = builtin_agents().remove(0);
        remote.kind = AgentKind::Remote;
        let config = GatewayConfig { agents: vec![remote], ..GatewayConfig::default() };
        assert!(Catalog::new(&config, "http://h").unwrap_err().contains("needs a url"));
    }

    #[test]
    fn a_remote_agent_s_credentials_name_a_variable_that_is_set() {
        let refused = |agent: AgentConfig| {
            let config = GatewayConfig { agents: vec![agent], ..GatewayConfig::default() };
            Catalog::new(&config, "http://h").unwrap_err()
        };
        let mut remote = builtin_agents().remove(0);
        remote.kind = AgentKind::Remote;
        remote.url = Some("https://agents.example.com".into());
        remote.bearer_token_env = Some("CHORUS_TEST_NO_SUCH_VARIABLE".into());
        let missing = refused(remote.clone());
        assert!(missing.contains("CHORUS_TEST_NO_SUCH_VARIABLE (bearer_token_env) is not set"), "{missing}");
        remote.api_key_env = Some("PATH".into());
        assert!(refused(remote.clone()).contains("not both"));
        let mut worker = builtin_agents().remove(0);
        worker.api_key_env = Some("PATH".into());
        assert!(refused(worker).contains("remote agents only"));
        remote.bearer_token_env = None;
        let config = GatewayConfig { agents: vec![remote], default_agent: "echo".into(), ..GatewayConfig::default() };
        Catalog::new(&config, "http://h").expect("PATH is set");
    }

    #[test]
    fn cards_declare_the_schemes_in_force() {
        let mut config = GatewayConfig::default();
        config.auth.bearer_tokens.push(crate::config::Credential {
            name: "ci".into(),
            secret: "s".into(),
            namespaces: vec!["*".into()],
        });
        let catalog = Catalog::new(&config, "http://h").expect("catalog");
        let json: Value = serde_json::from_slice(&catalog.card(ECHO).expect("card").json).expect("json");
        assert_eq!(json["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"], "bearer");
        assert_eq!(json["securityRequirements"][0]["schemes"]["bearer"], json!({"list": []}));
        assert_eq!(json["capabilities"]["extendedAgentCard"], true);
    }
}
