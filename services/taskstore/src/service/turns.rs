//! The gateways that follow the tasks whose turns they run themselves: each
//! such unfinished task is followed by one gateway at a time, under a lease.

use std::{collections::HashSet, time::Duration};

use super::TaskStore;
use crate::{
    domain::{Followed, TaskKey, now_micros},
    error::Result,
};

impl TaskStore {
    /// Has `follower` follow the task for `lease` (whoever followed it no
    /// longer does), or no one when `lease` is `None`.
    pub async fn follow_task(
        &self,
        namespace: &str,
        task_id: &str,
        follower: String,
        lease: Option<Duration>,
    ) -> Result<()> {
        let lease = lease.map(|lease| self.push_lease(follower, lease));
        self.repository.follow_task(namespace, task_id, lease.as_ref()).await
    }

    /// Extends the leases `follower` holds on the tasks of `following`, then
    /// hands it up to `claim` unfinished tasks whose follower's lease ran
    /// out. Those of `following` it no longer holds (finished, gone, or
    /// taken over) are `lost`: it must stop following them.
    pub async fn keep_following(
        &self,
        follower: String,
        lease: Duration,
        following: Vec<TaskKey>,
        claim: u32,
    ) -> Result<Followed> {
        let lease = self.push_lease(follower, lease);
        let held: HashSet<TaskKey> = self.repository.renew_turns(&lease, &following).await?.into_iter().collect();
        let lost = following.into_iter().filter(|key| !held.contains(key)).collect();
        let claimed = self.repository.claim_turns(&lease, now_micros(), claim).await?;
        Ok(Followed { lost, claimed })
    }

    /// Hands back every lease `follower` holds on tasks: others claim them
    /// at once instead of when the leases run out.
    pub async fn release_followed_tasks(&self, follower: &str) -> Result<u64> {
        self.repository.release_turns(follower, now_micros()).await
    }
}
