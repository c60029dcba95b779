//! NATS JetStream beside the event bus, in the same run and under the same
//! load ([`crate::flow`]): for each batch size a scratch stream with file
//! storage on `chorus.bench.<id>.>`, publishers that send a batch of
//! publishes and then await every PubAck, each on a connection of its own,
//! and one durable pull consumer with explicit acks, holding at most
//! max_in_flight unacked messages as the chorus consumers do. A message is
//! finished once its ack is sent (JetStream does not answer plain acks).
//!
//! Streams are named `chorus_bench_<pid>_<id>` and deleted however the run
//! ends; a later run deletes those whose process is gone.

use std::sync::Arc;

use anyhow::{Context as _, anyhow};
use async_nats::{
    Subject,
    jetstream::{
        self,
        consumer::{AckPolicy, pull},
        stream::{self, StorageType},
    },
};
use futures_util::StreamExt as _;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    cpu::{self, CpuUsage},
    eventbus::BusPlan,
    flow::{Flow, FlowPlan, FlowResult, Progress, Samples, SequenceCheck, sent_us, stamp},
    postgres,
};

/// The NATS server measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NatsServer {
    pub(crate) version: String,
    /// The local nats-server's command line, when it runs on this machine.
    pub(crate) command: Option<String>,
    /// When it fsyncs what it has acknowledged; PostgreSQL fsyncs its WAL
    /// before every commit returns.
    pub(crate) durability: String,
}

/// JetStream at one batch size.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NatsResult {
    pub(crate) batch_size: u32,
    pub(crate) publishers: usize,
    /// Finished: acked by the one consumer.
    pub(crate) flow: FlowResult,
    pub(crate) cpu: CpuUsage,
}

/// Every batch size against the JetStream server at `url`.
pub(crate) async fn run(
    url: &str,
    plan: &BusPlan,
    interrupt: &CancellationToken,
) -> anyhow::Result<(NatsServer, Vec<NatsResult>)> {
    let (control, server, pid) = open(url).await?;
    let mut results = Vec::with_capacity(plan.batch_sizes.len());
    for &batch in &plan.batch_sizes {
        eprintln!(
            "NATS JetStream {}: batches of {batch}, {} publisher(s), {:?} warm-up + {:?} measured…",
            server.version, plan.publishers, plan.warmup, plan.measure
        );
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("{}{}_{id}", postgres::PREFIX, std::process::id());
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![format!("chorus.bench.{id}.>")],
            storage: StorageType::File,
            ..Default::default()
        };
        control.create_stream(config).await.with_context(|| format!("cannot create the NATS stream {name}"))?;
        let subject = Subject::from(format!("chorus.bench.{id}.event"));
        let flow = plan.flow(batch);
        let outcome = tokio::select! {
            outcome = measure(url, &name, subject, &flow, pid) => outcome,
            () = interrupt.cancelled() => Err(anyhow!("interrupted")),
        };
        let deleted =
            control.delete_stream(&name).await.with_context(|| format!("cannot delete the NATS stream {name}"));
        let (flow, cpu) = outcome?;
        deleted?;
        results.push(NatsResult { batch_size: batch, publishers: plan.publishers, flow, cpu });
    }
    Ok((server, results))
}

/// Connects to the JetStream server at `url`, describes it, and deletes
/// what earlier runs left on it; also returns nats-server's pid when it
/// runs on this machine.
pub(crate) async fn open(url: &str) -> anyhow::Result<(jetstream::Context, NatsServer, Option<u32>)> {
    let client = connect(url).await?;
    let info = client.server_info();
    if !info.jetstream {
        anyhow::bail!("the NATS server at {url} does not have JetStream enabled (nats-server -js)");
    }
    let process = cpu::find_process("nats-server")?;
    let command = process.as_ref().map(|(_, command)| command.clone());
    let server = NatsServer {
        durability: durability(&info.version, command.as_deref()),
        version: info.version.clone(),
        command,
    };
    let control = jetstream::new(client);
    for name in delete_stale(&control).await? {
        eprintln!("deleted NATS stream {name}, left behind by an earlier run");
    }
    Ok((control, server, process.map(|(pid, _)| pid)))
}

pub(crate) async fn connect(url: &str) -> anyhow::Result<async_nats::Client> {
    async_nats::connect(url).await.with_context(|| format!("cannot connect to NATS at {url} (see --nats-url)"))
}

/// Deletes the scratch streams of earlier runs whose process has exited.
async fn delete_stale(control: &jetstream::Context) -> anyhow::Result<Vec<String>> {
    let mut names = control.stream_names();
    let mut stale = Vec::new();
    while let Some(name) = names.next().await {
        let name = name.context("cannot list the NATS streams")?;
        if postgres::owner_gone(&name) {
            stale.push(name);
        }
    }
    for name in &stale {
        control.delete_stream(name).await.with_context(|| format!("cannot delete the NATS stream {name}"))?;
    }
    Ok(stale)
}

