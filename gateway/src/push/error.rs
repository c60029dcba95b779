//! The push module's one error type.

use std::net::IpAddr;

use reqwest::StatusCode;

use chorus_runtime::egress::bare_host;

use super::AddressKind;

/// Why a push URL was refused or a notification was not delivered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PushError {
    #[error("push URL is not a valid URL: {0}")]
    InvalidUrl(String),
    #[error("push URL scheme {0} is not supported; use http or https")]
    UnsupportedScheme(String),
    #[error("push URL has no host")]
    MissingHost,
    #[error("push URL must not contain a user name or password; send credentials through authentication instead")]
    UserInfo,
    #[error("could not resolve push URL host {host}: {reason}")]
    Resolve { host: String, reason: std::io::Error },
    #[error("push URL host {host} resolves to no address")]
    NoAddress { host: String },
    #[error("{}", blocked_message(.host, *.addr, *.kind))]
    Blocked { host: String, addr: IpAddr, kind: AddressKind },
    #[error("push notification {0} is not a valid HTTP header value")]
    InvalidHeader(&'static str),
    #[error("could not build the push HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("push receiver did not answer within {0} ms")]
    Timeout(u64),
    /// What the request said (see [`describe`]).
    #[error("push request failed: {0}")]
    Transport(String),
    #[error("push receiver answered HTTP {0}, a redirect; redirects are not followed")]
    Redirect(StatusCode),
    #[error("push receiver answered HTTP {0}")]
    Status(StatusCode),
    #[error("the push config was deleted")]
    Withdrawn,
    #[error("push notification not delivered after {attempts} attempt(s): {cause}")]
    Undelivered { attempts: u32, cause: Box<PushError> },
}

/// `Blocked`'s message: the literal-address form names the address once,
/// the resolved form names both the host and the address it resolved to.
fn blocked_message(host: &str, addr: IpAddr, kind: AddressKind) -> String {
    let literal = bare_host(host).parse::<IpAddr>().is_ok_and(|ip| ip == addr);
    if literal {
        format!("push URL host {host} is {kind}; set gateway.push.allow_private to allow it")
    } else {
        format!(
            "push URL host {host} resolves to {addr}, {kind}; set gateway.push.allow_private \
             or list the host in gateway.push.allowed_hosts to allow it"
        )
    }
}

/// What a failed request says, with its causes ("tcp connect error:
/// Connection refused") and without its URL: a push URL's query may carry a
/// token, and these words are logged.
pub(crate) fn describe(error: reqwest::Error) -> String {
    chorus_runtime::error::with_causes(&error.without_url())
}
