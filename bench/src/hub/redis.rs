//! The hub's loads on Redis Streams, every client on a connection of its
//! own (a blocked XREADGROUP holds its connection).
//!
//! Fan-out: XADD to one stream, with several XADDs in flight on the
//! publisher's connection; one consumer group per subscriber, each with one
//! consumer reading with XREADGROUP (COUNT max_in_flight, BLOCK) and acking
//! what it read with XACK, up to the ack batch per call.
//!
//! Direct: a stream and a consumer group per pair; a round trip is XADD,
//! XREADGROUP and XACK, each answered.
//!
//! Keys are `chorus_bench_<pid>_<id>:…`, deleted however a run ends; a
//! later run deletes those whose process is gone.

use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};
use redis::{
    AsyncCommands as _, AsyncConnectionConfig, Client,
    aio::MultiplexedConnection,
    streams::{StreamReadOptions, StreamReadReply},
};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    HubPlan, System, SystemRuns, describe_direct, describe_fanout,
    direct::{self, DirectResult, Pair, STEP_TIMEOUT, Trip},
    fanout::{self, FanoutResult, Pace, Tally},
};
use crate::{
    cpu,
    flow::{Flow, Samples},
    postgres,
};

/// How long a subscriber's XREADGROUP blocks, in milliseconds.
const BLOCK_MS: usize = 1000;

/// The field every entry carries its payload in.
const FIELD: &str = "p";

/// The Redis server measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RedisServer {
    pub(crate) version: String,
    /// What it keeps on disk and when it fsyncs, from CONFIG GET.
    pub(crate) durability: String,
}

/// The three loads against the Redis server at `url`.
pub(crate) async fn run(
    url: &str,
    plan: &HubPlan,
    interrupt: &CancellationToken,
) -> anyhow::Result<(RedisServer, SystemRuns)> {
    let client = Client::open(url).with_context(|| format!("bad Redis URL {url}"))?;
    let mut control =
        connect(&client).await.with_context(|| format!("cannot connect to Redis at {url} (see --redis-url)"))?;
    let server = describe(&mut control).await?;
    for key in delete_stale(&mut control).await? {
        eprintln!("deleted Redis key {key}, left behind by an earlier run");
    }
    let pid = cpu::find_process("redis-server")?.map(|(pid, _)| pid);
    let mut keys = Vec::new();
    let runs = async {
        let scratch = Scratch { client: &client, server: pid };
        let saturated = scratch.fanout(plan, plan.saturated(), &mut keys).await?;
        let steady = scratch.fanout(plan, plan.steady(), &mut keys).await?;
        let direct = scratch.direct(plan, &mut keys).await?;
        Ok(SystemRuns { system: System::Redis, saturated, steady, direct })
    };
    let outcome = tokio::select! {
        outcome = runs => outcome,
        () = interrupt.cancelled() => Err(anyhow!("interrupted")),
    };
    let deleted = delete(&mut control, &keys).await;
    let runs = outcome?;
    deleted?;
    Ok((server, runs))
}

/// A connection whose calls may block as long as a step may take.
async fn connect(client: &Client) -> anyhow::Result<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(STEP_TIMEOUT));
    Ok(client.get_multiplexed_async_connection_with_config(&config).await?)
}

/// The server's version and durability settings.
async fn describe(connection: &mut MultiplexedConnection) -> anyhow::Result<RedisServer> {
    let info: String = redis::cmd("INFO").arg("server").query_async(connection).await.context("Redis INFO")?;
    let version = info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map_or_else(|| "unknown".to_owned(), |version| version.trim().to_owned());
    let mut settings = Vec::new();
    for name in ["appendonly", "appendfsync", "save"] {
        let pair: Vec<String> =
            redis::cmd("CONFIG").arg("GET").arg(name).query_async(connection).await.context("Redis CONFIG GET")?;
        settings.push(pair.get(1).cloned().unwrap_or_default());
    }
    let durability = durability(&version, &settings[0], &settings[1], &settings[2]);
    Ok(RedisServer { version, durability })
}

