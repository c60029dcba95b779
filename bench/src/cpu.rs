//! Where the CPU goes during a measured window, from `/proc`: the whole
//! machine, every `postgres` process, the server under test (chorus, or
//! nats-server) and the load client (this process, or pgbench).
//!
//! Processes that exit inside a window lose their ticks, so windows are
//! sampled while the load runs (pgbench's backends exit when it ends).

use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;

/// `/proc` reports process times in USER_HZ ticks, 100 per second on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU counters at one instant.
#[derive(Debug, Clone)]
pub(crate) struct CpuSnapshot {
    at: Instant,
    machine_busy: u64,
    machine_total: u64,
    postgres: u64,
    server: Option<u64>,
    client: u64,
}

/// CPU use over a window: the machine as a share of all its cores, each
/// process group in percent of one core (200% = both cores of a 2-core box).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct CpuUsage {
    pub(crate) cores: usize,
    pub(crate) machine_busy_pct: f64,
    pub(crate) postgres_pct: f64,
    /// chorus, or nats-server in the NATS runs.
    pub(crate) server_pct: Option<f64>,
    pub(crate) client_pct: f64,
    /// Everything else on the machine (other users, the kernel's own work):
    /// a high figure means the run was disturbed.
    pub(crate) other_pct: f64,
}

impl CpuSnapshot {
    /// Reads the counters; `server` is the process under test (if any) and
    /// `client` the process generating the load.
    pub(crate) fn take(server: Option<u32>, client: u32) -> anyhow::Result<Self> {
        let (machine_busy, machine_total) = machine_ticks()?;
        Ok(Self {
            at: Instant::now(),
            machine_busy,
            machine_total,
            postgres: postgres_ticks()?,
            server: server.map(process_ticks).transpose()?,
            client: process_ticks(client)?,
        })
    }

    /// The usage from `self` to `later`.
    pub(crate) fn usage_until(&self, later: &Self) -> CpuUsage {
        let seconds = later.at.duration_since(self.at).as_secs_f64().max(f64::EPSILON);
        let pct = |before: u64, after: u64| after.saturating_sub(before) as f64 / TICKS_PER_SECOND / seconds * 100.0;
        let total = later.machine_total.saturating_sub(self.machine_total).max(1);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let machine_busy_pct = later.machine_busy.saturating_sub(self.machine_busy) as f64 / total as f64 * 100.0;
        let postgres_pct = pct(self.postgres, later.postgres);
        let server_pct = self.server.zip(later.server).map(|(before, after)| pct(before, after));
        let client_pct = pct(self.client, later.client);
        let accounted = postgres_pct + server_pct.unwrap_or_default() + client_pct;
        CpuUsage {
            cores,
            machine_busy_pct,
            postgres_pct,
            server_pct,
            client_pct,
            other_pct: (machine_busy_pct * cores as f64 - accounted).max(0.0),
        }
    }
}

/// Busy and total ticks of all cores, from the first line of `/proc/stat`.
fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    parse_machine_ticks(&stat).context("unexpected /proc/stat format")
}

fn parse_machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = fields.as_slice() else {
        return None;
    };
    let busy = user + nice + system + irq + softirq + steal;
    Some((busy, busy + idle + iowait))
}

/// User plus system ticks of one process (all its threads).
fn process_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    parse_process_stat(&stat).map(|(_, ticks)| ticks).with_context(|| format!("unexpected /proc/{pid}/stat format"))
}

/// User plus system ticks of every process whose command is `postgres`.
fn postgres_ticks() -> anyhow::Result<u64> {
    let mut total = 0;
    for (_, stat) in processes()? {
        if let Some(("postgres", ticks)) = parse_process_stat(&stat) {
            total += ticks;
        }
    }
    Ok(total)
}

/// A process whose command is `name`, and its command line.
pub(crate) fn find_process(name: &str) -> anyhow::Result<Option<(u32, String)>> {
    for (pid, stat) in processes()? {
        if parse_process_stat(&stat).is_some_and(|(command, _)| command == name) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let words: Vec<String> = cmdline
                .split(|&byte| byte == 0)
                .filter(|word| !word.is_empty())
                .map(String::from_utf8_lossy)
                .map(String::from)
                .collect();
            return Ok(Some((pid, words.join(" "))));
        }
    }
    Ok(None)
}

/// Every process's pid and `/proc/PID/stat` line.
fn processes() -> anyhow::Result<Vec<(u32, String)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse().ok()) else { continue };
        // A process may exit between the listing and the read: skip it.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        found.push((pid, stat));
    }
    Ok(found)
}

/// The command name and user plus system ticks of a `/proc/PID/stat` line.
fn parse_process_stat(stat: &str) -> Option<(&str, u64)> {
    // The name is in parentheses and may itself contain spaces or ')'.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    // After the name: state(3) ppid pgrp session tty tpgid flags minflt
    // cminflt majflt cmajflt utime(14) stime(15).
    let mut fields = stat.get(close + 1..)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((name, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_stat_with_a_tricky_name() {
        let stat = "42 (post gres) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_process_stat(stat), Some(("post gres) x", 300)));
    }

    #[test]
    fn machine_ticks_count_idle_and_iowait_as_not_busy() {
        let stat = "cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(parse_machine_ticks(stat), Some((160, 980)));
    }

    #[test]
    fn this_process_can_be_sampled() {
        let before = CpuSnapshot::take(None, std::process::id()).expect("a snapshot");
        let after = CpuSnapshot::take(None, std::process::id()).expect("a snapshot");
        let usage = before.usage_until(&after);
        assert!(usage.cores >= 1);
        assert!(usage.server_pct.is_none());
    }
}
