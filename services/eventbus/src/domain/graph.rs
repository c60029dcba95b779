//! The `after` graph: cycle detection at registration, the delivery order of
//! handlers, and for one event which deliveries may go, wait, or are skipped.
//!
//! Readiness is computed from the deliveries of the event itself: a handler
//! waits for the deliveries of the handlers it is after, directly or through
//! handlers that do not take the event. A handler that is not registered, or
//! that has no delivery of the event, holds nothing.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{DeliveryState, FailurePolicy, Handler, SkipReason};

/// Registered handlers of one namespace by name.
pub type Handlers = BTreeMap<String, Handler>;

/// The cycle that a handler `name` with this `after` list would close, as a
/// path that starts and ends with `name` (each runs after the next), or
/// `None`. Only registered handlers are followed; the first cycle in name
/// order is reported.
pub fn find_cycle(handlers: &Handlers, name: &str, after: &[String]) -> Option<Vec<String>> {
    fn visit(
        handlers: &Handlers,
        target: &str,
        node: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let Some(handler) = handlers.get(node) else {
            return false;
        };
        let next: BTreeSet<&String> = handler.after.iter().collect();
        for dependency in next {
            path.push(dependency.clone());
            if dependency == target {
                return true;
            }
            if seen.insert(dependency.clone()) && visit(handlers, target, dependency, path, seen) {
                return true;
            }
            path.pop();
        }
        false
    }

    let mut path = vec![name.to_owned()];
    let firsts: BTreeSet<&String> = after.iter().collect();
    let mut seen = BTreeSet::new();
    for dependency in firsts {
        path.push(dependency.clone());
        if dependency == name {
            return Some(path);
        }
        if seen.insert(dependency.clone()) && visit(handlers, name, dependency, &mut path, &mut seen) {
            return Some(path);
        }
        path.pop();
    }
    None
}

/// Handler names in delivery order: every handler after the handlers it is
/// after; among those free to go, by name.
pub fn topological_order(handlers: &Handlers) -> Vec<String> {
    let mut waiting_on: BTreeMap<&str, usize> = BTreeMap::new();
    let mut dependents: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, handler) in handlers {
        let registered: BTreeSet<&str> =
            handler.after.iter().map(String::as_str).filter(|after| handlers.contains_key(*after)).collect();
        waiting_on.insert(name, registered.len());
        for after in registered {
            dependents.entry(after).or_default().push(name);
        }
    }
    let mut ready: BTreeSet<&str> = waiting_on.iter().filter(|(_, n)| **n == 0).map(|(name, _)| *name).collect();
    let mut order = Vec::with_capacity(handlers.len());
    while let Some(name) = ready.pop_first() {
        order.push(name.to_owned());
        for dependent in dependents.get(name).into_iter().flatten() {
            let count = waiting_on.get_mut(dependent).expect("every dependent is counted");
            *count -= 1;
            if *count == 0 {
                ready.insert(dependent);
            }
        }
    }
    // Registration rejects cycles; should stored data hold one anyway, its
    // members still appear, last and by name.
    let placed: BTreeSet<String> = order.iter().cloned().collect();
    order.extend(handlers.keys().filter(|name| !placed.contains(*name)).cloned());
    order
}

/// One handler's delivery of an event, as readiness sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    pub state: DeliveryState,
    /// Why it failed, when dead-lettered or skipped.
    pub reason: String,
}

/// What may happen to one delivery now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ready,
    /// These dependencies have not finished the event.
    Wait(Vec<String>),
    /// A FAIL-policy dependency dead-lettered or skipped the event.
    Skip(SkipReason),
}

/// The deliveries of the event that `name` waits for.
fn dependencies<'a>(
    handlers: &'a Handlers,
    name: &'a str,
    participants: &BTreeMap<String, Participant>,
) -> BTreeSet<&'a str> {
    let mut found = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = vec![name];
    while let Some(node) = stack.pop() {
        let Some(handler) = handlers.get(node) else { continue };
        for after in &handler.after {
            if !seen.insert(after.as_str()) {
                continue;
            }
            if participants.contains_key(after) {
                found.insert(after.as_str());
            } else {
                stack.push(after);
            }
        }
    }
    found
}

/// Whether `name`'s delivery of an event may go, given every delivery of
/// that event.
pub fn verdict(handlers: &Handlers, name: &str, participants: &BTreeMap<String, Participant>) -> Verdict {
    let mut unfinished = Vec::new();
    for dependency in dependencies(handlers, name, participants) {
        let participant = &participants[dependency];
        match participant.state {
            DeliveryState::Acked => {}
            DeliveryState::DeadLettered | DeliveryState::Skipped => {
                let policy = handlers.get(dependency).map_or(FailurePolicy::Ignore, |h| h.failure_policy);
                if policy == FailurePolicy::Fail {
                    return Verdict::Skip(SkipReason {
                        handler: dependency.to_owned(),
                        message: participant.reason.clone(),
                    });
                }
            }
            DeliveryState::Pending | DeliveryState::InFlight | DeliveryState::Failed => {
                unfinished.push(dependency.to_owned());
            }
        }
    }
    if unfinished.is_empty() { Verdict::Ready } else { Verdict::Wait(unfinished) }
}