/// When a Redis server with these settings has an acknowledged write on disk.
fn durability(version: &str, appendonly: &str, appendfsync: &str, save: &str) -> String {
    let when = match (appendonly, appendfsync) {
        ("yes", "always") => "fsyncs its append-only file before answering each write (appendfsync always)".to_owned(),
        ("yes", "everysec") => "appends each write to its append-only file and fsyncs it about once a second \
                                (appendfsync everysec): the last second's acknowledged writes can be lost"
            .to_owned(),
        ("yes", other) => {
            format!("appends each write to its append-only file and leaves the fsync to the OS (appendfsync {other})")
        }
        _ if save.trim().is_empty() => "keeps nothing on disk (appendonly no, save \"\"): every acknowledged write \
                                        lives in memory only"
            .to_owned(),
        _ => format!(
            "writes no append-only file (appendonly no) and snapshots memory per `save {save}`: writes since the \
             last snapshot can be lost"
        ),
    };
    format!("redis-server {version} {when}")
}

/// Deletes the keys of earlier runs whose process has exited.
async fn delete_stale(connection: &mut MultiplexedConnection) -> anyhow::Result<Vec<String>> {
    let mut stale = Vec::new();
    let mut cursor = 0_u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}*", postgres::PREFIX))
            .arg("COUNT")
            .arg(1000)
            .query_async(connection)
            .await
            .context("Redis SCAN")?;
        stale.extend(keys.into_iter().filter(|key| postgres::owner_gone(key)));
        if next == 0 {
            break;
        }
        cursor = next;
    }
    delete(connection, &stale).await?;
    Ok(stale)
}

async fn delete(connection: &mut MultiplexedConnection, keys: &[String]) -> anyhow::Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let _: u64 = connection.del(keys).await.context("Redis DEL")?;
    Ok(())
}

/// An entry id (`<ms>-<seq>`) as one number that grows with the ids.
fn position(id: &str) -> Option<u128> {
    let (millis, sequence) = id.split_once('-')?;
    Some(u128::from(millis.parse::<u64>().ok()?) << 64 | u128::from(sequence.parse::<u64>().ok()?))
}

/// Runs on scratch keys of one server.
struct Scratch<'a> {
    client: &'a Client,
    /// redis-server's pid.
    server: Option<u32>,
}

impl Scratch<'_> {
    /// A fresh key, recorded in `keys` for deletion.
    fn key(keys: &mut Vec<String>, name: &str) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let key = format!("{}{}_{id}:{name}", postgres::PREFIX, std::process::id());
        keys.push(key.clone());
        key
    }

    async fn fanout(&self, plan: &HubPlan, pace: Pace, keys: &mut Vec<String>) -> anyhow::Result<FanoutResult> {
        eprintln!("redis: {}…", describe_fanout(plan, &pace));
        let key = Self::key(keys, "topic");
        let mut flow = Flow::new(plan.backlog * plan.subscribers, plan.warmup, plan.measure);
        for index in 0..plan.subscribers {
            let mut connection = connect(self.client).await?;
            let group = format!("sub-{index}");
            let () = connection.xgroup_create_mkstream(&key, &group, "$").await.context("Redis XGROUP CREATE")?;
            let subscriber = Subscriber { connection, key: key.clone(), group, tally: Tally::new(&flow) };
            flow.spawn_consumer(subscriber.run(plan.max_in_flight as usize, plan.ack_batch));
        }
        let publishing = connect(self.client).await?;
        flow.spawn_publisher(fanout::publish(Arc::clone(&flow.progress), pace, move |payload| {
            let (mut connection, key) = (publishing.clone(), key.clone());
            async move {
                let _: String = connection.xadd(&key, "*", &[(FIELD, payload)]).await.context("Redis XADD")?;
                Ok(())
            }
        }));
        let cpu = flow.sample_cpu(self.server).await?;
        Ok(FanoutResult::new(&pace, flow.finish().await?, cpu))
    }

    async fn direct(&self, plan: &HubPlan, keys: &mut Vec<String>) -> anyhow::Result<DirectResult> {
        eprintln!("redis: {}…", describe_direct(plan));
        let mut pairs = Vec::with_capacity(plan.pairs);
        for index in 0..plan.pairs {
            let key = Self::key(keys, &format!("direct-{index}"));
            let mut receiver = connect(self.client).await?;
            let () = receiver.xgroup_create_mkstream(&key, "b", "$").await.context("Redis XGROUP CREATE")?;
            pairs.push(RedisPair { sender: connect(self.client).await?, receiver, key });
        }
        direct::run(pairs, plan.warmup, plan.measure, self.server).await
    }
}

