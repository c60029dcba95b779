//! What the A2A operations make of a request's message and options before
//! they act: unset empty strings, required fields, accepted media types,
//! and how much history an answer carries.

use a2a::{Message, Role, SendMessageRequest, Task};

use crate::{
    builtin,
    config::AgentConfig,
    error::{GatewayError, Result},
};

/// The task with only the latest `length` messages of its history (all of
/// them when unset), as `historyLength` asks.
pub(super) fn keep_latest(mut task: Task, length: Option<u32>) -> Task {
    if let (Some(length), Some(history)) = (length, task.history.as_mut()) {
        let older = history.len().saturating_sub(length as usize);
        history.drain(..older);
        if history.is_empty() {
            task.history = None;
        }
    }
    task
}

/// `historyLength`: unset is the whole history; negative is an error.
pub(crate) fn history_length(value: Option<i32>) -> Result<Option<u32>> {
    value
        .map(|length| {
            u32::try_from(length)
                .map_err(|_| GatewayError::InvalidParams("historyLength must not be negative".to_owned()))
        })
        .transpose()
}

/// The request with its message's empty optional strings unset. They are
/// proto3 strings: ProtoJSON's `""` is their default, the same as no value
/// (as the gRPC binding reads them), not a task id or a media type to check.
pub(super) fn without_empty_strings(mut request: SendMessageRequest) -> SendMessageRequest {
    let unset_empty = |text: &mut Option<String>| {
        if text.as_deref() == Some("") {
            *text = None;
        }
    };
    let message = &mut request.message;
    unset_empty(&mut message.task_id);
    unset_empty(&mut message.context_id);
    for part in &mut message.parts {
        unset_empty(&mut part.media_type);
        unset_empty(&mut part.filename);
    }
    request
}

pub(super) fn validate_message(message: &Message) -> Result<()> {
    if message.message_id.is_empty() {
        return Err(GatewayError::InvalidParams("message.messageId is required".to_owned()));
    }
    if message.parts.is_empty() {
        return Err(GatewayError::InvalidParams("message.parts must not be empty".to_owned()));
    }
    if message.role == Role::Unspecified {
        return Err(GatewayError::InvalidParams("message.role must be ROLE_USER or ROLE_AGENT".to_owned()));
    }
    let metadata = message.metadata.as_ref();
    if let Some(key) =
        builtin::LINK_KEYS.iter().find(|key| metadata.is_some_and(|metadata| metadata.contains_key(**key)))
    {
        return Err(GatewayError::InvalidParams(format!("message.metadata.{key} is reserved for chorus")));
    }
    Ok(())
}

