//! A parallel step's branches: how many run at once, and how their ends
//! settle the step.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::plan::{Flow, Planner, cancel_record, contains, finish};
use crate::domain::{JoinMode, Parallel, Run, Step, StepState, branches_failed};

impl Planner<'_> {
    /// Drives the branches of an active parallel record; true when it settled.
    pub(super) fn settle_parallel(&self, run: &mut Run, index: usize, step: &Step, parallel: &Parallel) -> bool {
        let seq = run.body.steps[index].seq;
        let mut failed = Vec::new();
        let mut outcome = Map::new();
        let mut active = false;
        let mut running = 0;
        for branch in &parallel.branches {
            let started = branch.steps.first().is_none_or(|first| Self::latest_after(run, &first.id, seq).is_some());
            // Branches start in the order declared, while there is room and
            // no failure is about to cancel them.
            let full = parallel.max_concurrency.is_some_and(|max| running >= max);
            if !started && (full || parallel.mode == JoinMode::FailFast && !failed.is_empty()) {
                active = true;
                outcome.insert(branch.name.clone(), json!("active"));
                continue;
            }
            let flow = self.walk(run, &branch.steps, seq, Some(&step.id));
            let state = match flow {
                Flow::Done => "completed",
                Flow::Active => {
                    active = true;
                    running += 1;
                    "active"
                }
                Flow::Failed(error) => {
                    failed.push(format!("branch `{}`: {error}", branch.name));
                    "failed"
                }
            };
            outcome.insert(branch.name.clone(), json!(state));
        }
        let fail_fast = parallel.mode == JoinMode::FailFast && !failed.is_empty();
        if active && !fail_fast {
            return false;
        }
        if fail_fast {
            for record in run.body.steps.iter_mut().filter(|r| r.seq > seq && !r.state.is_finished()) {
                if contains(step, &record.step_id) {
                    cancel_record(Arc::make_mut(record), self.now);
                }
            }
        }
        for state in outcome.values_mut().filter(|state| *state == "active") {
            *state = json!("canceled");
        }
        let record = run.body.step_mut(index);
        record.output = Some(Value::Object(outcome));
        if failed.is_empty() {
            finish(record, StepState::Completed, self.now);
        } else {
            record.error = Some(branches_failed(failed));
            finish(record, StepState::Failed, self.now);
        }
        true
    }
}
