//! One child process of a test: spawned with its output captured (kept to
//! explain failures), killed with `SIGKILL` or stopped with `SIGTERM`, and
//! always killed when dropped.

use std::{
    collections::VecDeque,
    ffi::{OsStr, OsString},
    path::Path,
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt as _, AsyncRead, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};

use crate::DEADLINE;

/// Lines of output kept per process for failure messages.
const KEPT_LINES: usize = 400;

/// A running child process.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    stdout: Option<Lines<BufReader<ChildStdout>>>,
    output: Output,
    /// A panic already showed the output.
    output_shown: bool,
}

/// The last lines a process wrote, stdout and stderr interleaved.
#[derive(Debug, Clone, Default)]
struct Output(Arc<Mutex<VecDeque<String>>>);

impl Output {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if lines.len() == KEPT_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn text(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        lines.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }

    /// Keeps reading `lines` into the output until they end.
    fn drain<R: AsyncRead + Unpin + Send + 'static>(&self, mut lines: Lines<BufReader<R>>) {
        let output = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                output.push(line);
            }
        });
    }
}

/// A command for `program` that runs in `workdir`, logs without colours and
/// inherits no `CHORUS_*` variable from the test's environment (the caller
/// adds its own).
pub fn command(program: impl AsRef<OsStr>, workdir: &Path) -> Command {
    let mut command = Command::new(program);
    command.current_dir(workdir).env("NO_COLOR", "1");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CHORUS_") {
            command.env_remove(key);
        }
    }
    command
}

impl ChildProcess {
    /// Spawns `command`, naming the process `name` in messages.
    ///
    /// # Panics
    /// When the program cannot be started.
    pub fn spawn(name: impl Into<String>, mut command: Command) -> Self {
        let name = name.into();
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = command.spawn().unwrap_or_else(|error| panic!("cannot start {name} ({command:?}): {error}"));
        let output = Output::default();
        if let Some(stderr) = child.stderr.take() {
            output.drain(BufReader::new(stderr).lines());
        }
        let stdout = child.stdout.take().map(|stdout| BufReader::new(stdout).lines());
        Self { name, child, stdout, output, output_shown: false }
    }

    /// The process's name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads stdout until a line starting with `prefix`, and returns it; from
    /// then on stdout is only kept for failure messages.
    ///
    /// # Panics
    /// When the process closes stdout (exits) first, or prints no such line
    /// within [`DEADLINE`].
    pub async fn stdout_line(&mut self, prefix: &str) -> String {
        let Some(mut stdout) = self.stdout.take() else {
            panic!("{}: stdout was already handed over", self.name);
        };
        let output = self.output.clone();
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                match stdout.next_line().await {
                    Ok(Some(line)) if line.starts_with(prefix) => return Ok(line),
                    Ok(Some(line)) => output.push(line),
                    Ok(None) => return Err("it closed its stdout".to_owned()),
                    Err(error) => return Err(format!("reading its stdout failed: {error}")),
                }
            }
        })
        .await;
        let line = match found {
            Ok(Ok(line)) => line,
            Ok(Err(reason)) => self.fail(&format!("did not print `{prefix}…`: {reason}")).await,
            Err(_) => self.fail(&format!("did not print `{prefix}…` within {DEADLINE:?}")).await,
        };
        self.output.push(line.clone());
        self.output.drain(stdout);
        line
    }

    /// Panics with `problem`, the exit status if the process ended, and its output.
    pub async fn fail(&mut self, problem: &str) -> ! {
        let exit = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
        let exit = match exit {
            Ok(Ok(status)) => format!("exited with {status}"),
            Ok(Err(error)) => format!("exit status unknown: {error}"),
            Err(_) => "still running".to_owned(),
        };
        self.output_shown = true;
        panic!("{} {problem} ({exit}); its output:\n{}", self.name, self.output.text())
    }

    /// The exit status, once the process has ended.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// What the process wrote lately (stdout and stderr).
    pub fn output(&self) -> String {
        self.output.text()
    }

    /// Kills the process with `SIGKILL` (a crash) and waits until it is gone.
    pub async fn kill(&mut self) -> ExitStatus {
        if let Err(error) = self.child.start_kill() {
            panic!("cannot kill {}: {error}", self.name);
        }
        self.wait_exit("after SIGKILL").await
    }

    /// Asks the process to stop with `SIGTERM` and waits until it has exited.
    ///
    /// # Panics
    /// When it is still running after [`DEADLINE`] (it is then killed).
    pub async fn terminate(&mut self) -> ExitStatus {
        let Some(pid) = self.child.id() else {
            panic!("{} exited before it was asked to stop", self.name);
        };
        let sent = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        match sent {
            Ok(status) if status.success() => {}
            Ok(status) => panic!("`kill -TERM {pid}` ({}) failed: {status}", self.name),
            Err(error) => panic!("cannot run `kill -TERM {pid}` ({}): {error}", self.name),
        }
        self.wait_exit("after SIGTERM").await
    }

    async fn wait_exit(&mut self, when: &str) -> ExitStatus {
        match tokio::time::timeout(DEADLINE, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(error)) => panic!("cannot wait for {}: {error}", self.name),
            Err(_) => {
                let _ = self.child.start_kill();
                self.output_shown = true;
                panic!("{} still ran {DEADLINE:?} {when}; its output:\n{}", self.name, self.output.text())
            }
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            let _ = self.child.start_kill();
        }
        if std::thread::panicking() && !self.output_shown {
            eprintln!("--- output of {} ---\n{}\n--- end of {} ---", self.name, self.output.text(), self.name);
        }
    }
}

/// A test bin's process, started and waited for until it printed its ready
/// line; killed when dropped.
#[derive(Debug)]
pub struct ReadyProcess {
    process: ChildProcess,
}

impl ReadyProcess {
    /// Runs `bin args` in `workdir` and waits for a stdout line starting with `ready`.
    pub async fn start(name: String, bin: &Path, workdir: &Path, args: &[OsString], ready: &str) -> Self {
        let mut command = command(bin, workdir);
        command.args(args);
        let mut process = ChildProcess::spawn(name, command);
        process.stdout_line(ready).await;
        Self { process }
    }

    /// Kills the process with `SIGKILL`, as a crash would, and waits until it is gone.
    pub async fn kill(&mut self) -> ExitStatus {
        self.process.kill().await
    }

    /// Panics, with its output, when the process has exited on its own.
    pub async fn assert_running(&mut self) {
        if self.process.exit_status().is_some() {
            self.process.fail("exited on its own").await;
        }
    }
}

/// Why a test bin stopped consuming: the server failed (open the stream
/// again), or its log did (nothing more can be acked; give up).
#[derive(Debug)]
pub enum Stop {
    Grpc(tonic::Status),
    Log(std::io::Error),
}

impl From<tonic::Status> for Stop {
    fn from(status: tonic::Status) -> Self {
        Self::Grpc(status)
    }
}

impl From<std::io::Error> for Stop {
    fn from(error: std::io::Error) -> Self {
        Self::Log(error)
    }
}
