//! Domain ↔ wire conversions.

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use chorus_proto::json::struct_from_json;
use chorus_proto::workflow as pb;
use chorus_runtime::{time::timestamp, validate::FieldViolation};

use crate::domain::{Definition, PageToken, Problem, Severity};

pub fn problem_out(problem: Problem) -> pb::ValidationProblem {
    let severity = match problem.severity {
        Severity::Error => pb::validation_problem::Severity::Error,
        Severity::Warning => pb::validation_problem::Severity::Warning,
    };
    pb::ValidationProblem {
        severity: severity.into(),
        file: problem.file,
        line: problem.line,
        column: problem.column,
        field: problem.field,
        code: problem.code,
        message: problem.message,
    }
}

pub(super) fn definition_out(definition: Definition) -> pb::Definition {
    pb::Definition {
        namespace: definition.namespace,
        name: definition.name,
        version: definition.version,
        description: definition.description,
        triggers: definition
            .triggers
            .into_iter()
            .map(|trigger| pb::Trigger {
                event_type: trigger.event_type,
                filter: Some(struct_from_json(trigger.filter)),
                cron: trigger.cron.unwrap_or_default(),
            })
            .collect(),
        source: definition.source,
        file: definition.file,
        source_sha256: definition.source_sha256,
        created_by: definition.created_by,
        created_at: Some(timestamp(definition.created_at)),
        disabled: definition.disabled.map(|disabled| pb::WorkflowDisabled {
            disabled_by: disabled.by,
            reason: disabled.reason,
            disabled_at: Some(timestamp(disabled.at)),
        }),
    }
}

pub(super) fn token_out(token: PageToken) -> String {
    let text = match token {
        PageToken::AfterName(name) => format!("n:{name}"),
        PageToken::BelowVersion(version) => format!("v:{version}"),
    };
    URL_SAFE_NO_PAD.encode(text)
}

pub(super) fn token_in(value: &str) -> Result<Option<PageToken>, FieldViolation> {
    if value.is_empty() {
        return Ok(None);
    }
    let bad = || FieldViolation::new("page_token", "is not a token this service returned");
    let bytes = URL_SAFE_NO_PAD.decode(value).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    if let Some(name) = text.strip_prefix("n:") {
        return Ok(Some(PageToken::AfterName(name.to_owned())));
    }
    let version = text.strip_prefix("v:").and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    Ok(Some(PageToken::BelowVersion(version)))
}
