//! The claims this repository handed out, remembered until their completion:
//! what the one-statement completion needs of the task (its context, and the
//! status its artifacts' events carry) without reading the row first.
//!
//! A remembered status is a guess, checked by the completion statement
//! itself, which completes the task only while its status is still that one.
//! A guess gone stale (the worker reported a status since, another replica
//! served that report) completes nothing, and the completion falls back to
//! reading the row.

use std::{collections::HashMap, sync::Mutex};

use crate::domain::{Task, TaskStatus};

/// Most claims remembered at once. Claims completed elsewhere (another
/// replica, the reaper) are never taken here: when this many are held, all
/// are forgotten, and their completions read the row, as without this.
const CAPACITY: usize = 16_384;

type Key = (String, String);

/// What a claim's completion needs to know of its task.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct HeldClaim {
    pub(super) context_id: String,
    /// The task's status when it was claimed.
    pub(super) status: TaskStatus,
}

/// Held claims by task: the lease, and what its completion needs.
#[derive(Debug, Default)]
pub(super) struct HeldClaims {
    inner: Mutex<HashMap<Key, (String, HeldClaim)>>,
}

impl HeldClaims {
    /// Remembers that `task`, as it now is, is leased under `lease_id`.
    pub(super) fn hold(&self, task: &Task, lease_id: &str) {
        let claim = HeldClaim { context_id: task.context_id.clone(), status: task.status.clone() };
        let mut held = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.len() >= CAPACITY {
            held.clear();
        }
        held.insert((task.namespace.clone(), task.id.clone()), (lease_id.to_owned(), claim));
    }

    /// Forgets the task's claim; returns it when it was under `lease_id`.
    pub(super) fn take(&self, namespace: &str, task_id: &str, lease_id: &str) -> Option<HeldClaim> {
        let mut held = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (lease, claim) = held.remove(&(namespace.to_owned(), task_id.to_owned()))?;
        (lease == lease_id).then_some(claim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Message, Role, SpawnContext, TaskState};

    fn task(id: &str) -> Task {
        Task {
            namespace: "ns".into(),
            id: id.into(),
            context_id: format!("ctx-{id}"),
            agent_id: "agent".into(),
            status: TaskStatus { state: TaskState::Working, message: None, timestamp: 7 },
            artifacts: Vec::new(),
            history: vec![Message::text("m", Role::User, "hi")],
            metadata: None,
            parent_id: None,
            owner: None,
            depth: 0,
            spawn_context: SpawnContext::Agent,
            attempt: 1,
            created_at: 1,
        }
    }

    #[test]
    fn a_claim_is_taken_once_and_only_under_its_lease() {
        let held = HeldClaims::default();
        held.hold(&task("a"), "lease-a");
        held.hold(&task("b"), "lease-b");
        let claim = held.take("ns", "a", "lease-a").expect("held");
        assert_eq!(claim.context_id, "ctx-a");
        assert_eq!(claim.status.timestamp, 7);
        assert!(held.take("ns", "a", "lease-a").is_none(), "taken once");
        assert!(held.take("ns", "b", "another lease").is_none());
        assert!(held.take("ns", "b", "lease-b").is_none(), "a wrong lease forgets the claim too");
        assert!(held.take("other", "a", "lease-a").is_none());
    }

    #[test]
    fn forgets_everything_when_full() {
        let held = HeldClaims::default();
        for n in 0..=CAPACITY {
            held.hold(&task(&n.to_string()), "lease");
        }
        assert!(held.take("ns", "0", "lease").is_none());
        assert!(held.take("ns", &(CAPACITY - 1).to_string(), "lease").is_none());
        assert!(held.take("ns", &CAPACITY.to_string(), "lease").is_some());
    }
}
