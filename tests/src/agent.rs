//! Hub agent processes: the `test-agent` binary of this package (a worker
//! of the coordinator–worker example), and the log it keeps of what it
//! handled.
//!
//! An agent's builder can start it any number of times: each start is the
//! same agent (same agent id, consumer id and log file) in a new process,
//! as after a crash.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use chorus_proto::hub::message::Kind;

use crate::process::ReadyProcess;

/// What `test-agent` prints on stdout once it is registered, subscribed and
/// streaming its inbox.
pub const READY: &str = "test-agent ready";
/// The type of what a worker answers: a `SendDirect` back to the sender of
/// every message but a request, and its Reply to a request.
pub const DONE: &str = "job.done";

/// What a worker answers with for a message: its payload reversed.
pub fn answer(payload: &[u8]) -> Vec<u8> {
    payload.iter().rev().copied().collect()
}

/// One line of a `test-agent` log: a message it handled, before answering
/// and acking it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    pub kind: Kind,
    /// The message's `delivery_attempt`.
    pub attempt: u32,
    /// The message id.
    pub id: String,
    /// The message's correlation id (the job's id); may be empty.
    pub job: String,
}

impl Handled {
    /// The log line, `<kind> <attempt> <id> <job>`, with its newline.
    pub fn line(&self) -> String {
        format!("{} {} {} {}\n", self.kind.as_str_name(), self.attempt, self.id, self.job)
    }

    /// Parses a line written by [`Handled::line`] (without its newline).
    pub fn parse(line: &str) -> Option<Self> {
        let mut parts = line.splitn(4, ' ');
        let kind = Kind::from_str_name(parts.next()?)?;
        let attempt = parts.next()?.parse().ok()?;
        let id = parts.next().filter(|id| !id.is_empty())?.to_owned();
        let job = parts.next()?.to_owned();
        Some(Self { kind, attempt, id, job })
    }
}

/// Every line of the `test-agent` log at `path`, in the order written.
///
/// # Panics
/// When the file cannot be read or holds a line that is not [`Handled`]
/// (a line is written whole, so even a killed agent leaves none).
pub fn read_log(path: &Path) -> Vec<Handled> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    let lines = text.lines().enumerate();
    let parse = |(n, line): (usize, &str)| {
        Handled::parse(line).unwrap_or_else(|| panic!("{}:{}: not an agent log line: {line:?}", path.display(), n + 1))
    };
    lines.map(parse).collect()
}

/// How to start one agent's `test-agent` process; see
/// [`test_agent!`](crate::test_agent).
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start`"]
pub struct TestAgentBuilder {
    bin: PathBuf,
    workdir: PathBuf,
    args: Vec<OsString>,
    agent_id: String,
}

impl TestAgentBuilder {
    /// Worker `agent_id` of `namespace` on the server at `server_url`, with
    /// consumer id `test-agent-<agent_id>` and its log in
    /// `<workdir>/<agent_id>.log`.
    pub fn new(bin: impl Into<PathBuf>, server_url: &str, namespace: &str, agent_id: &str, workdir: &Path) -> Self {
        let builder =
            Self { bin: bin.into(), workdir: workdir.to_owned(), args: Vec::new(), agent_id: agent_id.to_owned() };
        let log = builder.log_path();
        let builder = builder.arg("--server", server_url).arg("--namespace", namespace).arg("--agent-id", agent_id);
        builder.arg("--consumer-id", format!("test-agent-{agent_id}")).arg("--log", log)
    }

    fn arg(mut self, name: &str, value: impl Into<OsString>) -> Self {
        self.args.push(name.into());
        self.args.push(value.into());
        self
    }

    /// What the agent registers as able to do.
    pub fn capabilities(self, capabilities: &[&str]) -> Self {
        self.arg("--capabilities", capabilities.join(","))
    }

    /// The topics it subscribes to.
    pub fn topics(self, topics: &[&str]) -> Self {
        self.arg("--topics", topics.join(","))
    }

    /// How often it heartbeats.
    pub fn heartbeat(self, every: Duration) -> Self {
        self.arg("--heartbeat-ms", every.as_millis().to_string())
    }

    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// Where every process of this agent appends what it handled (see [`read_log`]).
    pub fn log_path(&self) -> PathBuf {
        self.workdir.join(format!("{}.log", self.agent_id))
    }

    /// Starts a process of the agent and waits until it is registered,
    /// subscribed and streaming its inbox.
    pub async fn start(&self) -> ReadyProcess {
        let name = format!("test-agent {}", self.agent_id);
        ReadyProcess::start(name, &self.bin, &self.workdir, &self.args, READY).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_round_trip() {
        let handled = [
            Handled { kind: Kind::Topic, attempt: 1, id: "0190-a".to_owned(), job: "topic-1".to_owned() },
            Handled { kind: Kind::Request, attempt: 12, id: "0190-b".to_owned(), job: "a job with spaces".to_owned() },
            Handled { kind: Kind::Broadcast, attempt: 2, id: "0190-c".to_owned(), job: String::new() },
        ];
        for handled in handled {
            let line = handled.line();
            assert_eq!(Handled::parse(line.trim_end_matches('\n')), Some(handled), "{line:?}");
        }
        for bad in ["", "KIND_TOPIC", "KIND_TOPIC 1 id", "KIND_TOPIC one id job", "TOPIC 1 id job", "KIND_TOPIC 1  job"]
        {
            assert_eq!(Handled::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_answer_is_the_payload_reversed() {
        assert_eq!(answer(b"topic-12"), b"21-cipot");
        assert_eq!(answer(b""), b"");
    }
}
