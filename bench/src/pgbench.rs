//! The raw commit rate: pgbench running one single-row INSERT per
//! transaction (autocommit), the cheapest durable write PostgreSQL can do.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde::Serialize;
use sqlx::{Connection as _, Executor as _, PgConnection};
use tokio::process::Command;

use crate::{
    cpu::{CpuSnapshot, CpuUsage},
    postgres::{CommitCounter, ScratchDb},
    stats::LatencySummary,
};

const TABLE: &str = "CREATE TABLE bench_commits (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL, \
                     created_at TIMESTAMPTZ NOT NULL DEFAULT now())";
const SCRIPT: &str = "INSERT INTO bench_commits (payload) VALUES ('chorus');\n";

/// Extra time pgbench gets beyond `-T` to connect and report.
const GRACE: Duration = Duration::from_secs(60);

/// One pgbench run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RawResult {
    pub(crate) clients: usize,
    pub(crate) threads: usize,
    pub(crate) seconds: u64,
    pub(crate) transactions: u64,
    pub(crate) tps: f64,
    /// pgbench's own average.
    pub(crate) latency_avg_ms: f64,
    /// From pgbench's per-transaction log.
    pub(crate) latency: LatencySummary,
    /// `xact_commit` growth over the run ÷ transactions: 1.0 checks the method
    /// the chorus runs use to count their commits.
    pub(crate) commits_per_transaction: f64,
    pub(crate) cpu: CpuUsage,
}

/// What pgbench prints at the end.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Summary {
    transactions: u64,
    latency_avg_ms: f64,
    tps: f64,
}

/// pgbench, its script, and a directory for its transaction logs.
#[derive(Debug)]
pub(crate) struct Pgbench {
    program: PathBuf,
    workdir: PathBuf,
    script: PathBuf,
}

impl Pgbench {
    /// Writes the script into `workdir` and checks that `program` runs.
    pub(crate) async fn prepare(program: &Path, workdir: &Path) -> anyhow::Result<(Self, String)> {
        let output = Command::new(program)
            .arg("--version")
            .output()
            .await
            .with_context(|| format!("cannot run {} (set --pgbench)", program.display()))?;
        if !output.status.success() {
            bail!("{} --version failed: {}", program.display(), output.status);
        }
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let script = workdir.join("insert.sql");
        std::fs::write(&script, SCRIPT).with_context(|| format!("cannot write {}", script.display()))?;
        Ok((Self { program: program.to_owned(), workdir: workdir.to_owned(), script }, version))
    }

    /// Creates the table the script inserts into.
    pub(crate) async fn create_table(&self, db: &ScratchDb) -> anyhow::Result<()> {
        let mut connection = PgConnection::connect(&db.url).await.context("cannot connect to the raw database")?;
        connection.execute(TABLE).await.context("cannot create the pgbench table")?;
        connection.close().await.context("closing the raw database connection")?;
        Ok(())
    }

    /// Runs `clients` connections for `seconds`, sampling CPU while they run.
    pub(crate) async fn run(
        &self,
        db: &ScratchDb,
        clients: usize,
        seconds: u64,
        counter: &mut CommitCounter,
    ) -> anyhow::Result<RawResult> {
        let threads = clients.min(2);
        let log_prefix = self.workdir.join(format!("c{clients}"));
        let before = counter.read().await?;
        let child = Command::new(&self.program)
            .args(["-n", "-c", &clients.to_string(), "-j", &threads.to_string(), "-T", &seconds.to_string()])
            .arg("-f")
            .arg(&self.script)
            .arg("-l")
            .arg(format!("--log-prefix={}", log_prefix.display()))
            .arg(&db.url)
            // libpq tries TLS first where the server offers it; chorus's
            // sqlx has no TLS backend, so the raw rate is measured over the
            // same plain connection chorus uses (TLS costs pgbench a fifth).
            .env("PGSSLMODE", crate::postgres::PLAIN_TEXT)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.program.display()))?;
        let pid = child.id().context("pgbench exited at once")?;
        let cpu = sample_cpu(pid, seconds).await?;
        let output = tokio::time::timeout(Duration::from_secs(seconds) + GRACE, child.wait_with_output())
            .await
            .context("pgbench did not finish in time")?
            .context("waiting for pgbench")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!("pgbench failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
        }
        let summary = parse_summary(&stdout).with_context(|| format!("unexpected pgbench output:\n{stdout}"))?;
        // Backends flush their statistics as they exit, just after pgbench.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let commits = before.until(counter.read().await?);
        Ok(RawResult {
            clients,
            threads,
            seconds,
            transactions: summary.transactions,
            tps: summary.tps,
            latency_avg_ms: summary.latency_avg_ms,
            latency: LatencySummary::from_micros(read_logs(&log_prefix)?),
            commits_per_transaction: commits.committed as f64 / summary.transactions.max(1) as f64,
            cpu,
        })
    }
}

