//! Push-notification configs of a task: kept by the task store, checked
//! by the SSRF guard on the way in, redacted on the way out.

use a2a::TaskPushNotificationConfig;
use chorus_proto::taskstore as pb;

use super::{Gateway, MAX_PAGE_SIZE, task_error};
use crate::{
    auth::Scope,
    error::{GatewayError, Result},
    notify::Follow,
};

impl Gateway {
    /// `CreateTaskPushNotificationConfig`: notifications cover the changes
    /// from about now on.
    pub(crate) async fn create_push_config(
        &self,
        scope: &Scope,
        config: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig> {
        self.get_task(scope, &config.task_id, Some(0)).await?;
        self.inner.push.check(&config.url).await?;
        self.store_push_config(scope, config, Follow::FromNow).await
    }

    /// Stores a checked config and makes sure the task's changes are
    /// delivered to it (`follow` says from where).
    pub(super) async fn store_push_config(
        &self,
        scope: &Scope,
        config: TaskPushNotificationConfig,
        follow: Follow,
    ) -> Result<TaskPushNotificationConfig> {
        // Followed before the config is stored: a change in between reaches
        // it (at least once), none is lost.
        self.inner.push.follow(&scope.namespace, &config.task_id, follow).await;
        let request = pb::CreatePushConfigRequest {
            namespace: scope.namespace.clone(),
            config: Some(pb::PushConfig {
                id: config.id.clone().filter(|id| !id.is_empty()).unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
                task_id: config.task_id.clone(),
                url: config.url.clone(),
                token: config.token.clone().unwrap_or_default(),
                auth_scheme: config.authentication.as_ref().map(|auth| auth.scheme.clone()).unwrap_or_default(),
                auth_credentials: config
                    .authentication
                    .as_ref()
                    .and_then(|auth| auth.credentials.clone())
                    .unwrap_or_default(),
            }),
        };
        let created =
            self.tasks().create_push_config(request).await.map_err(|status| task_error(&status, &config.task_id))?;
        Ok(push_config_out(created.into_inner()))
    }

    pub(crate) async fn get_push_config(
        &self,
        scope: &Scope,
        task_id: &str,
        id: &str,
    ) -> Result<TaskPushNotificationConfig> {
        let request = pb::GetPushConfigRequest {
            namespace: scope.namespace.clone(),
            task_id: task_id.to_owned(),
            id: id.to_owned(),
        };
        match self.tasks().get_push_config(request).await {
            Ok(config) => Ok(push_config_out(config.into_inner())),
            Err(status) if status.code() == tonic::Code::NotFound => {
                // The task, or only its config? Only the task answers that.
                self.get_task(scope, task_id, Some(0)).await?;
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
        task_id: &str,
        page_size: Option<i32>,
        page_token: Option<&str>,
    ) -> Result<(Vec<TaskPushNotificationConfig>, String)> {
        let page_size = match page_size {
            None => usize::MAX,
            Some(size @ 1..=MAX_PAGE_SIZE) => size.unsigned_abs() as usize,
            Some(_) => {
                return Err(GatewayError::InvalidParams(format!("pageSize must be between 1 and {MAX_PAGE_SIZE}")));
            }
        };
        self.get_task(scope, task_id, Some(0)).await?;
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
    pub(crate) async fn delete_push_config(&self, scope: &Scope, task_id: &str, id: &str) -> Result<()> {
        self.get_task(scope, task_id, Some(0)).await?;
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