/// One batch size on the stream `name`; `server` is nats-server's pid.
async fn measure(
    url: &str,
    name: &str,
    subject: Subject,
    plan: &FlowPlan,
    server: Option<u32>,
) -> anyhow::Result<(FlowResult, CpuUsage)> {
    let consuming = jetstream::new(connect(url).await?);
    let stream = consuming.get_stream(name).await.with_context(|| format!("cannot open the NATS stream {name}"))?;
    let config = pull::Config {
        durable_name: Some("bench".to_owned()),
        ack_policy: AckPolicy::Explicit,
        max_ack_pending: i64::from(plan.max_in_flight),
        ..Default::default()
    };
    let consumer = stream.create_consumer(config).await.context("cannot create the NATS consumer")?;
    let messages = consumer
        .stream()
        .max_messages_per_batch(plan.max_in_flight as usize)
        .messages()
        .await
        .context("cannot pull from the NATS consumer")?;
    let mut flow = Flow::new(plan.backlog, plan.warmup, plan.measure);
    flow.spawn_consumer(consume(messages, Arc::clone(&flow.progress)));
    for _ in 0..plan.publishers {
        let publishing = jetstream::new(connect(url).await?);
        flow.spawn_publisher(publish(publishing, subject.clone(), plan.batch, Arc::clone(&flow.progress)));
    }
    let cpu = flow.sample_cpu(server).await?;
    Ok((flow.finish().await?, cpu))
}

/// Publishes a batch, then awaits its PubAcks, while the backlog allows.
async fn publish(
    context: jetstream::Context,
    subject: Subject,
    batch: u32,
    progress: Arc<Progress>,
) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    while progress.reserve(batch).await {
        let payload = stamp(progress.now_us());
        let started = Instant::now();
        let mut acks = Vec::with_capacity(batch as usize);
        for _ in 0..batch {
            let ack = context.publish(subject.clone(), payload.clone().into()).await.context("JetStream publish")?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await.context("no PubAck from JetStream")?;
        }
        let done = Instant::now();
        progress.published(u64::from(batch));
        if progress.window.contains(done) {
            samples.published += u64::from(batch);
            samples.publish_calls.push(done.duration_since(started).as_micros() as u64);
        }
    }
    Ok(samples)
}

/// Receives and acks each message until told to stop.
async fn consume(mut messages: pull::Stream, progress: Arc<Progress>) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    let mut order = SequenceCheck::default();
    loop {
        let message = tokio::select! {
            biased;
            () = progress.stop_consuming.cancelled() => return Ok(samples),
            message = messages.next() => message,
        };
        let message = message.context("the NATS consumer's messages ended")?.context("the NATS consumer failed")?;
        let arrived = Instant::now();
        let sequence =
            message.info().map_err(anyhow::Error::from_boxed).context("a message without its info")?.stream_sequence;
        if !order.next(sequence) {
            samples.anomalies.out_of_order += 1;
        }
        let sent_us = sent_us(&message.payload)?;
        if progress.window.contains(arrived) {
            samples.first_delivery.push(progress.since_us(sent_us));
        }
        message.ack().await.map_err(anyhow::Error::from_boxed).context("cannot ack a NATS message")?;
        if progress.window.contains(Instant::now()) {
            samples.finished += 1;
            samples.finished_latency.push(progress.since_us(sent_us));
        }
        progress.finished(1);
    }
}

/// When a nats-server of `version`, started as `command`, fsyncs what it
/// has acknowledged.
fn durability(version: &str, command: Option<&str>) -> String {
    let release: Vec<u32> =
        version.trim_start_matches('v').split('.').take(2).map_while(|part| part.parse().ok()).collect();
    let setting = match release.as_slice() {
        [major, minor] if (*major, *minor) < (2, 10) => "every 60 s (fixed before 2.10)".to_owned(),
        [_, _] => match config_file(command) {
            Some(file) => format!("per jetstream.sync_interval in {file} (default 2 min; `always`: every write)"),
            None => "every 2 min, the default sync_interval (no config file)".to_owned(),
        },
        _ => "per its sync_interval (2 min by default from 2.10, 60 s before)".to_owned(),
    };
    format!("nats-server {version} acknowledges a publish once written to the OS and fsyncs its file store {setting}")
}

/// The config file on a nats-server command line.
fn config_file(command: Option<&str>) -> Option<String> {
    let words: Vec<&str> = command?.split_whitespace().collect();
    words.windows(2).find(|pair| matches!(pair[0], "-c" | "--config")).map(|pair| pair[1].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_follows_the_version_and_the_config_file() {
        let old = durability("2.9.10", Some("/usr/sbin/nats-server -js"));
        assert!(old.contains("every 60 s (fixed before 2.10)"), "{old}");
        let default = durability("v2.10.4", Some("nats-server -js -sd /var/lib/nats"));
        assert!(default.contains("every 2 min, the default sync_interval (no config file)"), "{default}");
        let configured = durability("2.11.0", Some("nats-server -c /etc/nats.conf -js"));
        assert!(configured.contains("per jetstream.sync_interval in /etc/nats.conf"), "{configured}");
        let unknown = durability("dev", None);
        assert!(unknown.contains("per its sync_interval"), "{unknown}");
    }
}
