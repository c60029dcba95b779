//! The turns this gateway runs itself (its workflow and remote agents'),
//! followed in the task store under a lease: every third of a lease it
//! renews what it follows and claims the unfinished tasks a dead gateway
//! followed, and catches each up with the run or remote task behind it. A
//! gateway restarted under its name takes its previous run's at once.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use chorus_proto::taskstore as pb;
use chorus_runtime::outage::Outage;
use tokio_util::task::TaskTracker;
use tonic::Status;

use super::{Runner, Written};
use crate::{catalog::Catalog, config::AgentConfig};

/// Tasks claimed per call.
const CLAIM_PAGE: u32 = 50;
/// The first pause before a turn whose service was out of reach is taken
/// up again; it doubles up to a lease.
const FIRST_PAUSE: Duration = Duration::from_millis(250);
/// How long such a turn is taken up again before its error is left to stand.
const GIVE_UP_AFTER: Duration = Duration::from_secs(300);

/// A followed task: (namespace, task id).
type Key = (String, String);
/// A watched gate: (namespace, task id, gate, round).
type GateKey = (String, String, String, u32);

/// What this gateway follows, and under which name.
#[derive(Debug, Clone)]
pub(crate) struct Turns {
    follower: String,
    lease: Duration,
    following: Arc<Mutex<HashSet<Key>>>,
    /// The gates a turn here watches: (namespace, task id, gate, round).
    watching: Arc<Mutex<HashSet<GateKey>>>,
}

/// A gate a turn watches, until dropped.
pub(super) struct Watching {
    watching: Arc<Mutex<HashSet<GateKey>>>,
    key: GateKey,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.watching.lock().expect("watched gates lock").remove(&self.key);
    }
}

impl Turns {
    /// Turns followed as `follower`, under leases of `lease`.
    pub(crate) fn new(follower: String, lease: Duration) -> Self {
        Self { follower, lease, following: Arc::default(), watching: Arc::default() }
    }

    /// Notes that a turn watches the gate `gate` (round `round`) of a task,
    /// unless another turn here already does: two would only both see it
    /// decided (a reply that did not decide it re-arms a watch).
    pub(super) fn watch(&self, namespace: &str, task_id: &str, gate: &str, round: u32) -> Option<Watching> {
        let key = (namespace.to_owned(), task_id.to_owned(), gate.to_owned(), round);
        let fresh = self.watching.lock().expect("watched gates lock").insert(key.clone());
        fresh.then(|| Watching { watching: Arc::clone(&self.watching), key })
    }

    /// This gateway as a new task's follower.
    pub(super) fn follower(&self) -> pb::TurnFollower {
        pb::TurnFollower { name: self.follower.clone(), lease_ms: self.lease_ms() }
    }

    /// Notes a task this gateway follows from now on.
    pub(super) fn followed(&self, namespace: &str, task_id: &str) {
        self.following().insert((namespace.to_owned(), task_id.to_owned()));
    }

    /// Whether this gateway follows a task: it runs the task's turns.
    pub(super) fn follows(&self, namespace: &str, task_id: &str) -> bool {
        self.following().contains(&(namespace.to_owned(), task_id.to_owned()))
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    fn following(&self) -> std::sync::MutexGuard<'_, HashSet<Key>> {
        self.following.lock().expect("followed turns lock")
    }
}

impl Runner {
    /// Hands back the leases of this gateway's previous run, then keeps
    /// following until shutdown, when it hands its own back.
    pub(crate) fn keep_following(&self, catalog: Catalog, lingering: &TaskTracker) {
        let runner = self.clone();
        lingering.spawn(async move {
            tokio::select! {
                () = runner.hold(&catalog) => {}
                () = runner.shutdown.cancelled() => {}
            }
            let release = pb::ReleaseFollowedTasksRequest { follower: runner.turns.follower.clone() };
            if let Err(status) = runner.tasks.clone().release_followed_tasks(release).await {
                tracing::warn!(error = %status.message(), "cannot hand back the turns this gateway follows");
            }
        });
    }

    async fn hold(&self, catalog: &Catalog) {
        let release = pb::ReleaseFollowedTasksRequest { follower: self.turns.follower.clone() };
        while let Err(status) = self.tasks.clone().release_followed_tasks(release.clone()).await {
            tracing::warn!(error = %status.message(), "cannot hand back the turns of this gateway's previous run");
            tokio::time::sleep(self.turns.lease / 3).await;
        }
        let mut outage = Outage::default();
        let what = "renewing the turns this gateway follows";
        loop {
            outage.track(what, self.renew_and_claim(catalog).await.map_err(|status| status.message().to_owned()));
            tokio::time::sleep((self.turns.lease / 3).max(Duration::from_millis(1))).await;
        }
    }

