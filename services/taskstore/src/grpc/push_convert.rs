//! Push notification configs between the wire and the domain: checked on
//! the way in, whole on the way out.

use std::time::Duration;

use chorus_proto::taskstore as pb;
use chorus_runtime::validate::{self, FieldViolation};

use super::convert::{Checked, non_empty};
use crate::domain::{PendingPush, PushConfig, PushConfigKey, TaskKey, TurnFollower};

/// The longest follower name: a host name and a listen address fit.
const MAX_FOLLOWER: usize = 300;

pub(super) fn push_config(namespace_task: &str, value: Option<pb::PushConfig>) -> Checked<PushConfig> {
    let value = value.ok_or_else(|| FieldViolation::required("config"))?;
    let texts = [
        ("config.url", &value.url),
        ("config.token", &value.token),
        ("config.auth_scheme", &value.auth_scheme),
        ("config.auth_credentials", &value.auth_credentials),
    ];
    if let Some((field, _)) = texts.iter().find(|(_, text)| text.chars().any(char::is_control)) {
        return Err(FieldViolation::new(*field, "must not hold control characters"));
    }
    let url = value.url.trim();
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !scheme.is_some_and(|scheme| scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("http")) {
        return Err(FieldViolation::new("config.url", "must be an http(s) URL"));
    }
    let id = match value.id.as_str() {
        "" => uuid::Uuid::new_v4().to_string(),
        id => validate::id("config.id", id)?,
    };
    Ok(PushConfig {
        id,
        task_id: validate::id("config.task_id", namespace_task)?,
        url: url.to_owned(),
        token: non_empty(value.token),
        auth_scheme: non_empty(value.auth_scheme),
        auth_credentials: non_empty(value.auth_credentials),
    })
}

/// A config's key at `field`.
fn push_config_key(field: &str, value: pb::PushConfigKey) -> Checked<PushConfigKey> {
    Ok(PushConfigKey {
        namespace: validate::namespace(&value.namespace)
            .map_err(|violation| FieldViolation { field: format!("{field}.namespace"), ..violation })?,
        task_id: validate::id(&format!("{field}.task_id"), &value.task_id)?,
        id: validate::id(&format!("{field}.id"), &value.id)?,
    })
}

/// A follower's name (printable, at most [`MAX_FOLLOWER`] characters); empty:
/// none.
pub(super) fn follower(value: String) -> Checked<Option<String>> {
    if value.chars().any(char::is_control) {
        return Err(FieldViolation::new("follower", "must not hold control characters"));
    }
    if value.chars().count() > MAX_FOLLOWER {
        return Err(FieldViolation::new("follower", format!("must be at most {MAX_FOLLOWER} characters")));
    }
    Ok(non_empty(value))
}

/// A follower's name, required.
pub(super) fn required_follower(value: String) -> Checked<String> {
    follower(value)?.ok_or_else(|| FieldViolation::required("follower"))
}

/// A named follower and its lease, both required.
pub(super) fn follower_lease(follower_name: String, lease_ms: u64) -> Checked<(String, Duration)> {
    Ok((required_follower(follower_name)?, lease(lease_ms)?))
}

/// The follower a task is created with, if any: its name and lease, both required.
pub(super) fn turn_follower(value: Option<pb::TurnFollower>) -> Checked<Option<TurnFollower>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let name = required_follower(value.name)
        .map_err(|violation| FieldViolation { field: "follower.name".to_owned(), ..violation })?;
    let lease = lease(value.lease_ms).map_err(|violation| violation.nested("follower"))?;
    Ok(Some(TurnFollower { name, lease }))
}

/// The push configs `field` lists, each checked.
pub(super) fn push_config_keys(field: &str, values: Vec<pb::PushConfigKey>) -> Checked<Vec<PushConfigKey>> {
    values.into_iter().enumerate().map(|(at, key)| push_config_key(&format!("{field}[{at}]"), key)).collect()
}

