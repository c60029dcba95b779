//! Push-notification configs, and the leases under which gateways follow
//! them: each unfinished config is delivered by one gateway at a time.

use std::{collections::HashSet, time::Duration};

use chorus_runtime::time::micros;

use super::TaskStore;
use crate::{
    domain::{Cursor, PendingPush, PushConfig, PushConfigKey, PushLease, now_micros},
    error::Result,
};

impl TaskStore {
    /// Stores the config, followed by `follower` for `lease` when one is
    /// named.
    pub async fn create_push_config(
        &self,
        namespace: &str,
        config: PushConfig,
        after: Option<Cursor>,
        follower: Option<(String, Duration)>,
    ) -> Result<PushConfig> {
        let lease = follower.map(|(follower, lease)| self.push_lease(follower, lease));
        let limit = self.config.max_push_configs_per_task;
        self.repository.create_push_config(namespace, config, after, lease.as_ref(), limit).await
    }

    pub async fn get_push_config(&self, namespace: &str, task_id: &str, id: &str) -> Result<PushConfig> {
        self.repository.get_push_config(namespace, task_id, id).await
    }

    pub async fn list_push_configs(&self, namespace: &str, task_id: &str) -> Result<Vec<PushConfig>> {
        self.repository.list_push_configs(namespace, task_id).await
    }

    pub async fn delete_push_config(&self, namespace: &str, task_id: &str, id: &str) -> Result<()> {
        self.repository.delete_push_config(namespace, task_id, id).await
    }

    pub async fn advance_push_config(
        &self,
        key: &PushConfigKey,
        delivered: Option<Cursor>,
        finished: bool,
        follower: Option<&str>,
    ) -> Result<()> {
        self.repository.advance_push_config(key, delivered, finished, follower).await
    }

    /// Hands `follower` up to `limit` configs no one follows, for `lease`.
    pub async fn claim_push_configs(&self, follower: String, lease: Duration, limit: u32) -> Result<Vec<PendingPush>> {
        let lease = self.push_lease(follower, lease);
        self.repository.claim_push_configs(&lease, now_micros(), limit).await
    }

    /// Extends the leases `follower` holds on the configs of `following`;
    /// those of them it no longer holds (another follower took them, or
    /// they finished or are gone): it must stop delivering them. A config
    /// it holds but does not follow is left to its lease, and then claimed.
    pub async fn renew_push_configs(
        &self,
        follower: String,
        lease: Duration,
        following: Vec<PushConfigKey>,
    ) -> Result<Vec<PushConfigKey>> {
        let held = self.repository.renew_push_configs(&self.push_lease(follower, lease), &following).await?;
        let held: HashSet<PushConfigKey> = held.into_iter().collect();
        Ok(following.into_iter().filter(|key| !held.contains(key)).collect())
    }

    /// Hands back every lease `follower` holds: other followers claim its
    /// configs at once instead of when the leases run out.
    pub async fn release_push_configs(&self, follower: &str) -> Result<u64> {
        self.repository.release_push_configs(follower, now_micros()).await
    }

    /// A lease for `follower` from now, no longer than a worker's may be.
    pub(super) fn push_lease(&self, follower: String, lease: Duration) -> PushLease {
        PushLease { follower, until: now_micros() + micros(lease.min(self.config.max_lease())) }
    }
}
