//! A gate step's fields: its mode, who decides, what a rejection reruns,
//! when it escalates or expires, and what it shows.

use super::{ExprKind, Node, Scope};
use crate::domain::{Action, Gate, GateMode, OnExhausted, Severity, Step};

impl Scope<'_, '_, '_, '_> {
    /// Warns of what an AUTO gate's rejection reruns by default, the step
    /// before, when that is no work: another gate (whose rerun changes
    /// nothing the condition reads), or nothing (the run then fails). A HITL
    /// gate after a gate sends the work back to the reviewers before.
    fn default_rerun(&mut self, body: &Node<'_>, mode: Option<GateMode>) {
        let (code, message) = match (self.seen.previous, mode) {
            (Some(Step { id, action: Action::Gate(_), .. }), Some(GateMode::Auto)) => (
                "reruns_gate",
                format!(
                    "the step before this gate is the gate `{id}`: a rejection reruns that gate, not the work it \
                     judged; name the work with `rerun_from`"
                ),
            ),
            (None, Some(GateMode::Auto)) => (
                "nothing_to_rerun",
                "no step comes before this gate to run again: a rejection fails the run".to_owned(),
            ),
            _ => return,
        };
        self.reader.report(Severity::Warning, Some(body), self.field, code, message);
    }

    pub(super) fn gate(&mut self, body: &Node<'_>) -> Option<Gate> {
        const FIELDS: &[&str] = &[
            "mode",
            "reviewers",
            "approve_when",
            "rerun_from",
            "max_rejections",
            "on_exhausted",
            "escalate_to",
            "expires_after",
            "artifacts",
        ];
        let fields = self.reader.mapping(body, self.field, FIELDS)?;
        // Each field is checked whatever the others hold, so one pass tells
        // every problem; the gate is made only when all are right.
        let mode_node = self.reader.required(&fields, self.field, "mode", "AUTO or HITL");
        let modes = [("AUTO", GateMode::Auto), ("HITL", GateMode::Hitl)];
        let mode = mode_node.and_then(|node| self.reader.choice(node, &self.path("mode"), &modes));
        let reviewers = self.literal(&fields, "reviewers");
        let approve_when = self.template(&fields, "approve_when", ExprKind::Condition);
        // One given but wrong has had its own error.
        match mode {
            Some(GateMode::Auto) if fields.get("approve_when").is_none() => {
                self.reader.error(
                    Some(body),
                    &self.path("approve_when"),
                    "missing_field",
                    "an AUTO gate needs `approve_when`, the condition that approves",
                );
            }
            Some(GateMode::Hitl) if fields.get("reviewers").is_none() => {
                self.reader.error(
                    Some(body),
                    &self.path("reviewers"),
                    "missing_field",
                    "a HITL gate needs `reviewers`, the role that decides",
                );
            }
            Some(GateMode::Auto | GateMode::Hitl) | None => {}
        }
        let rerun_from = self.string(&fields, "rerun_from");
        if rerun_from.is_none() {
            self.default_rerun(body, mode);
        }
        if let Some(target) = &rerun_from
            && let Some(holder) = self.seen.earlier.get(target).filter(|holder| *holder != target)
        {
            let message = format!(
                "`{target}` is inside the parallel step `{holder}`: a rejection reruns all of `{holder}`, every \
                 branch; name `{holder}` to say so"
            );
            let node = fields.get("rerun_from");
            self.reader.report(Severity::Warning, node, &self.path("rerun_from"), "reruns_parallel", message);
        }
        if let Some(target) = &rerun_from
            && !self.seen.earlier.contains_key(target)
        {
            let message = if self.seen.visible.contains(target) {
                format!(
                    "`{target}` is outside this gate's parallel branch; a gate in a branch can only rerun a step \
                     before it in the same branch"
                )
            } else if let Some(line) = self.walk.declared.get(target) {
                format!(
                    "`{target}` (line {line}) is in another branch of a parallel step; a gate in a branch can only \
                     rerun a step before it in the same branch"
                )
            } else {
                format!("`{target}` is not a step before this gate; a rejection can only rerun an earlier step")
            };
            self.reader.error(fields.get("rerun_from"), &self.path("rerun_from"), "bad_reference", message);
        }
        let max_rejections = match fields.get("max_rejections") {
            None => Some(3),
            Some(node) => self.reader.integer(node, &self.path("max_rejections"), 0, 100),
        };
        let on_exhausted = match fields.get("on_exhausted") {
            None => Some(OnExhausted::Fail),
            Some(node) => self.reader.choice(
                node,
                &self.path("on_exhausted"),
                &[("escalate", OnExhausted::Escalate), ("fail", OnExhausted::Fail)],
            ),
        };
        let escalate_to = self.literal(&fields, "escalate_to");
        if on_exhausted == Some(OnExhausted::Escalate) && escalate_to.is_none() {
            self.reader.error(
                Some(body),
                &self.path("escalate_to"),
                "missing_field",
                "`on_exhausted: escalate` needs `escalate_to`, the role that decides then",
            );
        }
        let expires_after = self.duration(&fields, "expires_after");
        let artifacts = self.templated_value(&fields, "artifacts");
        let escalates = on_exhausted == Some(OnExhausted::Escalate);
        let unused = [
            ("reviewers", mode == Some(GateMode::Auto), "an AUTO gate is decided by `approve_when`, not by reviewers"),
            ("approve_when", mode == Some(GateMode::Hitl), "a HITL gate is decided by its reviewers"),
            (
                "escalate_to",
                on_exhausted.is_some() && !escalates,
                "only `on_exhausted: escalate` hands the gate to `escalate_to`",
            ),
            (
                "expires_after",
                mode == Some(GateMode::Auto) && !escalates,
                "an AUTO gate decides at once; only its escalation (`on_exhausted: escalate`) waits and expires",
            ),
        ];
        for (field, ignored, why) in unused {
            if ignored && let Some(node) = fields.get(field) {
                let message = format!("`{field}` is ignored: {why}");
                self.reader.report(Severity::Warning, Some(node), &self.path(field), "unused_field", message);
            }
        }
        Some(Gate {
            mode: mode?,
            reviewers,
            approve_when,
            rerun_from,
            max_rejections: max_rejections?,
            on_exhausted: on_exhausted?,
            escalate_to,
            expires_after,
            artifacts,
        })
    }
}