/// The deliveries of one event that must now be skipped, in the order they
/// are skipped (a skip can cause further skips down FAIL chains).
pub fn settle(handlers: &Handlers, participants: &mut BTreeMap<String, Participant>) -> Vec<(String, SkipReason)> {
    let mut skipped = Vec::new();
    loop {
        let next = participants
            .iter()
            .filter(|(_, p)| matches!(p.state, DeliveryState::Pending | DeliveryState::Failed))
            .find_map(|(name, _)| match verdict(handlers, name, participants) {
                Verdict::Skip(reason) => Some((name.clone(), reason)),
                Verdict::Ready | Verdict::Wait(_) => None,
            });
        let Some((name, reason)) = next else { return skipped };
        let participant = participants.get_mut(&name).expect("found among the participants");
        participant.state = DeliveryState::Skipped;
        participant.reason = format!("skipped: {} failed: {}", reason.handler, reason.message);
        skipped.push((name, reason));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::{Pattern, RetryPolicy};

    fn handler(name: &str, after: &[&str], policy: FailurePolicy) -> Handler {
        Handler {
            namespace: "ns".into(),
            name: name.into(),
            event_types: vec![Pattern::parse("t", "*").unwrap()],
            after: after.iter().map(|a| (*a).to_owned()).collect(),
            failure_policy: policy,
            retry: RetryPolicy {
                max_attempts: 3,
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(1),
                visibility_timeout: Duration::from_secs(1),
            },
            start_sequence: 1,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn graph(edges: &[(&str, &[&str])]) -> Handlers {
        edges.iter().map(|(name, after)| ((*name).to_owned(), handler(name, after, FailurePolicy::Fail))).collect()
    }

    fn names(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    #[test]
    fn cycles_of_every_length_are_found_with_their_path() {
        let handlers = graph(&[]);
        assert_eq!(find_cycle(&handlers, "a", &names(&["a"])), Some(names(&["a", "a"])));
        let handlers = graph(&[("b", &["a"])]);
        assert_eq!(find_cycle(&handlers, "a", &names(&["b"])), Some(names(&["a", "b", "a"])));
        let handlers = graph(&[("b", &["c"]), ("c", &["a"])]);
        assert_eq!(find_cycle(&handlers, "a", &names(&["b"])), Some(names(&["a", "b", "c", "a"])));
        let handlers = graph(&[("b", &["c"]), ("c", &["d"]), ("d", &["a"])]);
        assert_eq!(find_cycle(&handlers, "a", &names(&["b"])), Some(names(&["a", "b", "c", "d", "a"])));
        assert_eq!(find_cycle(&handlers, "a", &names(&["x"])), None);
        assert_eq!(find_cycle(&handlers, "e", &names(&["b", "d"])), None);
    }

    #[test]
    fn order_is_topological_with_ties_by_name() {
        let handlers = graph(&[("d", &["b", "c"]), ("c", &["a"]), ("b", &["a"]), ("a", &[]), ("z", &["ghost"])]);
        assert_eq!(topological_order(&handlers), names(&["a", "b", "c", "d", "z"]));
    }

    fn participants(states: &[(&str, DeliveryState)]) -> BTreeMap<String, Participant> {
        states
            .iter()
            .map(|(name, state)| ((*name).to_owned(), Participant { state: *state, reason: "boom".into() }))
            .collect()
    }

    #[test]
    fn a_delivery_waits_for_its_dependencies_even_through_non_participants() {
        let handlers = graph(&[("a", &[]), ("b", &["a"]), ("c", &["b"])]);
        let events = participants(&[("a", DeliveryState::InFlight), ("c", DeliveryState::Pending)]);
        assert_eq!(verdict(&handlers, "c", &events), Verdict::Wait(vec!["a".to_owned()]), "a, through b");
        let events = participants(&[("a", DeliveryState::Acked), ("c", DeliveryState::Pending)]);
        assert_eq!(verdict(&handlers, "c", &events), Verdict::Ready);
        let events = participants(&[("c", DeliveryState::Pending)]);
        assert_eq!(verdict(&handlers, "c", &events), Verdict::Ready);
    }

    #[test]
    fn fail_skips_down_the_chain_and_ignore_lets_dependents_go() {
        let mut handlers = graph(&[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("d", &["a"])]);
        let mut events = participants(&[
            ("a", DeliveryState::DeadLettered),
            ("b", DeliveryState::Pending),
            ("c", DeliveryState::Pending),
            ("d", DeliveryState::Pending),
        ]);
        let skipped: Vec<String> = settle(&handlers, &mut events).into_iter().map(|(name, _)| name).collect();
        assert_eq!(skipped, names(&["b", "c", "d"]));

        handlers.get_mut("a").unwrap().failure_policy = FailurePolicy::Ignore;
        let mut events = participants(&[("a", DeliveryState::DeadLettered), ("b", DeliveryState::Pending)]);
        assert!(settle(&handlers, &mut events).is_empty());
        assert_eq!(verdict(&handlers, "b", &events), Verdict::Ready);

        // A skipped IGNORE handler lets its own dependents go.
        handlers.get_mut("a").unwrap().failure_policy = FailurePolicy::Fail;
        handlers.get_mut("b").unwrap().failure_policy = FailurePolicy::Ignore;
        let mut events = participants(&[
            ("a", DeliveryState::DeadLettered),
            ("b", DeliveryState::Pending),
            ("c", DeliveryState::Pending),
        ]);
        let skipped: Vec<String> = settle(&handlers, &mut events).into_iter().map(|(name, _)| name).collect();
        assert_eq!(skipped, names(&["b"]));
        assert_eq!(verdict(&handlers, "c", &events), Verdict::Ready);
    }
}
