//! Who is calling, and which namespace (A2A tenant) a request acts in.
//!
//! A tenant is `namespace` or `namespace/agent`. Credentials come from
//! config, each scoped to namespaces; with none configured every request is
//! let in (a local `chorus dev`).

use std::{collections::HashMap, sync::Arc};

use chorus_runtime::server::{Admission, NamespaceCheck};
use sha2::{Digest as _, Sha256};

use crate::{
    config::{AuthConfig, Credential},
    error::{GatewayError, Result},
};

/// An authenticated caller.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    /// `None`: every namespace.
    namespaces: Option<Vec<String>>,
    /// The credential's name; `None` when the gateway checks none.
    pub(crate) caller: Option<String>,
}

/// Where a request acts: a namespace, and an agent when the tenant names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scope {
    pub(crate) namespace: String,
    pub(crate) agent: Option<String>,
    /// The name of the credential the request came with, if one was asked for.
    pub(crate) caller: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Authenticator {
    api_key_header: String,
    /// (SHA-256 of the secret, credential): compared in constant time.
    api_keys: Vec<([u8; 32], Credential)>,
    bearer_tokens: Vec<([u8; 32], Credential)>,
    default_namespace: String,
    /// The namespaces requests may act in; `None`: any.
    served: Option<Vec<String>>,
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Equal digests, compared without an early exit.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authenticator {
    /// Checks `config`'s credentials for requests acting in `namespaces`
    /// (`["*"]`: any; none listed: the default namespace and those the
    /// credentials name).
    pub(crate) fn new(config: &AuthConfig, default_namespace: &str, namespaces: &[String]) -> Self {
        let hashed = |credentials: &[Credential]| {
            credentials.iter().map(|credential| (digest(&credential.secret), credential.clone())).collect()
        };
        let named = config.api_keys.iter().chain(&config.bearer_tokens).flat_map(|key| &key.namespaces);
        let mut served: Vec<String> = match namespaces {
            [] => std::iter::once(default_namespace).chain(named.map(String::as_str)).map(str::to_owned).collect(),
            listed => listed.to_vec(),
        };
        served.retain(|namespace| namespace != "*");
        served.sort();
        served.dedup();
        let any = namespaces.iter().any(|namespace| namespace == "*");
        Self {
            api_key_header: config.api_key_header.to_ascii_lowercase(),
            api_keys: hashed(&config.api_keys),
            bearer_tokens: hashed(&config.bearer_tokens),
            default_namespace: default_namespace.to_owned(),
            served: (!any).then_some(served),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.api_keys.is_empty() || !self.bearer_tokens.is_empty()
    }

    /// The caller `lookup` (a header by lower-case name) identifies.
    pub(crate) fn authenticate<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> Result<Principal> {
        if !self.enabled() {
            return Ok(Principal { namespaces: None, caller: None });
        }
        // The scheme's name is case-insensitive (RFC 9110 §11.1).
        let bearer = lookup("authorization")
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| (token.trim(), &self.bearer_tokens));
        let api_key = lookup(&self.api_key_header).map(|key| (key.trim(), &self.api_keys));
        for (secret, known) in bearer.into_iter().chain(api_key) {
            let presented = digest(secret);
            if let Some((_, credential)) = known.iter().find(|(hash, _)| same(hash, &presented)) {
                tracing::debug!(caller = %credential.name, "authenticated");
                let all = credential.namespaces.iter().any(|namespace| namespace == "*");
                let namespaces = (!all).then(|| credential.namespaces.clone());
                return Ok(Principal { namespaces, caller: Some(credential.name.clone()) });
            }
        }
        Err(GatewayError::Unauthenticated)
    }

    /// What a call to chorus's own gRPC services with `headers` may do: act
    /// in the namespaces its credential is scoped to.
    pub(crate) fn admit(&self, headers: &http::HeaderMap) -> std::result::Result<Admission, tonic::Status> {
        let principal = self
            .authenticate(|name| headers.get(name).and_then(|value| value.to_str().ok()))
            .map_err(|_| OperatorRefusal::Unauthenticated)?;
        let namespaces = principal.namespaces.map(|granted| {
            let caller = principal.caller.clone().unwrap_or_default();
            let check: NamespaceCheck = Arc::new(move |named: Option<&str>| match named {
                None => Err(OperatorRefusal::NotEveryNamespace.into()),
                Some(named) if granted.iter().any(|namespace| namespace == named) => Ok(()),
                Some(named) => {
                    Err(OperatorRefusal::NotGranted { caller: caller.clone(), namespace: named.to_owned() }.into())
                }
            });
            check
        });
        Ok(Admission { caller: principal.caller, namespaces })
    }

    /// The scope of a request by `principal` naming `tenant` (empty: none).
    /// Without a tenant: the caller's only namespace, else the default one.
    pub(crate) fn scope(&self, principal: &Principal, tenant: &str) -> Result<Scope> {
        let (namespace, agent) = match tenant.split_once('/') {
            Some((namespace, agent)) => (namespace, Some(agent.to_owned())),
            None => (tenant, None),
        };
        let namespace = match (namespace, &principal.namespaces) {
            ("", Some(only)) if only.len() == 1 => only[0].clone(),
            ("", _) => self.default_namespace.clone(),
            (named, _) => chorus_runtime::validate::namespace(named)
                .map_err(|_| GatewayError::InvalidParams(format!("tenant {tenant:?} is not a valid namespace")))?,
        };
        if let Some(allowed) = &principal.namespaces
            && !allowed.contains(&namespace)
        {
            return Err(GatewayError::PermissionDenied(namespace));
        }
        // A tenant no one serves would queue tasks that no worker takes.
        if let Some(served) = &self.served
            && !served.contains(&namespace)
        {
            return Err(GatewayError::NamespaceNotFound { namespace, served: served.join(", ") });
        }
        Ok(Scope { namespace, agent, caller: principal.caller.clone() })
    }
}

/// Why chorus's own gRPC services refuse a call under the gateway's
/// credentials; a status with its `google.rpc.ErrorInfo` in the gateway's
/// domain.
pub(crate) enum OperatorRefusal {
    Unauthenticated,
    /// A method that acts across namespaces, for a credential scoped to some.
    NotEveryNamespace,
    /// A request naming a namespace the credential is not scoped to.
    NotGranted {
        caller: String,
        namespace: String,
    },
}

impl From<OperatorRefusal> for tonic::Status {
    fn from(refusal: OperatorRefusal) -> Self {
        use tonic_types::StatusExt as _;
        let mut metadata = HashMap::new();
        let (code, reason, message) = match refusal {
            OperatorRefusal::Unauthenticated => (
                tonic::Code::Unauthenticated,
                "UNAUTHENTICATED",
                "missing or invalid credentials: chorus's gRPC services take an API key or a bearer token the \
                 gateway knows"
                    .to_owned(),
            ),
            OperatorRefusal::NotEveryNamespace => (
                tonic::Code::PermissionDenied,
                "NAMESPACE_NOT_GRANTED",
                "this method acts across namespaces: it takes a credential for every namespace \
                 (namespaces = [\"*\"])"
                    .to_owned(),
            ),
            OperatorRefusal::NotGranted { caller, namespace } => {
                let message = format!("credential {caller} is not granted namespace {namespace}");
                metadata.insert("namespace".to_owned(), namespace);
                (tonic::Code::PermissionDenied, "NAMESPACE_NOT_GRANTED", message)
            }
        };
        let details = tonic_types::ErrorDetails::with_error_info(reason, "gateway.chorus.dev", metadata);
        tonic::Status::with_error_details(code, message, details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed_config() -> AuthConfig {
        let credential = |name: &str, secret: &str, namespaces: &[&str]| Credential {
            name: name.to_owned(),
            secret: secret.to_owned(),
            namespaces: namespaces.iter().map(|namespace| (*namespace).to_owned()).collect(),
        };
        AuthConfig {
            api_key_header: "X-API-Key".to_owned(),
            api_keys: vec![credential("team-a", "key-a", &["team-a"])],
            bearer_tokens: vec![credential("ops", "token-ops", &["*"])],
        }
    }

    /// Team A's key and an operator's token, in any namespace.
    fn authenticator() -> Authenticator {
        Authenticator::new(&keyed_config(), "default", &["*".to_owned()])
    }

    #[test]
    fn credentials_are_checked_and_scoped() {
        let auth = authenticator();
        assert!(matches!(auth.authenticate(|_| None), Err(GatewayError::Unauthenticated)));
        let wrong = auth.authenticate(|name| (name == "authorization").then_some("Bearer nope"));
        assert!(matches!(wrong, Err(GatewayError::Unauthenticated)));
        let team = auth.authenticate(|name| (name == "x-api-key").then_some("key-a")).expect("api key");
        assert_eq!(auth.scope(&team, "").expect("own namespace").namespace, "team-a");
        assert!(matches!(auth.scope(&team, "team-b"), Err(GatewayError::PermissionDenied(_))));
        let ops = auth.authenticate(|name| (name == "authorization").then_some("Bearer token-ops")).expect("bearer");
        assert_eq!(auth.scope(&ops, "").expect("default").namespace, "default");
        let scope = auth.scope(&ops, "team-b/tck").expect("any namespace");
        let caller = Some("ops".into());
        assert_eq!(scope, Scope { namespace: "team-b".into(), agent: Some("tck".into()), caller });
        assert!(matches!(auth.scope(&ops, "Bad Tenant"), Err(GatewayError::InvalidParams(_))));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let auth = authenticator();
        for header in ["Bearer token-ops", "bearer token-ops", "BEARER token-ops", "Bearer  token-ops "] {
            let principal = auth.authenticate(|name| (name == "authorization").then_some(header));
            assert!(principal.is_ok_and(|principal| principal.namespaces.is_none()), "{header:?}");
        }
        assert!(auth.authenticate(|name| (name == "authorization").then_some("Basic token-ops")).is_err());
        let team = auth.authenticate(|name| (name == "x-api-key").then_some("key-a")).expect("api key");
        assert_eq!(team.namespaces, Some(vec!["team-a".to_owned()]));
    }

    #[test]
    fn without_credentials_configured_everyone_is_let_in() {
        let auth = Authenticator::new(&AuthConfig::default(), "default", &[]);
        let principal = auth.authenticate(|_| None).expect("open");
        assert_eq!(auth.scope(&principal, "").expect("scope").namespace, "default");
    }

    #[test]
    fn a_tenant_names_a_namespace_the_gateway_serves() {
        let open = Authenticator::new(&AuthConfig::default(), "default", &[]);
        let anyone = open.authenticate(|_| None).expect("open");
        assert_eq!(open.scope(&anyone, "default/echo").expect("the default namespace").namespace, "default");
        // A 0.3 REST client's `/v1/...` reads as tenant v1.
        let Err(GatewayError::NamespaceNotFound { namespace, served }) = open.scope(&anyone, "v1") else {
            panic!("a namespace no one serves");
        };
        assert_eq!((namespace.as_str(), served.as_str()), ("v1", "default"));

        let mut keyed = authenticator();
        keyed.served = Authenticator::new(&keyed_config(), "default", &[]).served;
        let ops = keyed.authenticate(|name| (name == "authorization").then_some("Bearer token-ops")).expect("ops");
        assert_eq!(keyed.scope(&ops, "team-a").expect("a credential's namespace is served").namespace, "team-a");
        assert!(matches!(keyed.scope(&ops, "team-b"), Err(GatewayError::NamespaceNotFound { .. })));
        let team = keyed.authenticate(|name| (name == "x-api-key").then_some("key-a")).expect("api key");
        let denied = keyed.scope(&team, "team-b");
        assert!(matches!(denied, Err(GatewayError::PermissionDenied(_))), "not told whether it exists: {denied:?}");

        let listed = Authenticator::new(&AuthConfig::default(), "default", &["team-c".to_owned()]);
        assert!(listed.scope(&anyone, "team-c").is_ok());
        assert!(listed.scope(&anyone, "").is_err(), "listed, the namespaces are those alone");
    }
}