/// CPU use in the middle of the run, once every client has connected and
/// before they disconnect (their backends' ticks vanish when they exit).
async fn sample_cpu(pid: u32, seconds: u64) -> anyhow::Result<CpuUsage> {
    let total = Duration::from_secs(seconds);
    let start = (total / 5).min(Duration::from_secs(1));
    let end = total.saturating_sub((total / 10).min(Duration::from_millis(500)));
    tokio::time::sleep(start).await;
    let first = CpuSnapshot::take(None, pid)?;
    tokio::time::sleep(end.saturating_sub(start)).await;
    Ok(first.usage_until(&CpuSnapshot::take(None, pid)?))
}

fn parse_summary(stdout: &str) -> Option<Summary> {
    let mut transactions = None;
    let mut latency_avg_ms = None;
    let mut tps = None;
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("number of transactions actually processed:") {
            transactions = rest.split('/').next()?.trim().parse().ok();
        } else if let Some(rest) = line.strip_prefix("latency average =") {
            latency_avg_ms = rest.trim().strip_suffix("ms")?.trim().parse().ok();
        } else if let Some(rest) = line.strip_prefix("tps =") {
            tps = rest.split_whitespace().next()?.parse().ok();
        }
    }
    Some(Summary { transactions: transactions?, latency_avg_ms: latency_avg_ms?, tps: tps? })
}

/// Transaction latencies (µs, the third column) from every log file that
/// pgbench wrote under `prefix` (one per thread: `prefix.PID[.N]`).
fn read_logs(prefix: &Path) -> anyhow::Result<Vec<u64>> {
    let dir = prefix.parent().context("a log prefix has a directory")?;
    let stem = format!("{}.", prefix.file_name().and_then(|name| name.to_str()).context("a log prefix is UTF-8")?);
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry.with_context(|| format!("cannot list {}", dir.display()))?.path();
        if !path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with(&stem)) {
            continue;
        }
        let log = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        latencies.extend(log.lines().filter_map(|line| line.split_whitespace().nth(2)?.parse::<u64>().ok()));
    }
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "\
pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: /tmp/insert.sql
scaling factor: 1
query mode: simple
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 10 s
number of transactions actually processed: 51234
number of failed transactions: 0 (0.000%)
latency average = 3.122 ms
initial connection time = 20.551 ms
tps = 5124.901234 (without initial connection time)
";

    #[test]
    fn the_summary_is_parsed() {
        let summary = parse_summary(OUTPUT).expect("a summary");
        assert_eq!(summary, Summary { transactions: 51234, latency_avg_ms: 3.122, tps: 5124.901234 });
    }

    #[test]
    fn a_truncated_summary_is_refused() {
        assert_eq!(parse_summary("pgbench (15.20)\nlatency average = 1.0 ms\n"), None);
    }

    #[test]
    fn every_thread_log_is_read() {
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::write(dir.path().join("c16.100"), "0 0 1500 0 1700000000 1\n1 0 2500 0 1700000000 2\n")
            .expect("a log");
        std::fs::write(dir.path().join("c16.100.1"), "8 0 900 0 1700000000 3\n").expect("a log");
        std::fs::write(dir.path().join("c1.101"), "0 0 99999 0 1700000000 3\n").expect("another run's log");
        let mut latencies = read_logs(&dir.path().join("c16")).expect("logs");
        latencies.sort_unstable();
        assert_eq!(latencies, vec![900, 1500, 2500]);
    }
}
