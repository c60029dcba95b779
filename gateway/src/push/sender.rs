//! Delivery of push notifications: one POST per attempt, retried with
//! capped, fully jittered exponential backoff.
//!
//! DNS rebinding: the client's DNS resolver is a [`GuardedResolver`], so
//! every connection goes to addresses vetted in the same resolution that
//! produced them, and a pooled connection was vetted when it was opened.
//! IP-literal hosts skip DNS and are vetted before the first attempt.
//! Redirects are not followed and proxies are not used: either would let
//! the request reach an address the guard never saw.

use std::{
    collections::hash_map::RandomState,
    error::Error as StdError,
    fmt,
    hash::{BuildHasher, Hasher},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};
use reqwest::{Client, StatusCode, Url, redirect};
use tracing::debug;

use super::{PushError, PushPolicy, UrlGuard, error::describe, guard::GuardedResolver, install_crypto_provider};

/// The A2A 1.0.1 media type of push notification bodies.
const A2A_JSON: &str = "application/a2a+json";

/// Not in the A2A specification (A2A PR #1793), but the SDKs send it and
/// receivers check it.
const NOTIFICATION_TOKEN: HeaderName = HeaderName::from_static("x-a2a-notification-token");

/// Where and how to deliver one task's notifications (from its
/// `TaskPushNotificationConfig`).
#[derive(Clone)]
pub(crate) struct PushTarget {
    /// The receiver's webhook URL.
    pub(crate) url: String,
    /// Sent as `X-A2A-Notification-Token`.
    pub(crate) token: Option<String>,
    /// `(scheme, credentials)`, sent as `Authorization: {scheme}
    /// {credentials}` when credentials are present.
    pub(crate) authentication: Option<(String, Option<String>)>,
}

impl fmt::Debug for PushTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |secret: &Option<String>| secret.as_ref().map(|_| "<redacted>");
        f.debug_struct("PushTarget")
            .field("url", &self.url)
            .field("token", &redacted(&self.token))
            .field(
                "authentication",
                &self.authentication.as_ref().map(|(scheme, credentials)| (scheme, redacted(credentials))),
            )
            .finish()
    }
}

/// Delivers push notifications to guarded webhook URLs.
#[derive(Debug, Clone)]
pub(crate) struct PushSender {
    client: Client,
    guard: UrlGuard,
    policy: PushPolicy,
}

/// How one attempt failed.
enum Failure {
    /// Retrying cannot help.
    Permanent(PushError),
    /// Worth another attempt, after `retry_after` when the receiver gave one.
    Transient { error: PushError, retry_after: Option<Duration> },
}