/// The one consumer of one subscriber's group.
struct Subscriber {
    connection: MultiplexedConnection,
    key: String,
    group: String,
    tally: Tally,
}

impl Subscriber {
    /// Reads up to `count` entries at a time and acks them, until told to stop.
    async fn run(mut self, count: usize, ack_batch: usize) -> anyhow::Result<Samples> {
        let options = StreamReadOptions::default().group(&self.group, "c").count(count).block(BLOCK_MS);
        let keys = [self.key.clone()];
        loop {
            let read = self.connection.xread_options(&keys, &[">"], &options);
            let reply: Option<StreamReadReply> = tokio::select! {
                biased;
                () = self.tally.progress().stop_consuming.cancelled() => return Ok(self.tally.into_samples()),
                reply = read => reply.context("Redis XREADGROUP")?,
            };
            let entries: Vec<_> = reply.into_iter().flat_map(|reply| reply.keys).flat_map(|key| key.ids).collect();
            for batch in entries.chunks(ack_batch) {
                let mut sent = Vec::with_capacity(batch.len());
                for entry in batch {
                    let payload: Vec<u8> = entry.get(FIELD).context("an entry without its payload")?;
                    let position = position(&entry.id).with_context(|| format!("a bad entry id {}", entry.id))?;
                    sent.push(self.tally.arrived(position, &payload)?);
                }
                let ids: Vec<&str> = batch.iter().map(|entry| entry.id.as_str()).collect();
                let acked: usize = self.connection.xack(&self.key, &self.group, &ids).await.context("Redis XACK")?;
                if acked != ids.len() {
                    bail!("XACK acked {acked} of {} entries", ids.len());
                }
                self.tally.acked(&sent);
            }
        }
    }
}

/// A sender and a receiver of the pair's stream, on connections of their own.
struct RedisPair {
    sender: MultiplexedConnection,
    receiver: MultiplexedConnection,
    key: String,
}

impl Pair for RedisPair {
    async fn round_trip(&mut self, payload: Vec<u8>) -> anyhow::Result<Trip> {
        let _: String = self.sender.xadd(&self.key, "*", &[(FIELD, payload)]).await.context("Redis XADD")?;
        let sent = Instant::now();
        let options = StreamReadOptions::default().group("b", "c").count(1).block(STEP_TIMEOUT.as_millis() as usize);
        let reply: Option<StreamReadReply> =
            self.receiver.xread_options(&[&self.key], &[">"], &options).await.context("Redis XREADGROUP")?;
        let received = Instant::now();
        let entry = reply
            .into_iter()
            .flat_map(|reply| reply.keys)
            .flat_map(|key| key.ids)
            .next()
            .with_context(|| format!("no entry on {} within {STEP_TIMEOUT:?}", self.key))?;
        let acked: usize = self.receiver.xack(&self.key, "b", &[&entry.id]).await.context("Redis XACK")?;
        if acked != 1 {
            bail!("XACK of {} acked nothing", entry.id);
        }
        let payload = entry.get(FIELD).context("an entry without its payload")?;
        Ok(Trip { sent, received, payload, acked: Instant::now() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_grow_with_their_time_then_their_sequence() {
        let (first, second, third) =
            (position("1700000000000-0"), position("1700000000000-9"), position("1700000000001-0"));
        assert!(first < second && second < third, "{first:?} {second:?} {third:?}");
        assert_eq!(position("12-3"), Some(12 << 64 | 3));
        assert_eq!(position("12"), None);
        assert_eq!(position("x-1"), None);
    }

    #[test]
    fn durability_follows_the_persistence_settings() {
        let memory = durability("7.0.15", "no", "everysec", "");
        assert!(memory.contains("keeps nothing on disk"), "{memory}");
        assert!(memory.starts_with("redis-server 7.0.15 "), "{memory}");
        let snapshots = durability("7.0.15", "no", "everysec", "3600 1 300 100");
        assert!(snapshots.contains("snapshots memory per `save 3600 1 300 100`"), "{snapshots}");
        let every_second = durability("7.2.4", "yes", "everysec", "");
        assert!(every_second.contains("about once a second"), "{every_second}");
        let always = durability("7.2.4", "yes", "always", "");
        assert!(always.contains("before answering each write"), "{always}");
        let os = durability("7.2.4", "yes", "no", "");
        assert!(os.contains("leaves the fsync to the OS"), "{os}");
    }
}
