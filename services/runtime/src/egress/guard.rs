//! The SSRF guard of outbound HTTP clients whose URLs come from someone
//! else: the workflow engine's webhooks and the gateway's delegations.
//!
//! A client built by [`EgressGuard::client_builder`] resolves host names
//! through the guard, so the addresses a connection uses are exactly the ones
//! vetted (a host cannot pass a check and then resolve elsewhere: DNS
//! rebinding), and vets the IP-literal host of every redirect it follows.
//! Literal hosts skip resolution: the caller vets the first request's URL
//! with [`EgressGuard::vet_url`]. Proxies are not used, since a proxy would
//! reach addresses the guard never saw.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use reqwest::{
    Url,
    dns::{Addrs, Name, Resolve, Resolving},
    redirect,
};

use super::{AddressKind, classify};

/// Most redirects a guarded client follows.
const MAX_REDIRECTS: usize = 5;

/// Which non-public addresses an outbound client may reach.
#[derive(Debug, Clone)]
pub struct EgressGuard {
    allow_private: bool,
    /// Exempt hosts, in the form [`normalize_host`] gives.
    allowed_hosts: Vec<String>,
    /// The settings that would allow a refused address, as a refusal names them.
    remedy: String,
}

/// An address the guard refused: the host named, the address it is or
/// resolved to, what kind of address that is, and how to allow it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", refusal_text(.host, *.addr, *.kind, .remedy))]
pub struct Refused {
    pub host: String,
    pub addr: IpAddr,
    pub kind: AddressKind,
    pub remedy: String,
}

fn refusal_text(host: &str, addr: IpAddr, kind: AddressKind, remedy: &str) -> String {
    let literal = bare_host(host).parse::<IpAddr>().is_ok_and(|literal| literal == addr);
    let at = if literal { String::new() } else { format!(" resolves to {addr}, which") };
    format!("{host}{at} is {kind}, not a public address; {remedy}")
}

impl EgressGuard {
    /// A guard refusing non-public addresses unless `allow_private`, or the
    /// host is one of `allowed_hosts` (matched exactly, case-insensitively).
    /// `remedy` names the settings, e.g. "set gateway.delegate.allow_private
    /// or list the host in gateway.delegate.allowed_hosts".
    pub fn new(allow_private: bool, allowed_hosts: &[String], remedy: impl Into<String>) -> Self {
        let allowed_hosts = allowed_hosts.iter().map(|host| normalize_host(host)).collect();
        Self { allow_private, allowed_hosts, remedy: remedy.into() }
    }

    /// Refuses the first of `ips`, the addresses of `host`, that is not public.
    pub fn vet(&self, host: &str, ips: impl IntoIterator<Item = IpAddr>) -> Result<(), Refused> {
        if self.allow_private || self.allowed_hosts.contains(&normalize_host(host)) {
            return Ok(());
        }
        for ip in ips {
            if let Some(kind) = classify(ip) {
                return Err(Refused { host: host.to_owned(), addr: ip, kind, remedy: self.remedy.clone() });
            }
        }
        Ok(())
    }

    /// Refuses `url` when its host is an IP literal that may not be called;
    /// host names are vetted as they are resolved.
    pub fn vet_url(&self, url: &Url) -> Result<(), Refused> {
        let Some(host) = url.host_str() else { return Ok(()) };
        match bare_host(host).parse::<IpAddr>() {
            Ok(ip) => self.vet(host, [ip]),
            Err(_) => Ok(()),
        }
    }

    /// A client builder that resolves through this guard, vets redirects
    /// and uses no proxy. Allowing every private address, it checks nothing.
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        let builder = reqwest::Client::builder();
        if self.allow_private {
            return builder;
        }
        let guard = Arc::new(self.clone());
        let redirects = Arc::clone(&guard);
        builder.no_proxy().dns_resolver(VettingResolver(guard)).redirect(redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match redirects.vet_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(refused) => attempt.error(refused),
            }
        }))
    }
}

/// A refusal of the guard, found among `error`'s sources.
pub fn refusal(error: &reqwest::Error) -> Option<&Refused> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = next {
        if let Some(refused) = current.downcast_ref::<Refused>() {
            return Some(refused);
        }
        next = current.source();
    }
    None
}

/// Resolves host names and vets every address before the connector sees it.
#[derive(Debug)]
struct VettingResolver(Arc<EgressGuard>);

impl Resolve for VettingResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = Arc::clone(&self.0);
        Box::pin(async move {
            let host = name.as_str().to_owned();
            // Port 0: the connector puts in the URL's.
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            guard.vet(&host, addrs.iter().map(SocketAddr::ip))?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// `host` without the brackets of an IPv6 literal.
pub fn bare_host(host: &str) -> &str {
    host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')).unwrap_or(host)
}

/// The form hosts are compared in: IP literals in canonical text, names in
/// lower case.
pub fn normalize_host(host: &str) -> String {
    let bare = bare_host(host);
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => bare.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allowed: &[&str]) -> EgressGuard {
        let allowed: Vec<String> = allowed.iter().map(|host| (*host).to_owned()).collect();
        EgressGuard::new(false, &allowed, "set x.allow_private")
    }

    fn url(text: &str) -> Url {
        Url::parse(text).expect("a URL")
    }

    #[test]
    fn literal_hosts_are_vetted_by_their_address() {
        let guard = guard(&[]);
        let refused = guard.vet_url(&url("http://169.254.169.254/latest/")).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "169.254.169.254 is the cloud metadata address, not a public address; set x.allow_private"
        );
        assert!(guard.vet_url(&url("http://[::1]:8080/")).is_err());
        assert!(guard.vet_url(&url("http://10.1.2.3/")).is_err());
        assert!(guard.vet_url(&url("https://93.184.215.14/")).is_ok());
        assert!(guard.vet_url(&url("http://agents.example.com/")).is_ok(), "names are vetted as resolved");
    }

    #[test]
    fn a_resolved_name_is_named_with_its_address() {
        let refused = guard(&[]).vet("db.internal", ["10.0.0.7".parse().unwrap()]).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "db.internal resolves to 10.0.0.7, which is a private address, not a public address; set x.allow_private"
        );
    }

    #[test]
    fn allowed_hosts_and_allow_private_exempt() {
        let guard = guard(&["Agents.Local", "[::1]"]);
        assert!(guard.vet("agents.local", ["10.0.0.7".parse().unwrap()]).is_ok());
        assert!(guard.vet_url(&url("http://[::1]:9/")).is_ok());
        assert!(guard.vet_url(&url("http://127.0.0.1/")).is_err());
        let open = EgressGuard::new(true, &[], "");
        assert!(open.vet_url(&url("http://127.0.0.1/")).is_ok());
    }

    #[tokio::test]
    async fn a_client_refuses_a_name_that_resolves_to_loopback() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = guard(&[]).client_builder().build().expect("a client");
        let error = client.get("http://localhost:9/").send().await.unwrap_err();
        let refused = refusal(&error).expect("refused by the guard");
        assert!(refused.to_string().starts_with("localhost resolves to "), "{refused}");
    }
}