/// Every part's media type must be one the agent accepts, compared on type
/// and subtype, whatever their case and parameters (RFC 9110 §8.3.1):
/// `text/plain; charset=utf-8` is `text/plain`.
pub(super) fn check_input_modes(agent: &AgentConfig, message: &Message) -> Result<()> {
    let essence = |media_type: &str| {
        let essence = media_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        match essence.split_once('/') {
            Some((kind, subtype)) => (kind.to_owned(), subtype.to_owned()),
            None => (essence, String::new()),
        }
    };
    let accepts = |media_type: &str| {
        let (kind, subtype) = essence(media_type);
        agent.input_modes.iter().any(|mode| match essence(mode) {
            (any, _) if any == "*" => true,
            (mode_kind, mode_subtype) => mode_kind == kind && (mode_subtype == "*" || mode_subtype == subtype),
        })
    };
    // A data part is JSON whether it says so or not.
    let mut typed = message.parts.iter().filter_map(|part| match (&part.media_type, &part.content) {
        (Some(media_type), _) => Some(media_type.as_str()),
        (None, a2a::PartContent::Data(_)) => Some("application/json"),
        (None, _) => None,
    });
    match typed.find(|media_type| !accepts(media_type)) {
        Some(media_type) => Err(GatewayError::ContentTypeNotSupported(format!(
            "agent {} does not accept {media_type}; it accepts {}",
            agent.id,
            agent.input_modes.join(", ")
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use a2a::Part;

    use super::*;
    use crate::config::GatewayConfig;

    fn agent_accepting(modes: &[&str]) -> AgentConfig {
        let catalog = crate::catalog::Catalog::new(&GatewayConfig::default(), "http://h").expect("catalog");
        let mut agent = catalog.agent("echo").expect("echo").clone();
        agent.input_modes = modes.iter().map(|mode| (*mode).to_owned()).collect();
        agent
    }

    fn message_of(media_type: &str) -> Message {
        let mut part = Part::text("x");
        part.media_type = Some(media_type.to_owned());
        Message::new(Role::User, vec![part])
    }

    #[test]
    fn media_types_match_on_type_and_subtype_whatever_their_case_and_parameters() {
        let plain = agent_accepting(&["text/plain", "application/json"]);
        for accepted in ["text/plain", "text/plain; charset=utf-8", "Text/Plain", "application/json;charset=UTF-8"] {
            assert!(check_input_modes(&plain, &message_of(accepted)).is_ok(), "{accepted}");
        }
        for refused in ["text/html", "text/plainer", "image/png", "text"] {
            let error = check_input_modes(&plain, &message_of(refused));
            assert!(matches!(error, Err(GatewayError::ContentTypeNotSupported(_))), "{refused}");
        }
        let images = agent_accepting(&["image/*"]);
        assert!(check_input_modes(&images, &message_of("IMAGE/PNG; q=1")).is_ok());
        assert!(check_input_modes(&images, &message_of("imagery/png")).is_err(), "a type, not a prefix");
        assert!(check_input_modes(&agent_accepting(&["*/*"]), &message_of("video/mp4")).is_ok());
        let data = Message::new(Role::User, vec![Part::data(serde_json::json!({"a": 1}))]);
        let error = check_input_modes(&agent_accepting(&["text/plain"]), &data);
        assert!(matches!(error, Err(GatewayError::ContentTypeNotSupported(_))), "a data part is JSON: {error:?}");
        assert!(check_input_modes(&plain, &data).is_ok());
        assert!(
            check_input_modes(
                &agent_accepting(&["application/json"]),
                &Message::new(Role::User, vec![Part::text("x")])
            )
            .is_ok(),
            "text without a type is not judged"
        );
    }

    #[test]
    fn empty_strings_are_unset_but_empty_text_is_kept() {
        let mut message = message_of("");
        message.task_id = Some(String::new());
        message.context_id = Some(String::new());
        message.parts[0].filename = Some(String::new());
        message.parts.push(Part::text(""));
        let request = SendMessageRequest { message, configuration: None, metadata: None, tenant: None };
        let message = without_empty_strings(request).message;
        assert_eq!((message.task_id, message.context_id), (None, None));
        assert_eq!((&message.parts[0].media_type, &message.parts[0].filename), (&None, &None));
        assert_eq!(message.parts[1].as_text(), Some(""), "an empty text is content, not an unset field");
    }

    #[test]
    fn history_keeps_the_latest_messages_asked_for() {
        let history: Vec<Message> = (0..3).map(|n| Message::new(Role::User, vec![Part::text(n.to_string())])).collect();
        let status = a2a::TaskStatus { state: a2a::TaskState::Working, message: None, timestamp: None };
        let task = Task {
            id: "t".to_owned(),
            context_id: "c".to_owned(),
            status,
            artifacts: None,
            history: Some(history.clone()),
            metadata: None,
        };
        assert_eq!(keep_latest(task.clone(), None).history, Some(history.clone()));
        assert_eq!(keep_latest(task.clone(), Some(2)).history, Some(history[1..].to_vec()));
        assert_eq!(keep_latest(task.clone(), Some(5)).history, Some(history));
        assert_eq!(keep_latest(task, Some(0)).history, None);
    }
}
