//! The SSRF guard: which push URLs, and which addresses behind them, the
//! gateway may call.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use chorus_runtime::egress::{EgressGuard, bare_host};

use reqwest::{
    Url,
    dns::{Addrs, Name, Resolve, Resolving},
};

use super::{PushError, PushPolicy};

/// `url`'s parse error type (reqwest does not re-export the `url` crate).
type ParseError = <Url as std::str::FromStr>::Err;

/// Checks push URLs and the addresses their hosts resolve to, by the
/// egress guard's rules; its refusals are [`PushError::Blocked`].
#[derive(Debug, Clone)]
pub(crate) struct UrlGuard(EgressGuard);

impl UrlGuard {
    /// A guard enforcing `policy`'s `allow_private` and `allowed_hosts`.
    pub(crate) fn new(policy: &PushPolicy) -> Self {
        Self(EgressGuard::new(policy.allow_private, &policy.allowed_hosts, "set gateway.push.allow_private"))
    }

    /// Parses `url` and checks its syntax: `http` or `https`, a host, and no
    /// user name or password. Resolves nothing.
    pub(crate) fn check(&self, url: &str) -> Result<Url, PushError> {
        let url = Url::parse(url).map_err(|error| match error {
            ParseError::EmptyHost => PushError::MissingHost,
            other => PushError::InvalidUrl(other.to_string()),
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(PushError::UnsupportedScheme(url.scheme().to_owned()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(PushError::UserInfo);
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(PushError::MissingHost);
        }
        Ok(url)
    }

    /// Checks `url`, resolves its host and refuses it when any address is
    /// not public (see [`chorus_runtime::egress::classify`]), unless private addresses are allowed or
    /// the host is listed in `allowed_hosts`. Returns the vetted addresses.
    pub(crate) async fn resolve(&self, url: &str) -> Result<Vec<SocketAddr>, PushError> {
        let url = self.check(url)?;
        let host = url.host_str().ok_or(PushError::MissingHost)?;
        let port = url.port_or_known_default().ok_or(PushError::MissingHost)?;
        self.resolve_host(host, port).await
    }

    /// Refuses `url` when its host is an IP literal that may not be called.
    /// Host names are vetted when they are resolved, by [`GuardedResolver`].
    pub(super) fn check_literal(&self, url: &Url) -> Result<(), PushError> {
        let host = url.host_str().ok_or(PushError::MissingHost)?;
        match bare_host(host).parse::<IpAddr>() {
            Ok(ip) => self.vet(host, [ip]),
            Err(_) => Ok(()),
        }
    }

    /// Resolves `host` (a name or an IP literal, brackets allowed) and vets
    /// every address it resolves to.
    async fn resolve_host(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, PushError> {
        let bare = bare_host(host);
        let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((bare, port))
                .await
                .map_err(|reason| PushError::Resolve { host: host.to_owned(), reason })?
                .collect(),
        };
        if addrs.is_empty() {
            return Err(PushError::NoAddress { host: host.to_owned() });
        }
        self.vet(host, addrs.iter().map(SocketAddr::ip))?;
        Ok(addrs)
    }

    /// Refuses the first address of `ips` that is not public, unless the
    /// policy exempts `host`.
    fn vet(&self, host: &str, ips: impl IntoIterator<Item = IpAddr>) -> Result<(), PushError> {
        self.0.vet(host, ips).map_err(|refused| PushError::Blocked {
            host: refused.host,
            addr: refused.addr,
            kind: refused.kind,
        })
    }
}

/// A reqwest DNS resolver that vets every address it hands to the
/// connector, so the addresses a push connection uses are exactly the ones
/// checked: a host cannot pass a check and then resolve elsewhere for the
/// connection (DNS rebinding). The refusal surfaces as a [`PushError`] in
/// the reqwest error's source chain.
#[derive(Debug)]
pub(super) struct GuardedResolver(Arc<UrlGuard>);

impl GuardedResolver {
    /// A resolver enforcing `guard`.
    pub(super) fn new(guard: UrlGuard) -> Self {
        Self(Arc::new(guard))
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = Arc::clone(&self.0);
        Box::pin(async move {
            // Port 0: the connector substitutes the URL's port.
            let addrs = guard.resolve_host(name.as_str(), 0).await?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}
