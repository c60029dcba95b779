//! Push-notification helpers shared by the push end-to-end tests.

use serde_json::{Value, json};

use crate::{Sandbox, Server};

/// A `tck` server that may deliver to loopback, with `env` on top.
pub async fn push_server(sandbox: &Sandbox, env: &[(&str, &str)]) -> Server {
    let mut builder = sandbox.dev().no_agents().env("CHORUS_GATEWAY__PUSH__ALLOW_PRIVATE", "true");
    for (key, value) in env {
        builder = builder.env(key, value);
    }
    builder.start().await
}

/// `SendMessage` params for a message with `config` as its push config.
pub fn with_push(message: Value, config: Value) -> Value {
    json!({ "message": message, "configuration": { "taskPushNotificationConfig": config } })
}