    /// Renews the leases held, forgets the tasks lost, and takes up those
    /// no live gateway follows, a page at a time.
    async fn renew_and_claim(&self, catalog: &Catalog) -> Result<(), Status> {
        let mut following: Vec<pb::TaskKey> = self
            .turns
            .following()
            .iter()
            .map(|(namespace, task_id)| pb::TaskKey { namespace: namespace.clone(), task_id: task_id.clone() })
            .collect();
        loop {
            let request = pb::KeepFollowingTasksRequest {
                follower: self.turns.follower.clone(),
                lease_ms: self.turns.lease_ms(),
                following: std::mem::take(&mut following),
                claim: CLAIM_PAGE,
            };
            let kept = self.tasks.clone().keep_following_tasks(request).await?.into_inner();
            let last_page = kept.claimed.len() < CLAIM_PAGE as usize;
            let mut held = self.turns.following();
            for lost in kept.lost {
                held.remove(&(lost.namespace, lost.task_id));
            }
            // A task a turn here still follows (its lease lapsed while the
            // task store was out of reach) is not taken up a second time.
            let claimed: Vec<pb::TaskKey> = kept
                .claimed
                .into_iter()
                .filter(|claimed| held.insert((claimed.namespace.clone(), claimed.task_id.clone())))
                .collect();
            drop(held);
            for claimed in claimed {
                self.clone().take_up(catalog.clone(), claimed);
            }
            if last_page {
                return Ok(());
            }
        }
    }

    /// Catches a claimed task up with the run or remote task behind it.
    fn take_up(self, catalog: Catalog, key: pb::TaskKey) {
        tokio::spawn(async move {
            let taken_up = async {
                let (namespace, task_id) = (key.namespace.as_str(), key.task_id.as_str());
                let first = self.read(namespace, task_id).await;
                let task = self.patiently(task_id, first, || self.read(namespace, task_id)).await?;
                let Some(agent) = catalog.agent(&task.agent_id) else { return Ok(()) };
                tracing::info!(%task_id, agent = %agent.id, "taking up a turn whose gateway died or restarted");
                let outcome = self.resume(agent, namespace, task).await;
                self.carry_on(agent, namespace, task_id, outcome).await
            };
            let outcome = tokio::select! {
                outcome = taken_up => outcome,
                () = self.shutdown.cancelled() => Ok(()),
            };
            if let Err(status) = outcome {
                tracing::debug!(task_id = %key.task_id, error = %status.message(), "taken-up turn ended early");
            }
        });
    }

    /// A turn's `outcome`; while it failed for a service out of reach (the
    /// workflow engine, the task store), the turn taken up again from the
    /// task as it then is.
    pub(super) async fn carry_on(
        &self,
        agent: &AgentConfig,
        namespace: &str,
        task_id: &str,
        outcome: Written,
    ) -> Written {
        let again = move || async move { self.resume(agent, namespace, self.read(namespace, task_id).await?).await };
        self.patiently(task_id, outcome, again).await
    }

    /// `first`, a call's outcome on the task; while it failed for a service
    /// out of reach, the call made `again`, with backoff, for up to
    /// [`GIVE_UP_AFTER`].
    async fn patiently<T, F>(
        &self,
        task_id: &str,
        first: Result<T, Status>,
        mut again: impl FnMut() -> F,
    ) -> Result<T, Status>
    where
        F: Future<Output = Result<T, Status>>,
    {
        let mut outcome = first;
        let mut pause = FIRST_PAUSE;
        let started = tokio::time::Instant::now();
        while let Err(status) = &outcome
            && crate::service::worth_reopening(status)
            && started.elapsed() < GIVE_UP_AFTER
        {
            tracing::info!(%task_id, error = %status.message(), "a turn's service is out of reach; trying again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(self.turns.lease);
            outcome = again().await;
        }
        outcome
    }

    async fn read(&self, namespace: &str, task_id: &str) -> Result<pb::Task, Status> {
        let request =
            pb::GetTaskRequest { namespace: namespace.to_owned(), id: task_id.to_owned(), history_length: None };
        Ok(self.tasks.clone().get_task(request).await?.into_inner())
    }
}