impl PushSender {
    /// A sender enforcing `policy`. Installs the rustls crypto provider.
    pub(crate) fn new(policy: PushPolicy) -> Result<Self, PushError> {
        install_crypto_provider();
        let guard = UrlGuard::new(&policy);
        let client = Client::builder()
            .timeout(policy.timeout())
            .redirect(redirect::Policy::none())
            .no_proxy()
            .dns_resolver(GuardedResolver::new(guard.clone()))
            .user_agent(concat!("chorus-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(PushError::Client)?;
        Ok(Self { client, guard, policy })
    }

    /// The guard this sender enforces, for checking URLs when a push
    /// configuration is registered.
    pub(crate) fn guard(&self) -> &UrlGuard {
        &self.guard
    }

    /// POSTs `body` to `target` until a 2xx answer, a permanent failure (a
    /// refused address, a redirect, a 4xx other than 408 and 429),
    /// `max_attempts` attempts, or `current` (asked before each retry)
    /// answering `None`: the config was withdrawn. Each retry goes where
    /// `current` says, so a config updated meanwhile is followed. Returns the
    /// number of attempts made.
    pub(crate) async fn deliver<Current: Future<Output = Option<PushTarget>>>(
        &self,
        target: &PushTarget,
        body: &serde_json::Value,
        mut current: impl FnMut() -> Current,
    ) -> Result<u32, PushError> {
        let (mut url, mut headers) = self.prepare(target)?;
        let body = Bytes::from(body.to_string());
        let max_attempts = self.policy.max_attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (error, retry_after) = match self.attempt(&url, &headers, &body).await {
                Ok(()) => return Ok(attempt),
                Err(Failure::Permanent(error)) => return Err(undelivered(attempt, error)),
                Err(Failure::Transient { error, retry_after }) => (error, retry_after),
            };
            if attempt >= max_attempts {
                return Err(undelivered(attempt, error));
            }
            let delay = backoff(&self.policy, attempt, retry_after);
            debug!(host = url.host_str(), attempt, delay_ms = delay.as_millis(), %error, "push delivery failed, retrying");
            tokio::time::sleep(delay).await;
            let Some(target) = current().await else { return Err(undelivered(attempt, PushError::Withdrawn)) };
            (url, headers) = self.prepare(&target).map_err(|error| undelivered(attempt, error))?;
        }
    }

    /// Where and with which headers `target` is delivered to, refused when
    /// its URL fails the guard or a secret cannot be sent.
    fn prepare(&self, target: &PushTarget) -> Result<(Url, HeaderMap), PushError> {
        let url = self.guard.check(&target.url)?;
        self.guard.check_literal(&url)?;
        Ok((url, notification_headers(target)?))
    }

    async fn attempt(&self, url: &Url, headers: &HeaderMap, body: &Bytes) -> Result<(), Failure> {
        let response = self
            .client
            .post(url.clone())
            .headers(headers.clone())
            .body(body.clone())
            .send()
            .await
            .map_err(|error| self.send_failure(error))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        chorus_runtime::egress::drain(response).await;
        if status.is_success() {
            return Ok(());
        }
        if status.is_redirection() {
            return Err(Failure::Permanent(PushError::Redirect(status)));
        }
        if status.is_server_error() || matches!(status, StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS) {
            return Err(Failure::Transient { error: PushError::Status(status), retry_after });
        }
        Err(Failure::Permanent(PushError::Status(status)))
    }

    fn send_failure(&self, error: reqwest::Error) -> Failure {
        if let Some(blocked) = guard_refusal(&error) {
            return Failure::Permanent(blocked);
        }
        if error.is_builder() {
            return Failure::Permanent(PushError::Transport(describe(error)));
        }
        let error = if error.is_timeout() {
            PushError::Timeout(self.policy.timeout_ms)
        } else {
            PushError::Transport(describe(error))
        };
        Failure::Transient { error, retry_after: None }
    }
}

/// The headers of every notification to `target`, secrets marked sensitive;
/// refuses a token or credentials that cannot be sent.
pub(crate) fn notification_headers(target: &PushTarget) -> Result<HeaderMap, PushError> {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(A2A_JSON));
    if let Some((scheme, Some(credentials))) = &target.authentication {
        headers.insert(header::AUTHORIZATION, secret_value(&format!("{scheme} {credentials}"), "authentication")?);
    }
    if let Some(token) = &target.token {
        headers.insert(NOTIFICATION_TOKEN, secret_value(token, "token")?);
    }
    Ok(headers)
}

fn secret_value(value: &str, what: &'static str) -> Result<HeaderValue, PushError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| PushError::InvalidHeader(what))?;
    value.set_sensitive(true);
    Ok(value)
}

fn undelivered(attempts: u32, cause: PushError) -> PushError {
    PushError::Undelivered { attempts, cause: Box::new(cause) }
}

/// The guard's refusal when the resolver refused the connection; it sits
/// somewhere in reqwest's source chain.
fn guard_refusal(error: &reqwest::Error) -> Option<PushError> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(current) = next {
        if let Some(PushError::Blocked { host, addr, kind }) = current.downcast_ref::<PushError>() {
            return Some(PushError::Blocked { host: host.clone(), addr: *addr, kind: *kind });
        }
        next = current.source();
    }
    None
}

/// A `Retry-After` given in seconds (the HTTP-date form is ignored).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}

/// The wait after `failed` attempts: the receiver's `Retry-After` when
/// given, else a uniformly random duration up to `initial * 2^(failed-1)`;
/// either way at most `max_backoff`.
pub(crate) fn backoff(policy: &PushPolicy, failed: u32, retry_after: Option<Duration>) -> Duration {
    let max = policy.max_backoff();
    if let Some(after) = retry_after {
        return after.min(max);
    }
    let factor = 1u32.checked_shl(failed.saturating_sub(1)).unwrap_or(u32::MAX);
    let ceiling = policy.initial_backoff().saturating_mul(factor).min(max);
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(random_u64() % nanos.saturating_add(1))
}

/// A random number from the standard library's per-instance random
/// SipHash keys: plenty for jitter, with no extra dependency.
fn random_u64() -> u64 {
    RandomState::new().build_hasher().finish()
}
