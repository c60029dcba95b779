//! The leases under which this gateway follows push configs: renewed every
//! third of a lease, claimed when no gateway holds them, handed back when
//! the gateway starts and stops.

use std::time::Duration;

use chorus_proto::taskstore as pb;
use chorus_runtime::outage::Outage;
use tokio_util::task::TaskTracker;

use super::{ConfigKey, PushDispatcher};
use crate::push;

/// How many configs no gateway follows one claim takes.
const CLAIM_PAGE: u32 = 100;

/// What the rounds do, as their outages say.
const RENEW: &str = "renewing the leases of the push configs followed";
const CLAIM: &str = "claiming the push configs no gateway follows";

/// How long a stopping gateway waits for the task store to take its leases
/// back.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

impl PushDispatcher {
    /// Keeps, in the background until shutdown, the leases of the configs
    /// this gateway follows, and follows those no gateway holds; hands the
    /// leases back on shutdown, in a task of `lingering`, which the process
    /// waits for before it exits.
    pub(crate) fn keep_leases(&self, lingering: &TaskTracker) {
        let dispatcher = self.clone();
        lingering.spawn(async move {
            tokio::select! {
                () = dispatcher.hold() => {}
                () = dispatcher.shutdown.cancelled() => {}
            }
            dispatcher.release().await;
        });
    }

    /// Hands back the leases of this gateway's previous run (it follows none
    /// of their configs), waiting for the task store; then, every third of a
    /// lease, renews the leases it holds and claims the configs no one does.
    async fn hold(&self) {
        let mut failures = 0;
        while let Err(status) = self.tasks.clone().release_push_configs(self.release_request()).await {
            failures += 1;
            tracing::warn!(failures, error = %status.message(), "cannot hand back the push configs of this gateway's previous run");
            tokio::time::sleep(push::backoff(&self.policy, failures, None)).await;
        }
        let (mut renewing, mut claiming) = (Outage::default(), Outage::default());
        loop {
            renewing.track(RENEW, self.renew().await.map_err(|status| status.message().to_owned()));
            claiming.track(CLAIM, self.claim().await.map_err(|status| status.message().to_owned()));
            tokio::time::sleep(self.policy.renew_every()).await;
        }
    }

    /// Renews the leases this gateway holds, and stops following the configs
    /// it no longer holds.
    async fn renew(&self) -> Result<(), tonic::Status> {
        let followers: Vec<(ConfigKey, u64)> = {
            let following = self.following.lock().expect("push followers lock");
            following.iter().map(|(key, follower)| (key.clone(), follower.id)).collect()
        };
        let request = pb::RenewPushConfigsRequest {
            follower: self.follower.clone(),
            lease_ms: self.policy.lease_ms,
            following: followers.iter().map(|((namespace, task_id, id), _)| key_out(namespace, task_id, id)).collect(),
        };
        let lost = self.tasks.clone().renew_push_configs(request).await?.into_inner().lost;
        for lost in lost {
            let key = (lost.namespace, lost.task_id, lost.id);
            if let Some((_, id)) = followers.iter().find(|(followed, _)| *followed == key) {
                self.stop(&key, *id);
            }
        }
        Ok(())
    }

    /// Stops follower `id` of the config, unless another follows it now.
    fn stop(&self, key: &ConfigKey, id: u64) {
        let mut following = self.following.lock().expect("push followers lock");
        if following.get(key).is_some_and(|follower| follower.id == id)
            && let Some(follower) = following.remove(key)
        {
            follower.stop.cancel();
            tracing::info!(
                task_id = %key.1,
                config_id = %key.2,
                "stopped following a push config this gateway holds no more: deleted, or taken by another gateway"
            );
        }
    }

    /// Follows the configs no gateway holds, a page at a time.
    async fn claim(&self) -> Result<(), tonic::Status> {
        loop {
            let request = pb::ClaimPushConfigsRequest {
                follower: self.follower.clone(),
                lease_ms: self.policy.lease_ms,
                limit: CLAIM_PAGE,
            };
            let claimed = self.tasks.clone().claim_push_configs(request).await?.into_inner().configs;
            let last_page = claimed.len() < CLAIM_PAGE as usize;
            for pending in claimed {
                let Some(key) = pending.key else {
                    tracing::warn!("the task store handed over a push config without its key");
                    continue;
                };
                tracing::info!(task_id = %key.task_id, config_id = %key.id, "following a push config no gateway held");
                self.spawn((key.namespace, key.task_id, key.id), pending.delivered_cursor, None);
            }
            if last_page {
                return Ok(());
            }
        }
    }

    /// Hands this gateway's leases back as it stops, so that another gateway
    /// takes its configs over at once rather than when the leases run out.
    /// Best effort: a lease not handed back still runs out.
    async fn release(&self) {
        let mut tasks = self.tasks.clone();
        match tokio::time::timeout(RELEASE_TIMEOUT, tasks.release_push_configs(self.release_request())).await {
            Ok(Ok(answer)) => {
                tracing::debug!(released = answer.into_inner().released, "handed the push config leases back");
            }
            Ok(Err(status)) => tracing::debug!(error = %status.message(), "cannot hand the push config leases back"),
            Err(_) => tracing::debug!("cannot hand the push config leases back in time"),
        }
    }

    fn release_request(&self) -> pb::ReleasePushConfigsRequest {
        pb::ReleasePushConfigsRequest { follower: self.follower.clone() }
    }
}

fn key_out(namespace: &str, task_id: &str, id: &str) -> pb::PushConfigKey {
    pb::PushConfigKey { namespace: namespace.to_owned(), task_id: task_id.to_owned(), id: id.to_owned() }
}
