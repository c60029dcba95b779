//! YAML definition → [`WorkflowSpec`], or every problem found.
//!
//! Parsing reads the whole document and reports each problem with its file,
//! line, column and field path; templates and conditions are then compiled
//! with minijinja and their references checked against the steps before
//! them. An invalid definition yields no spec.

mod expr;
mod reader;
mod steps;
mod top;

use chorus_runtime::egress::EgressGuard;
use saphyr::{LoadableYamlNode, MarkedYaml};

pub(crate) use self::expr::{condition_holds, condition_source, environment};
use self::reader::Reader;
use crate::domain::{Problem, WorkflowSpec, has_errors, sort_problems};

/// The outcome of parsing one source.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// Set when there is no error (warnings may remain).
    pub spec: Option<WorkflowSpec>,
    /// The YAML `name`, when it could be read.
    pub name: Option<String>,
    /// Errors first, then warnings, each in source order.
    pub problems: Vec<Problem>,
}

/// Parses and validates a definition `source` read from `file`.
pub fn parse(source: &str, file: &str) -> Parsed {
    parse_for(source, file, None)
}

/// As [`parse`], for a server whose webhooks go through `guard`: a webhook
/// it would refuse (a loopback or private address) is warned of, as every
/// attempt of its step would fail.
pub fn parse_for(source: &str, file: &str, guard: Option<&EgressGuard>) -> Parsed {
    let mut reader = Reader::new(file);
    let documents = match MarkedYaml::load_from_str(source) {
        Ok(documents) => documents,
        Err(error) => {
            let marker = error.marker();
            reader.problems.push(Problem {
                severity: crate::domain::Severity::Error,
                file: file.to_owned(),
                line: u32::try_from(marker.line()).unwrap_or(u32::MAX),
                column: u32::try_from(marker.col() + 1).unwrap_or(u32::MAX),
                field: String::new(),
                code: "yaml_syntax".into(),
                message: format!("malformed YAML: {}", error.info()),
            });
            return Parsed { spec: None, name: None, problems: reader.problems };
        }
    };
    let [document] = documents.as_slice() else {
        let message = format!("expected exactly one YAML document, found {}", documents.len());
        reader.error(None, "", "document_count", message);
        return Parsed { spec: None, name: None, problems: reader.problems };
    };
    let (draft, walk) = top::definition(&mut reader, document);
    let inputs = draft.as_ref().map(|spec| spec.inputs.iter().map(|input| input.name.as_str()).collect());
    expr::check(&mut reader, &walk.expressions, &walk.declared, inputs.as_ref());
    if let Some(guard) = guard {
        for (url, placed) in &walk.webhooks {
            if let Some(refused) = refused_webhook(guard, url) {
                reader.problems.push(Problem {
                    severity: crate::domain::Severity::Warning,
                    file: file.to_owned(),
                    line: placed.line,
                    column: placed.column,
                    field: placed.field.clone(),
                    code: "webhook_refused".into(),
                    message: format!("this server will refuse it, so every attempt of the step fails: {refused}"),
                });
            }
        }
    }
    let mut problems = reader.problems;
    sort_problems(&mut problems);
    let name = draft.as_ref().map(|spec| spec.name.clone()).filter(|name| !name.is_empty());
    let spec = draft.filter(|_| !has_errors(&problems));
    Parsed { spec, name, problems }
}

/// Why `guard` refuses `url` before resolving it: an address written out,
/// or `localhost`, which every resolver takes to loopback.
fn refused_webhook(guard: &EgressGuard, url: &str) -> Option<chorus_runtime::egress::Refused> {
    let mut url = reqwest::Url::parse(url).ok()?;
    let host = url.host_str()?.to_ascii_lowercase();
    let named = host == "localhost" || host.ends_with(".localhost");
    if named {
        url.set_host(Some("127.0.0.1")).ok()?;
    }
    let mut refused = guard.vet_url(&url).err()?;
    if named {
        refused.host = host;
    }
    Some(refused)
}

#[cfg(test)]
mod tests;