/// The lease of a follower: at least 1 ms.
pub(super) fn lease(lease_ms: u64) -> Checked<Duration> {
    match lease_ms {
        0 => Err(FieldViolation::new("lease_ms", "must be at least 1")),
        ms => Ok(Duration::from_millis(ms)),
    }
}

/// The follower a config is created with, if any, and its lease.
pub(super) fn creating_follower(follower_name: String, lease_ms: u64) -> Checked<Option<(String, Duration)>> {
    follower(follower_name)?.map(|follower| Ok((follower, lease(lease_ms)?))).transpose()
}

/// The tasks a follower of turns names, each checked.
pub(super) fn task_keys(field: &str, values: Vec<pb::TaskKey>) -> Checked<Vec<TaskKey>> {
    let key = |(at, value): (usize, pb::TaskKey)| {
        Ok(TaskKey {
            namespace: validate::namespace(&value.namespace)
                .map_err(|violation| FieldViolation { field: format!("{field}[{at}].namespace"), ..violation })?,
            task_id: validate::id(&format!("{field}[{at}].task_id"), &value.task_id)?,
        })
    };
    values.into_iter().enumerate().map(key).collect()
}

pub(super) fn task_keys_out(keys: Vec<TaskKey>) -> Vec<pb::TaskKey> {
    keys.into_iter().map(|TaskKey { namespace, task_id }| pb::TaskKey { namespace, task_id }).collect()
}

pub(super) fn push_key_out(key: PushConfigKey) -> pb::PushConfigKey {
    let PushConfigKey { namespace, task_id, id } = key;
    pb::PushConfigKey { namespace, task_id, id }
}

pub(super) fn push_config_out(config: PushConfig) -> pb::PushConfig {
    pb::PushConfig {
        id: config.id,
        task_id: config.task_id,
        url: config.url,
        token: config.token.unwrap_or_default(),
        auth_scheme: config.auth_scheme.unwrap_or_default(),
        auth_credentials: config.auth_credentials.unwrap_or_default(),
    }
}

pub(super) fn pending_push_out(pending: PendingPush) -> pb::PendingPushConfig {
    pb::PendingPushConfig {
        key: Some(push_key_out(pending.key)),
        delivered_cursor: pending.delivered.map(|cursor| cursor.to_string()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_urls_are_http_or_https_in_any_case() {
        let config = |url: &str| Some(pb::PushConfig { url: url.into(), ..Default::default() });
        for url in ["https://a.example/hook", "Https://a.example/hook", "HTTP://a.example/hook"] {
            assert_eq!(push_config("t", config(url)).expect(url).url, url);
        }
        for url in ["ftp://a.example/hook", "https:/a.example", "a.example/hook", "https://a.example/h\0x"] {
            assert_eq!(push_config("t", config(url)).unwrap_err().field, "config.url", "{url}");
        }
        let scheme =
            pb::PushConfig { url: "https://a.example".into(), auth_scheme: "Be\0arer".into(), ..Default::default() };
        assert_eq!(push_config("t", Some(scheme)).unwrap_err().field, "config.auth_scheme");
    }

    #[test]
    fn a_turn_follower_needs_a_name_and_a_lease() {
        let follower = |name: &str, lease_ms| Some(pb::TurnFollower { name: name.into(), lease_ms });
        assert_eq!(turn_follower(None), Ok(None));
        let followed = turn_follower(follower("gw-1", 1_500)).expect("a follower");
        assert_eq!(followed, Some(TurnFollower { name: "gw-1".into(), lease: Duration::from_millis(1_500) }));
        for (name, lease_ms, field) in
            [("", 1_000, "follower.name"), ("gw\n1", 1_000, "follower.name"), ("gw-1", 0, "follower.lease_ms")]
        {
            assert_eq!(turn_follower(follower(name, lease_ms)).unwrap_err().field, field, "{name:?} {lease_ms}");
        }
    }
}
