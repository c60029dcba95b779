//! Push-notification configs of a task: kept by the task store, checked
//! by the SSRF guard on the way in, redacted on the way out.

use a2a::TaskPushNotificationConfig;
use chorus_proto::taskstore as pb;
use chorus_runtime::validate::{self, FieldViolation};

use super::{Gateway, MAX_PAGE_SIZE, task_error};
use crate::{
    auth::Scope,
    config::AgentConfig,
    error::{GatewayError, Result},
    notify::{Changes, Follow, target},
    push::{self, PushError},
};

/// Where a config sent with a message sits in its request, for errors.
pub(super) const SENT_CONFIG: &str = "configuration.taskPushNotificationConfig.";

/// A config sent with a message, for the task the message made or
/// continued. Without an id of its own it takes the task's, as the 0.3
/// clients that read it back by the task's id expect (a later one sent
/// without an id replaces it).
pub(super) fn sent_for(mut config: TaskPushNotificationConfig, task_id: &str) -> TaskPushNotificationConfig {
    config.task_id = task_id.to_owned();
    if config.id.as_deref().is_none_or(str::is_empty) {
        config.id = Some(task_id.to_owned());
    }
    config
}

impl Gateway {
    /// The server's metrics (the push dispatcher's, which counts its deliveries there).
    pub(crate) fn metrics(&self) -> &chorus_runtime::metrics::Metrics {
        self.inner.push.metrics()
    }

    /// `CreateTaskPushNotificationConfig`: notifications cover the changes
    /// from about now on.
    pub(crate) async fn create_push_config(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        config: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig> {
        if config.task_id.is_empty() {
            return Err(GatewayError::InvalidParams("taskId is required".to_owned()));
        }
        self.check_push_config(&config, "").await?;
        self.get_task(scope, agent, &config.task_id, Some(0)).await?;
        let changes = self.inner.push.open(&scope.namespace, &config.task_id, Follow::FromNow).await?;
        self.store_push_config(scope, config, changes).await
    }

    /// Refuses a config the task store would refuse or that no notification
    /// could be sent to; `field` is where the config sits in the request.
    pub(super) async fn check_push_config(&self, config: &TaskPushNotificationConfig, field: &str) -> Result<()> {
        let invalid = |violation: FieldViolation| GatewayError::InvalidParams(violation.to_string());
        if let Some(id) = config.id.as_deref().filter(|id| !id.is_empty()) {
            validate::id(&format!("{field}id"), id).map_err(invalid)?;
            if id.contains('/') {
                let why = "must not hold '/': HTTP+JSON names the config in a path segment";
                return Err(invalid(FieldViolation::new(format!("{field}id"), why)));
            }
        }
        let auth = config.authentication.as_ref();
        // What a notification sends, each with the most bytes it may hold.
        let texts = [
            ("url", Some(config.url.as_str()), MAX_URL_BYTES),
            ("token", config.token.as_deref(), MAX_SECRET_BYTES),
            ("authentication.scheme", auth.map(|auth| auth.scheme.as_str()), usize::MAX),
            ("authentication.credentials", auth.and_then(|auth| auth.credentials.as_deref()), MAX_SECRET_BYTES),
        ];
        let refuse = |at: &str, why: String| Err(invalid(FieldViolation::new(format!("{field}{at}"), why)));
        if let Some((at, _, limit)) = texts.iter().find(|(_, text, limit)| text.is_some_and(|text| text.len() > *limit))
        {
            return refuse(at, format!("must be at most {limit} bytes"));
        }
        if auth.is_some_and(|auth| !is_token(&auth.scheme)) {
            let why = "must be an HTTP authentication scheme, such as Bearer or Basic (letters, digits, no spaces)";
            return refuse("authentication.scheme", why.to_owned());
        }
        // As the task store refuses them: a TAB, which a header may hold, too.
        if let Some((at, ..)) =
            texts.iter().find(|(_, text, _)| text.is_some_and(|text| text.chars().any(char::is_control)))
        {
            return refuse(at, "must not hold control characters".to_owned());
        }
        push::notification_headers(&target(&config_in(config))).map_err(|error| match error {
            PushError::InvalidHeader(what) => invalid(FieldViolation::new(
                format!("{field}{}", if what == "token" { "token" } else { "authentication" }),
                "must be a valid HTTP header value (no CR, LF or other control characters)",
            )),
            other => GatewayError::InvalidParams(other.to_string()),
        })?;
        self.inner.push.check(&config.url).await
    }

    /// Stores a checked config and delivers the task's `changes` to it.
    pub(super) async fn store_push_config(
        &self,
        scope: &Scope,
        config: TaskPushNotificationConfig,
        changes: Changes,
    ) -> Result<TaskPushNotificationConfig> {
        let request = pb::CreatePushConfigRequest {
            namespace: scope.namespace.clone(),
            config: Some(config_in(&config)),
            after_cursor: changes.after().to_owned(),
            follower: self.inner.push.follower().to_owned(),
            lease_ms: self.inner.push.lease_ms(),
        };
        let created =
            self.tasks().create_push_config(request).await.map_err(|status| task_error(&status, &config.task_id))?;
        let created = created.into_inner();
        self.inner.push.start(&scope.namespace, &created.task_id, &created.id, changes);
        Ok(push_config_out(created))
    }

    pub(crate) async fn get_push_config(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        task_id: &str,
        id: &str,
    ) -> Result<TaskPushNotificationConfig> {
        self.get_task(scope, agent, task_id, Some(0)).await?;
        let request = pb::GetPushConfigRequest {
            namespace: scope.namespace.clone(),
            task_id: task_id.to_owned(),
            id: id.to_owned(),
        };
        match self.tasks().get_push_config(request).await {
            Ok(config) => Ok(push_config_out(config.into_inner())),
            Err(status) if status.code() == tonic::Code::NotFound => {
                Err(GatewayError::PushConfigNotFound { task_id: task_id.to_owned(), id: id.to_owned() })
            }
            Err(status) => Err(task_error(&status, task_id)),
        }
    }

    /// `ListTaskPushNotificationConfigs`: the task's configs in id order,
    /// `page_size` at a time (all when unset), after `page_token` (the last
    /// id of the page before); and the next page's token, empty on the last.
    pub(crate) async fn list_push_configs(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        task_id: &str,
        page_size: Option<i32>,
        page_token: Option<&str>,
    ) -> Result<(Vec<TaskPushNotificationConfig>, String)> {
        // The proto's page_size has no presence: 0 is unset, on every binding.
        let page_size = match page_size {
            None | Some(0) => usize::MAX,
            Some(size @ 1..=MAX_PAGE_SIZE) => size.unsigned_abs() as usize,
            Some(_) => {
                return Err(GatewayError::InvalidParams(format!("pageSize must be between 1 and {MAX_PAGE_SIZE}")));
            }
        };
        self.get_task(scope, agent, task_id, Some(0)).await?;
        let request = pb::ListPushConfigsRequest { namespace: scope.namespace.clone(), task_id: task_id.to_owned() };
        let configs = self.tasks().list_push_configs(request).await.map_err(|status| task_error(&status, task_id))?;
        let mut configs = configs.into_inner().configs;
        configs.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        let after = page_token.unwrap_or_default();
        let mut rest = configs.into_iter().filter(|config| after.is_empty() || config.id.as_str() > after).peekable();
        let page: Vec<pb::PushConfig> = rest.by_ref().take(page_size).collect();
        let next = match (rest.peek(), page.last()) {
            (Some(_), Some(last)) => last.id.clone(),
            _ => String::new(),
        };
        Ok((page.into_iter().map(push_config_out).collect(), next))
    }

    /// Idempotent: deleting a config that is gone already succeeds, on a
    /// task that exists.
    pub(crate) async fn delete_push_config(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        task_id: &str,
        id: &str,
    ) -> Result<()> {
        self.get_task(scope, agent, task_id, Some(0)).await?;
        let request = pb::DeletePushConfigRequest {
            namespace: scope.namespace.clone(),
            task_id: task_id.to_owned(),
            id: id.to_owned(),
        };
        match self.tasks().delete_push_config(request).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
            Err(status) => Err(task_error(&status, task_id)),
        }
    }
}

