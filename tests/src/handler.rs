//! Event-bus handler processes: the `test-handler` binary of this package,
//! and the log it keeps of what it handled.
//!
//! A handler's builder can start it any number of times: each start is the
//! same handler (same consumer id, same log file) in a new process, as after
//! a crash.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use crate::process::ReadyProcess;

/// What `test-handler` prints on stdout once its handler is registered.
pub const READY: &str = "test-handler ready";

/// One line of a `test-handler` log: a delivery it handled, before acking it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// The event's sequence.
    pub sequence: u64,
    /// Every handler it is after had acked the event when it came.
    pub in_order: bool,
}

impl Handled {
    /// The log line, `<sequence> ok` or `<sequence> violation`, with its newline.
    pub fn line(&self) -> String {
        let outcome = if self.in_order { "ok" } else { "violation" };
        format!("{} {outcome}\n", self.sequence)
    }

    /// Parses a line written by [`Handled::line`] (without its newline).
    pub fn parse(line: &str) -> Option<Self> {
        let (sequence, outcome) = line.split_once(' ')?;
        let in_order = match outcome {
            "ok" => true,
            "violation" => false,
            _ => return None,
        };
        Some(Self { sequence: sequence.parse().ok()?, in_order })
    }
}

/// Every line of the `test-handler` log at `path`, in the order written.
///
/// # Panics
/// When the file cannot be read or holds a line that is not [`Handled`]
/// (a line is written whole, so even a killed handler leaves none).
pub fn read_log(path: &Path) -> Vec<Handled> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    let lines = text.lines().enumerate();
    let parse = |(n, line): (usize, &str)| {
        Handled::parse(line).unwrap_or_else(|| panic!("{}:{}: not a handler log line: {line:?}", path.display(), n + 1))
    };
    lines.map(parse).collect()
}

/// How to start one handler's `test-handler` process; see
/// [`test_handler!`](crate::test_handler).
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start`"]
pub struct TestHandlerBuilder {
    bin: PathBuf,
    workdir: PathBuf,
    args: Vec<OsString>,
    handler: String,
}

impl TestHandlerBuilder {
    /// Handler `handler` of `namespace` on the server at `server_url`, taking
    /// every event type, with consumer id `test-handler-<handler>` and its
    /// log in `<workdir>/<handler>.log`.
    pub fn new(bin: impl Into<PathBuf>, server_url: &str, namespace: &str, handler: &str, workdir: &Path) -> Self {
        let builder =
            Self { bin: bin.into(), workdir: workdir.to_owned(), args: Vec::new(), handler: handler.to_owned() };
        let log = builder.log_path();
        let builder = builder.arg("--server", server_url).arg("--namespace", namespace).arg("--handler", handler);
        builder.arg("--consumer-id", format!("test-handler-{handler}")).arg("--log", log)
    }

    fn arg(mut self, name: &str, value: impl Into<OsString>) -> Self {
        self.args.push(name.into());
        self.args.push(value.into());
        self
    }

    /// The handlers that must finish an event before this one receives it.
    pub fn after(self, handlers: &[&str]) -> Self {
        self.arg("--after", handlers.join(","))
    }

    /// Most unacked deliveries the handler holds at once.
    pub fn max_in_flight(self, max_in_flight: u32) -> Self {
        self.arg("--max-in-flight", max_in_flight.to_string())
    }

    /// The handler's name.
    pub fn handler(&self) -> &str {
        &self.handler
    }

    /// Where every process of this handler appends what it handled (see [`read_log`]).
    pub fn log_path(&self) -> PathBuf {
        self.workdir.join(format!("{}.log", self.handler))
    }

    /// Starts a process of the handler and waits until it has registered the
    /// handler (not until it has subscribed).
    pub async fn start(&self) -> ReadyProcess {
        let name = format!("test-handler {}", self.handler);
        ReadyProcess::start(name, &self.bin, &self.workdir, &self.args, READY).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_round_trip() {
        for handled in [Handled { sequence: 7, in_order: true }, Handled { sequence: 10_000, in_order: false }] {
            let line = handled.line();
            assert_eq!(Handled::parse(line.trim_end_matches('\n')), Some(handled), "{line:?}");
        }
        for bad in ["", "7", "7 ok ", "seven ok", "7 maybe", "-1 ok"] {
            assert_eq!(Handled::parse(bad), None, "{bad:?}");
        }
    }
}
