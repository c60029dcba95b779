//! Push config and task methods in 0.3 shapes.

use serde_json::json;

use super::*;

/// Push config set and get params flatten, and their results nest under `pushNotificationConfig`.
#[test]
fn push_config_set_and_get_nest_the_config() {
    let set = json!({
        "taskId": "t1",
        "pushNotificationConfig": {
            "url": "https://hook.example/a", "token": "tok",
            "authentication": { "schemes": ["Bearer", "Basic"], "credentials": "c" },
        },
    });
    let v1 = params_to_v1("CreateTaskPushNotificationConfig", set).unwrap();
    assert_eq!(
        v1,
        json!({
            "taskId": "t1", "id": "t1", "url": "https://hook.example/a", "token": "tok",
            "authentication": { "scheme": "Bearer", "credentials": "c" },
        })
    );
    let typed: a2a::TaskPushNotificationConfig = serde_json::from_value(v1).unwrap();
    assert_eq!(typed.id.as_deref(), Some("t1"));
    let set_with_id = json!({ "taskId": "t1", "pushNotificationConfig": { "id": "p1", "url": "https://h.example" } });
    assert_eq!(
        params_to_v1("CreateTaskPushNotificationConfig", set_with_id),
        Ok(json!({ "taskId": "t1", "id": "p1", "url": "https://h.example" }))
    );
    assert_eq!(
        params_to_v1("GetTaskPushNotificationConfig", json!({ "id": "t1", "pushNotificationConfigId": "p1" })),
        Ok(json!({ "taskId": "t1", "id": "p1" }))
    );
    assert_eq!(
        params_to_v1("GetTaskPushNotificationConfig", json!({ "id": "t1", "metadata": {} })),
        Ok(json!({ "taskId": "t1", "id": "t1" }))
    );
    let config = json!({
        "id": "p1", "taskId": "t1", "url": "https://hook.example/a", "token": "tok",
        "authentication": { "scheme": "Bearer", "credentials": "c" },
    });
    let config_v03 = json!({
        "taskId": "t1",
        "pushNotificationConfig": {
            "id": "p1", "url": "https://hook.example/a", "token": "tok",
            "authentication": { "schemes": ["Bearer"], "credentials": "c" },
        },
    });
    assert_eq!(result_to_v03("CreateTaskPushNotificationConfig", config.clone()), config_v03);
    assert_eq!(result_to_v03("GetTaskPushNotificationConfig", config), config_v03);
}

/// A config list answers a bare array, and a delete answers `null`.
#[test]
fn push_config_list_and_delete_use_03_shapes() {
    assert_eq!(params_to_v1("ListTaskPushNotificationConfigs", json!({ "id": "t1" })), Ok(json!({ "taskId": "t1" })));
    let list = json!({
        "configs": [
            { "id": "p1", "taskId": "t1", "url": "https://a.example" },
            { "id": "p2", "taskId": "t1", "url": "https://b.example", "tenant": "x" },
        ],
        "nextPageToken": "",
    });
    assert_eq!(
        result_to_v03("ListTaskPushNotificationConfigs", list),
        json!([
            { "taskId": "t1", "pushNotificationConfig": { "id": "p1", "url": "https://a.example" } },
            { "taskId": "t1", "pushNotificationConfig": { "id": "p2", "url": "https://b.example" } },
        ])
    );
    assert_eq!(result_to_v03("ListTaskPushNotificationConfigs", json!({})), json!([]));
    assert_eq!(
        params_to_v1("DeleteTaskPushNotificationConfig", json!({ "id": "t1", "pushNotificationConfigId": "p1" })),
        Ok(json!({ "taskId": "t1", "id": "p1" }))
    );
    assert_eq!(
        params_to_v1("DeleteTaskPushNotificationConfig", json!({ "id": "t1" })),
        Err("params.pushNotificationConfigId: required".to_owned())
    );
    assert_eq!(result_to_v03("DeleteTaskPushNotificationConfig", json!({})), Value::Null);
}

/// `tasks/get`, `tasks/cancel`, `tasks/resubscribe` and the extended card convert.
#[test]
fn task_methods_convert_params_and_results() {
    assert_eq!(
        params_to_v1("GetTask", json!({ "id": "t1", "historyLength": 3, "metadata": { "x": 1 } })),
        Ok(json!({ "id": "t1", "historyLength": 3 }))
    );
    assert_eq!(params_to_v1("GetTask", json!({ "id": "t1", "historyLength": null })), Ok(json!({ "id": "t1" })));
    assert_eq!(
        params_to_v1("CancelTask", json!({ "id": "t1", "metadata": { "why": "x" } })),
        Ok(json!({ "id": "t1", "metadata": { "why": "x" } }))
    );
    assert_eq!(params_to_v1("SubscribeToTask", json!({ "id": "t1" })), Ok(json!({ "id": "t1" })));
    assert_eq!(params_to_v1("GetExtendedAgentCard", Value::Null), Ok(json!({})));
    let task = json!({ "id": "t1", "contextId": "c1", "status": { "state": "TASK_STATE_CANCELED" } });
    let task_v03 = json!({ "kind": "task", "id": "t1", "contextId": "c1", "status": { "state": "canceled" } });
    assert_eq!(result_to_v03("GetTask", task.clone()), task_v03);
    assert_eq!(result_to_v03("CancelTask", task), task_v03);
    let card =
        json!({ "name": "agent", "supportedInterfaces": [{ "url": "https://a.example", "protocolVersion": "1.0" }] });
    assert_eq!(result_to_v03("GetExtendedAgentCard", card.clone()), card);
}

/// `tasks/list` takes the draft params and answers 0.3 tasks.
#[test]
fn task_list_uses_the_draft_params_and_converts_each_task() {
    let params = json!({
        "contextId": "c", "status": "working", "pageSize": 10, "pageToken": "p", "historyLength": 0,
        "lastUpdatedAfter": 1_767_225_600_000_i64, "includeArtifacts": true, "metadata": {},
    });
    assert_eq!(
        params_to_v1("ListTasks", params),
        Ok(json!({
            "contextId": "c", "status": "TASK_STATE_WORKING", "pageSize": 10, "pageToken": "p", "historyLength": 0,
            "statusTimestampAfter": "2026-01-01T00:00:00Z", "includeArtifacts": true,
        }))
    );
    assert_eq!(params_to_v1("ListTasks", Value::Null), Ok(json!({})));
    let list = json!({
        "tasks": [{ "id": "t", "contextId": "c", "status": { "state": "TASK_STATE_WORKING" } }],
        "nextPageToken": "", "pageSize": 50, "totalSize": 1,
    });
    assert_eq!(
        result_to_v03("ListTasks", list),
        json!({
            "tasks": [{ "kind": "task", "id": "t", "contextId": "c", "status": { "state": "working" } }],
            "nextPageToken": "", "pageSize": 50, "totalSize": 1,
        })
    );
}
