//! The workflow CLI: `chorus workflow|run|gate …`, a client of the workflow
//! service's gRPC API. Output is for people; exit codes are for scripts:
//! 0 done, 1 the answer was "no" (invalid definitions, a run that did not
//! complete), 2 the call failed.

/// `print!` for the CLI's answers: when the reader has gone away (`chorus
/// run list | head`), the command ends quietly with 0, as a filter's
/// writer does, instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` the same way.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod cancel;
mod definitions;
mod gates;
mod runs;
mod view;

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context as _;
use chorus_proto::workflow::workflow_client::WorkflowClient;
use chorus_runtime::transport::Transport;
use clap::{Args, Subcommand};
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

/// Where the workflow service is, and in which namespace to work.
#[derive(Debug, Clone, Args)]
pub(crate) struct Target {
    /// The workflow service (or `chorus dev`) [default: http:// and the configuration's `listen`, 127.0.0.1:7800
    /// unless the configuration file sets it]
    #[arg(long, global = true, env = "CHORUS_SERVER")]
    server: Option<String>,
    /// The namespace to work in.
    #[arg(long, global = true, default_value = "default")]
    namespace: String,
    /// A file holding a bearer token, for a server whose gateway checks
    /// credentials (default: the `CHORUS_TOKEN` environment variable, if set).
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
}

impl Target {
    /// The target with its server named: `--server` (or `CHORUS_SERVER`),
    /// else where a `chorus dev` of the same configuration listens
    /// (`listen`, a wildcard address read as this machine).
    pub(crate) fn on(mut self, listen: &str) -> Self {
        self.server.get_or_insert_with(|| local_url(listen));
        self
    }

    fn server(&self) -> &str {
        self.server.as_deref().unwrap_or("http://127.0.0.1:7800")
    }
}

/// Where a `chorus dev` (or gateway) that listens on `listen` is reached from
/// this machine: `http://` and the address, a wildcard read as loopback.
pub(crate) fn local_url(listen: &str) -> String {
    let local = match listen.rsplit_once(':') {
        Some(("0.0.0.0" | "[::]" | "", port)) => format!("127.0.0.1:{port}"),
        _ => listen.to_owned(),
    };
    format!("http://{local}")
}

/// The bearer token in `file`, else in `CHORUS_TOKEN`; none when neither
/// holds one.
pub(crate) fn bearer_token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    chorus_gateway::acp::bearer_token(file)
        .with_context(|| format!("cannot read {}", file.map(|file| file.display().to_string()).unwrap_or_default()))
}

