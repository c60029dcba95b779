//! Where chorus's own agents (`echo`, `reviewer`, the phase agents) work,
//! and under which worker ids.

use chorus_runtime::metrics::Metrics;

use crate::{Client, Worker};

/// How many times a task of chorus's own agents is requeued after its
/// worker went away (its process restarted, its lease ran out) before it
/// fails: their work is safe to do again.
pub const RETRIES: u32 = 2;

/// The namespace an agent of chorus works in, and the name its worker ids
/// are made from.
#[derive(Debug, Clone)]
pub struct Placement {
    namespace: String,
    name: Option<String>,
    metrics: Metrics,
}

impl Placement {
    /// Working on `namespace`'s tasks, under a new worker id per process.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: None, metrics: Metrics::default() }
    }

    /// Worker ids `{agent}@{name}`: with a name kept across restarts of the
    /// process (a pod's, say), a restart requeues at once the tasks its
    /// previous run held, instead of when their leases run out. No two live
    /// processes may share one.
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The workers count into `metrics` ([`Worker::metrics`]).
    #[must_use]
    pub fn counted_in(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A worker of `agent_id` placed so.
    pub(crate) fn worker(&self, client: Client, agent_id: &str) -> Worker {
        let worker =
            Worker::new(client, agent_id).namespace(&self.namespace).max_retries(RETRIES).metrics(self.metrics.clone());
        match &self.name {
            Some(name) => worker.worker_id(format!("{agent_id}@{name}")),
            None => worker,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_named_placement_gives_each_agent_a_stable_id() {
        let client = crate::client_over(chorus_runtime::transport::Transport::later().0);
        let named = Placement::new("ns").named("pod-1");
        assert_eq!(named.worker(client.clone(), "echo").id(), "echo@pod-1");
        assert_eq!(named.worker(client.clone(), "echo").id(), named.worker(client.clone(), "echo").id());
        let anonymous = Placement::new("ns");
        assert_ne!(anonymous.worker(client.clone(), "echo").id(), anonymous.worker(client, "echo").id());
    }
}
