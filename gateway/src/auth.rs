//! Who is calling, and which namespace (A2A tenant) a request acts in.
//!
//! A tenant is `namespace` or `namespace/agent`. Credentials come from
//! config, each scoped to namespaces; with none configured every request is
//! let in (a local `chorus dev`).

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
    caller: Option<String>,
}

impl Principal {
    /// Whether the caller may act in every namespace, as chorus's own gRPC
    /// services (which act in whatever namespace a request names) require.
    pub(crate) fn every_namespace(&self) -> bool {
        self.namespaces.is_none()
    }
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
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Equal digests, compared without an early exit.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authenticator {
    pub(crate) fn new(config: &AuthConfig, default_namespace: &str) -> Self {
        let hashed = |credentials: &[Credential]| {
            credentials.iter().map(|credential| (digest(&credential.secret), credential.clone())).collect()
        };
        Self {
            api_key_header: config.api_key_header.to_ascii_lowercase(),
            api_keys: hashed(&config.api_keys),
            bearer_tokens: hashed(&config.bearer_tokens),
            default_namespace: default_namespace.to_owned(),
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
        Ok(Scope { namespace, agent, caller: principal.caller.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authenticator() -> Authenticator {
        let credential = |name: &str, secret: &str, namespaces: &[&str]| Credential {
            name: name.to_owned(),
            secret: secret.to_owned(),
            namespaces: namespaces.iter().map(|namespace| (*namespace).to_owned()).collect(),
        };
        let config = AuthConfig {
            api_key_header: "X-API-Key".to_owned(),
            api_keys: vec![credential("team-a", "key-a", &["team-a"])],
            bearer_tokens: vec![credential("ops", "token-ops", &["*"])],
        };
        Authenticator::new(&config, "default")
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
            assert!(principal.is_ok_and(|principal| principal.every_namespace()), "{header:?}");
        }
        assert!(auth.authenticate(|name| (name == "authorization").then_some("Basic token-ops")).is_err());
        let team = auth.authenticate(|name| (name == "x-api-key").then_some("key-a")).expect("api key");
        assert!(!team.every_namespace());
    }

    #[test]
    fn without_credentials_configured_everyone_is_let_in() {
        let auth = Authenticator::new(&AuthConfig::default(), "default");
        let principal = auth.authenticate(|_| None).expect("open");
        assert_eq!(auth.scope(&principal, "").expect("scope").namespace, "default");
    }
}
