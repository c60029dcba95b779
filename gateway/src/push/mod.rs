//! Outbound A2A push notifications: an SSRF guard for webhook URLs and a
//! sender that delivers with retries.
//!
//! A webhook URL comes from an A2A client, so it is untrusted: [`UrlGuard`]
//! refuses URLs whose host is, or resolves to, a loopback, private,
//! link-local, metadata or otherwise non-public address unless the operator
//! allows it (`gateway.push.allow_private`, `gateway.push.allowed_hosts`).
//! [`PushSender`] re-checks every address it connects to, so a host that
//! passes the check and then re-resolves elsewhere (DNS rebinding) is still
//! refused.

mod error;
mod guard;
mod sender;
#[cfg(test)]
mod tests;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub(crate) use chorus_runtime::egress::AddressKind;
pub(crate) use error::PushError;
pub(crate) use guard::UrlGuard;
pub(crate) use sender::{PushSender, PushTarget, backoff, notification_headers};

/// Push notification settings (`[gateway.push]` in `chorus.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushPolicy {
    /// Deliver to loopback, private, link-local and other non-public
    /// addresses (development and single-network deployments only).
    pub allow_private: bool,
    /// Hosts exempt from the address check, matched exactly and
    /// case-insensitively against the URL's host.
    pub allowed_hosts: Vec<String>,
    /// Longest one delivery attempt may take, from connecting to the answer.
    pub timeout_ms: u64,
    /// Most attempts per notification, the first included.
    pub max_attempts: u32,
    /// Backoff ceiling before the second attempt; it doubles per attempt.
    pub initial_backoff_ms: u64,
    /// Largest backoff, also the cap on a receiver's `Retry-After`.
    pub max_backoff_ms: u64,
    /// How long a gateway holds the configs it follows without renewing
    /// (it renews every third of it): another gateway on the same task
    /// store takes over the configs of one that died this long after.
    pub lease_ms: u64,
    /// This gateway's name in those leases: unique among live gateways, the
    /// same across restarts (a restarted gateway takes its configs back at
    /// once). Default for `chorus dev` / `serve`: the host name and listen
    /// address.
    pub follower_id: Option<String>,
}

impl Default for PushPolicy {
    fn default() -> Self {
        Self {
            allow_private: false,
            allowed_hosts: Vec::new(),
            timeout_ms: 10_000,
            max_attempts: 5,
            initial_backoff_ms: 500,
            max_backoff_ms: 30_000,
            lease_ms: 10_000,
            follower_id: None,
        }
    }
}

impl PushPolicy {
    /// The per-attempt timeout (at least 1 ms).
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }

    /// The backoff before the second attempt.
    pub(crate) fn initial_backoff(&self) -> Duration {
        Duration::from_millis(self.initial_backoff_ms)
    }

    /// The largest backoff between two attempts.
    pub(crate) fn max_backoff(&self) -> Duration {
        Duration::from_millis(self.max_backoff_ms)
    }

    /// How often a gateway renews its leases and looks for configs no
    /// gateway follows: a third of a lease, so that two renewals may fail
    /// before it runs out.
    pub(crate) fn renew_every(&self) -> Duration {
        Duration::from_millis(self.lease_ms / 3).max(Duration::from_millis(1))
    }
}

/// Installs ring as the process-wide rustls crypto provider, which reqwest
/// (built without a provider of its own) needs before any TLS client is
/// built. Idempotent: a provider installed earlier is kept.
pub(crate) fn install_crypto_provider() {
    // `Err` only means a provider is already installed, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