/// A config as the task store keeps it; a config without an id gets one.
fn config_in(config: &TaskPushNotificationConfig) -> pb::PushConfig {
    let authentication = config.authentication.as_ref();
    pb::PushConfig {
        id: config.id.clone().filter(|id| !id.is_empty()).unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        task_id: config.task_id.clone(),
        url: config.url.clone(),
        token: config.token.clone().unwrap_or_default(),
        auth_scheme: authentication.map(|auth| auth.scheme.clone()).unwrap_or_default(),
        auth_credentials: authentication.and_then(|auth| auth.credentials.clone()).unwrap_or_default(),
    }
}

/// A push config as the caller may read it back: secrets are never echoed.
fn push_config_out(config: pb::PushConfig) -> TaskPushNotificationConfig {
    TaskPushNotificationConfig {
        url: config.url,
        id: Some(config.id),
        task_id: config.task_id,
        token: None,
        authentication: (!config.auth_scheme.is_empty())
            .then_some(a2a::AuthenticationInfo { scheme: config.auth_scheme, credentials: None }),
        tenant: None,
    }
}

/// The longest URL a config may name: what HTTP servers commonly take in a
/// request line, and far more than a webhook needs.
const MAX_URL_BYTES: usize = 2048;
/// The longest token or credentials: each is sent in a header, and a
/// receiver refuses headers much larger (431).
const MAX_SECRET_BYTES: usize = 4096;

/// An HTTP token (RFC 9110 `token`): what an auth scheme is.
fn is_token(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}