#[derive(Debug, Subcommand)]
pub(crate) enum WorkflowCommand {
    /// Checks definition files (or every *.yaml/*.yml of a folder) without storing them; with
    /// the checks this binary carries, needing no server, unless `--remote` asks the server.
    Validate {
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
        /// Asks the server (`--server`) the definitions would be applied to, which may run
        /// another chorus version.
        #[arg(long)]
        remote: bool,
    },
    /// Stores definition files (or every *.yaml/*.yml of a folder) as new versions.
    Apply {
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
    /// Stops a workflow from starting runs (by events, its schedule, A2A messages or `run start`)
    /// until it is enabled; runs already started go on. Events and schedule times of the time it
    /// is disabled start nothing later either.
    Disable {
        name: String,
        /// Why, for whoever finds it disabled.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lets a disabled workflow start runs again.
    Enable { name: String },
    /// A version's YAML as it was applied (default the latest), to read, or to apply again to
    /// roll back: `chorus workflow source deploy --version 2 > deploy.yaml`.
    Source {
        name: String,
        /// 0: the latest.
        #[arg(long, default_value_t = 0)]
        version: u32,
    },
    /// The latest version of every workflow, or every version of one.
    List {
        /// Every version of this workflow.
        #[arg(long)]
        name: Option<String>,
        /// The definitions as a JSON array.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunCommand {
    /// Starts a run and prints its id.
    Start(runs::StartArgs),
    /// A run with its steps, gate decisions and signals.
    Get {
        run_id: String,
        /// The run as JSON.
        #[arg(long)]
        json: bool,
        /// Wait until the run has finished, then print it.
        #[arg(long)]
        wait: bool,
    },
    /// Runs, newest first.
    List {
        /// Only runs of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// pending, running, waiting, completed, failed or canceled (repeatable).
        #[arg(long = "state")]
        states: Vec<String>,
        /// The most runs shown (at least 1).
        #[arg(long, default_value_t = 50, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        limit: usize,
        /// The runs as a JSON array (without steps: `run get --json` has them).
        #[arg(long)]
        json: bool,
    },
    /// Follows a run live until it ends; exit code 0 when it completed.
    Watch { run_id: String },
    /// Cancels runs and the tasks their steps spawned: those named, or every unfinished run of a
    /// workflow (`--workflow`, narrowed with `--state`).
    Cancel {
        run_ids: Vec<String>,
        /// Every pending, running and waiting run of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// With --workflow: only runs in this state: pending, running or waiting (repeatable).
        #[arg(long = "state", requires = "workflow")]
        states: Vec<String>,
        /// Why, as the runs record it.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Sends a named signal to a run.
    Signal {
        run_id: String,
        name: String,
        /// A JSON object.
        #[arg(long)]
        payload: Option<String>,
        /// The signal's id: sent again with the same id (a retry), it is
        /// kept once. Without one, each send is a signal of its own.
        #[arg(long)]
        id: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum GateCommand {
    /// Gates waiting for a decision.
    List {
        /// Only gates of this workflow's runs.
        #[arg(long)]
        workflow: Option<String>,
        /// The gates as a JSON array, each with its whole input (question, reviewers, artifacts).
        #[arg(long)]
        json: bool,
    },
    /// Approves a waiting gate: the run goes on.
    Approve {
        run_id: String,
        step: String,
        /// Why, as the gate's history records it.
        #[arg(long, default_value = "")]
        reason: String,
        /// Who decides (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// The round decided (ITER in `gate list`): refused if the gate has moved on to another.
        #[arg(long)]
        iteration: Option<u32>,
    },
    /// Rejects a waiting gate: the phase before it runs again with the feedback, unless the
    /// gate's rejections are spent (it escalates, or the run fails) or the round was escalated
    /// (the run fails): IF REJECTED in `gate list` says which.
    Reject {
        run_id: String,
        step: String,
        /// What the rerun phase must change; it is given to it with its previous attempt.
        #[arg(long)]
        feedback: String,
        /// Who decides (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// The round decided (ITER in `gate list`): refused if the gate has moved on to another.
        #[arg(long)]
        iteration: Option<u32>,
    },
}

/// What a verb does when it fails.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The call failed: exit 2.
    Call(String),
    /// The answer was "no": exit 1 (what to say was printed already).
    No,
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Self {
        Self::Call(described(&status))
    }
}

/// A refused call's message, with the fields it names that it does not say,
/// or, from a server that has no workflow service, where to point instead.
fn described(status: &tonic::Status) -> String {
    let message = status.message();
    if status.code() == tonic::Code::Unimplemented {
        return format!(
            "{message}: this server does not serve the workflow API; point --server (or CHORUS_SERVER) at the \
             workflow engine (`chorus serve workflow`) or at `chorus dev`"
        );
    }
    let fields: Vec<String> = status
        .get_details_bad_request()
        .map(|bad| bad.field_violations)
        .unwrap_or_default()
        .into_iter()
        .filter(|violation| !message.contains(&violation.field))
        .map(|violation| format!(" ({}: {})", violation.field, violation.description))
        .collect();
    format!("{message}{}", fields.concat())
}

type Outcome = Result<(), Failure>;

async fn connect(target: &Target) -> Result<WorkflowClient<Transport>, Failure> {
    let token = bearer_token(target.token_file.as_deref()).map_err(|error| Failure::Call(format!("{error:#}")))?;
    let server = target.server();
    if !server.starts_with("http://") && !server.starts_with("https://") {
        return Err(Failure::Call(format!("--server {server}: expected a URL such as http://{server}")));
    }
    let endpoint = Channel::from_shared(server.to_owned())
        .map_err(|error| Failure::Call(format!("--server {server}: {error}")))?;
    let channel = endpoint.connect().await.map_err(|error| {
        Failure::Call(format!("cannot reach {server}: {}", chorus_runtime::error::with_causes(&error)))
    })?;
    let transport = match token {
        Some(token) => Transport::remote(channel)
            .with_bearer(&token)
            .map_err(|_| Failure::Call("the token cannot be sent in a header".to_owned()))?,
        None => Transport::remote(channel),
    };
    // A run's answer carries every step's output, which can outgrow 4 MiB.
    Ok(WorkflowClient::new(transport).max_decoding_message_size(usize::MAX))
}

/// Writes to stdout; see [`out!`].
fn write_stdout(text: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(error) => panic!("cannot write to stdout: {error}"),
    }
}

/// Runs a command until it ends or the user stops it (Ctrl-C, SIGTERM):
/// then at once, with 130 as a shell reports an interrupted command. A
/// watch or a wait would otherwise go on until its run ended.
pub(crate) async fn interruptible(
    command: impl std::future::Future<Output = ExitCode>,
    stop: &tokio_util::sync::CancellationToken,
) -> ExitCode {
    tokio::select! {
        code = command => code,
        () = stop.cancelled() => ExitCode::from(130),
    }
}

fn exit(outcome: Outcome) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::No) => ExitCode::from(1),
        Err(Failure::Call(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

pub(crate) async fn workflow(target: &Target, command: WorkflowCommand) -> ExitCode {
    let outcome = async {
        if let WorkflowCommand::Validate { paths, remote: false } = &command {
            return definitions::validate(definitions::Checker::Local, paths).await;
        }
        let mut client = connect(target).await?;
        match command {
            WorkflowCommand::Validate { paths, .. } => {
                definitions::validate(definitions::Checker::Server(&mut client, target), &paths).await
            }
            WorkflowCommand::Apply { paths } => definitions::apply(&mut client, target, &paths).await,
            WorkflowCommand::List { name, json } => definitions::list(&mut client, target, name, json).await,
            WorkflowCommand::Disable { name, reason } => definitions::disable(&mut client, target, name, reason).await,
            WorkflowCommand::Enable { name } => definitions::enable(&mut client, target, name).await,
            WorkflowCommand::Source { name, version } => definitions::source(&mut client, target, name, version).await,
        }
    };
    exit(outcome.await)
}

pub(crate) async fn run(target: &Target, command: RunCommand) -> ExitCode {
    let outcome = async {
        let mut client = connect(target).await?;
        match command {
            RunCommand::Start(args) => runs::start(&mut client, target, args).await,
            RunCommand::Get { run_id, json, wait } => runs::get(&mut client, target, &run_id, json, wait).await,
            RunCommand::List { workflow, states, limit, json } => {
                runs::list(&mut client, target, workflow, &states, limit, json).await
            }
            RunCommand::Watch { run_id } => runs::watch(&mut client, target, &run_id).await,
            RunCommand::Cancel { run_ids, workflow, states, reason } => {
                let what = cancel::Cancel { run_ids, workflow, states, reason };
                cancel::cancel(&mut client, target, what).await
            }
            RunCommand::Signal { run_id, name, payload, id } => {
                let signal = runs::Signal { name, payload, id };
                runs::signal(&mut client, target, &run_id, signal).await
            }
        }
    };
    exit(outcome.await)
}

pub(crate) async fn gate(target: &Target, command: GateCommand) -> ExitCode {
    let outcome = async {
        let mut client = connect(target).await?;
        match command {
            GateCommand::List { workflow, json } => gates::list(&mut client, target, workflow, json).await,
            GateCommand::Approve { run_id, step, reason, by, iteration } => {
                let decision = gates::Decision { verdict: gates::Verdict::Approve(reason), by, iteration };
                gates::decide(&mut client, target, &run_id, &step, decision).await
            }
            GateCommand::Reject { run_id, step, feedback, by, iteration } => {
                let decision = gates::Decision { verdict: gates::Verdict::Reject(feedback), by, iteration };
                gates::decide(&mut client, target, &run_id, &step, decision).await
            }
        }
    };
    exit(outcome.await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_the_workflow_api_is_named_as_such() {
        let status = tonic::Status::unimplemented("no such method: /chorus.workflow.v1.Workflow/ListDefinitions");
        let said = described(&status);
        assert!(said.starts_with("no such method") && said.contains("at the workflow engine"), "{said}");
        let refused = described(&tonic::Status::invalid_argument("name: is required"));
        assert_eq!(refused, "name: is required");
    }
}
