//! `chorus`: run the whole fabric in one process (`chorus dev`), one service
//! on PostgreSQL (`chorus serve taskstore|eventbus|hub|workflow`), a built-in agent,
//! or the ACP bridge an IDE launches (`chorus acp`).

mod agents;
mod cli;
mod config;
mod stack;

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::{
    config::{ChorusConfig, Flags, StorageFlags},
    stack::{ALL_SERVICES, Service, Stack},
};

/// mimalloc's thread-local heaps: request handling allocates and frees many
/// small buffers across the runtime's threads, where the system allocator
/// showed up in profiles (about a tenth of the server's user time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "chorus", version, about = "The chorus agent-coordination fabric")]
struct Cli {
    /// Configuration file (default: ./chorus.toml when it exists).
    #[arg(long, global = true, env = "CHORUS_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every service and the built-in agents in one process, on one port,
    /// with SQLite under the data directory.
    Dev {
        /// Address to serve gRPC and HTTP on (port 0 picks a free one).
        #[arg(long)]
        listen: Option<String>,
        /// Where the SQLite file lives (default ./.chorus).
        #[arg(long)]
        data_dir: Option<String>,
        /// Database URL instead of the embedded SQLite file.
        #[arg(long)]
        database_url: Option<String>,
        /// Do not start the built-in demo agents.
        #[arg(long)]
        no_agents: bool,
    },
    /// One service, typically on PostgreSQL.
    Serve {
        #[arg(value_enum)]
        service: Service,
        /// Address to serve gRPC and HTTP on (port 0 picks a free one).
        #[arg(long)]
        listen: Option<String>,
        /// `postgres://…` (or `sqlite://…`).
        #[arg(long)]
        database_url: Option<String>,
    },
    /// A built-in agent, working for a remote task store.
    Agent {
        #[arg(value_enum)]
        agent: Agent,
        /// The task store to work for.
        #[arg(long, default_value = "http://127.0.0.1:7800", env = "CHORUS_SERVER")]
        server: String,
        /// The namespace whose tasks it works on.
        #[arg(long, default_value = chorus_worker::DEFAULT_NAMESPACE)]
        namespace: String,
        /// The reviewer's pause between two steps, in milliseconds.
        #[arg(long, default_value_t = 100)]
        pace_ms: u64,
        /// A file holding a bearer token, for a task store whose gateway
        /// checks credentials (default: the `CHORUS_TOKEN` environment
        /// variable, if set).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// A name kept across restarts (a pod's, say) for the worker ids,
        /// `{agent}@{name}`: a restart then requeues at once the tasks the
        /// previous process held. No two live processes may share one.
        /// Default: new ids per process.
        #[arg(long)]
        worker_name: Option<String>,
        /// Also serve `/healthz` (200 while each of the agent's claim
        /// streams is open, else 503) and `/metrics` (its tasks by outcome,
        /// those in flight, its open claim streams) on this address.
        #[arg(long)]
        listen: Option<String>,
    },
    /// Workflow definitions: validate, apply, list, source, disable, enable.
    Workflow {
        #[command(subcommand)]
        command: cli::WorkflowCommand,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Workflow runs: start, get, list, watch, cancel, signal.
    Run {
        #[command(subcommand)]
        command: cli::RunCommand,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Gates waiting for a decision: list, approve, reject.
    Gate {
        #[command(subcommand)]
        command: cli::GateCommand,
        #[command(flatten)]
        target: cli::Target,
    },
    /// An Agent Client Protocol (v1) agent on stdin/stdout, for an IDE to
    /// launch: it talks to `--agent` through the gateway's A2A API. Nothing
    /// but ACP is written to stdout; logs go to stderr.
    Acp {
        /// The agent in the gateway's catalog (`echo`, `tck`, ...).
        #[arg(long)]
        agent: String,
        /// The gateway's base URL [default: http:// and the configuration's
        /// `listen`, 127.0.0.1:7800 unless the configuration file sets it]
        #[arg(long, env = "CHORUS_GATEWAY_URL")]
        gateway: Option<String>,
        /// A file holding the gateway's bearer token (default: the
        /// `CHORUS_TOKEN` environment variable, if set).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// How long, in seconds, a prompt turn whose gateway went away (a
        /// restart, a deploy) waits for it to come back and follows its task
        /// again before it fails.
        #[arg(long, default_value_t = 60)]
        gateway_wait: u64,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Agent {
    /// Answers every task with its own text.
    Echo,
    /// Reviews the files a message refers to, asking for them and for
    /// approval on the way.
    Reviewer,
    /// The phase agents of the example workflows: one worker per role
    /// (discovery, design, development, test, security, validator,
    /// deployment, builder, tester, deployer).
    Phases,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let flags = match &cli.command {
        Command::Dev { listen, data_dir, database_url, .. } => Flags {
            listen: listen.clone(),
            storage: StorageFlags { database_url: database_url.clone(), data_dir: data_dir.clone() },
        },
        Command::Serve { listen, database_url, .. } => Flags {
            listen: listen.clone(),
            storage: StorageFlags { database_url: database_url.clone(), data_dir: None },
        },
        Command::Agent { .. }
        | Command::Acp { .. }
        | Command::Workflow { .. }
        | Command::Run { .. }
        | Command::Gate { .. } => Flags::default(),
    };
    let person_facing = matches!(cli.command, Command::Workflow { .. } | Command::Run { .. } | Command::Gate { .. });
    let config: ChorusConfig = match chorus_runtime::config::load(cli.config.as_deref(), &flags) {
        Ok(config) => config,
        // The workflow CLI's exit codes: 1 is "the answer was no", 2 that
        // the command could not run.
        Err(error) if person_facing => {
            eprintln!("error: {error}");
            return Ok(ExitCode::from(2));
        }
        Err(error) => return Err(error.into()),
    };
    let problems = config.problems();
    anyhow::ensure!(person_facing || problems.is_empty(), "invalid configuration: {}", problems.join("; "));
    let service_name = match &cli.command {
        Command::Dev { .. } => "chorus-dev".to_owned(),
        Command::Serve { service, .. } => format!("chorus-{}", service_label(*service)),
        Command::Agent { agent: Agent::Echo, .. } => "chorus-agent-echo".to_owned(),
        Command::Agent { agent: Agent::Reviewer, .. } => "chorus-agent-reviewer".to_owned(),
        Command::Agent { agent: Agent::Phases, .. } => "chorus-agent-phases".to_owned(),
        Command::Acp { .. } => "chorus-acp".to_owned(),
        Command::Workflow { .. } | Command::Run { .. } | Command::Gate { .. } => "chorus-cli".to_owned(),
    };
    let telemetry = chorus_runtime::telemetry::init(&service_name, &config.telemetry)?;
    let shutdown = match person_facing {
        true => chorus_runtime::signal::shutdown_on_signal_quietly(),
        false => chorus_runtime::signal::shutdown_on_signal(),
    };
    let outcome = run(cli.command, &config, shutdown).await;
    // A log read alone tells a clean stop from a hang or a kill.
    if !person_facing && outcome.is_ok() {
        tracing::info!("stopped");
    }
    // Where logs are JSON (a collector reads them), so is the error that
    // stops the process, rather than anyhow's lines of plain text.
    let outcome = match outcome {
        Err(error) if config.telemetry.log_format == chorus_runtime::telemetry::LogFormat::Json => {
            tracing::error!(error = format!("{error:#}"), "chorus stopped");
            Ok(ExitCode::FAILURE)
        }
        outcome => outcome,
    };
    telemetry.shutdown().await;
    outcome
}

fn service_label(service: Service) -> &'static str {
    match service {
        Service::Taskstore => "taskstore",
        Service::Eventbus => "eventbus",
        Service::Hub => "hub",
        Service::Gateway => "gateway",
        Service::Workflow => "workflow",
    }
}

async fn run(command: Command, config: &ChorusConfig, shutdown: CancellationToken) -> anyhow::Result<ExitCode> {
    let done = |()| ExitCode::SUCCESS;
    match command {
        Command::Workflow { command, target } => {
            let target = target.on(&config.listen);
            Ok(cli::interruptible(cli::workflow(&target, command), &shutdown).await)
        }
        Command::Run { command, target } => {
            let target = target.on(&config.listen);
            Ok(cli::interruptible(cli::run(&target, command), &shutdown).await)
        }
        Command::Gate { command, target } => {
            let target = target.on(&config.listen);
            Ok(cli::interruptible(cli::gate(&target, command), &shutdown).await)
        }
        Command::Dev { no_agents, .. } => {
            let mut stack = Stack::build(config, ALL_SERVICES, &shutdown).await?;
            let address = stack.address;
            if !no_agents {
                let taskstore = stack.local_taskstore.clone().context("chorus dev serves a task store")?;
                let client = chorus_worker::client_over(taskstore);
                stack.add_readiness_probe(agents::start_demo_agents(client, stack.metrics(), &shutdown));
            }
            let serving = tokio::spawn(stack.serve(shutdown.clone()));
            announce(address);
            serving.await.context("server task failed")?.map(done)
        }
        Command::Serve { service, .. } => {
            let stack = Stack::build(config, &[service], &shutdown).await?;
            announce(stack.address);
            stack.serve(shutdown).await.map(done)
        }
        Command::Agent { agent, server, namespace, pace_ms, token_file, worker_name, listen } => {
            let client = worker_client(&server, token_file.as_deref()).await?;
            let mut placement = chorus_worker::Placement::new(namespace);
            if let Some(name) = worker_name {
                placement = placement.named(name);
            }
            if let Some(listen) = listen {
                let streams = if matches!(agent, Agent::Phases) { chorus_worker::phases::ROLES.len() } else { 1 };
                let metrics = agents::serve_health(&listen, config.server.clone(), streams, &shutdown).await?;
                placement = placement.counted_in(metrics);
            }
            tracing::info!(%server, namespace = placement.namespace(), ?agent, "agent working");
            match agent {
                Agent::Echo => chorus_worker::echo::run(client, placement, shutdown).await?,
                Agent::Reviewer => {
                    let pace = std::time::Duration::from_millis(pace_ms);
                    chorus_worker::reviewer::run(client, placement, pace, shutdown).await?;
                }
                Agent::Phases => chorus_worker::phases::run(client, placement, shutdown).await?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Acp { agent, gateway, token_file, gateway_wait } => {
            let gateway_wait = std::time::Duration::from_secs(gateway_wait);
            let gateway = gateway.unwrap_or_else(|| cli::local_url(&config.listen));
            // A signal ends the connection as the IDE closing stdin does.
            let options =
                chorus_gateway::acp::StdioOptions { gateway, agent, token_file, gateway_wait, stop: shutdown };
            chorus_gateway::acp::serve_stdio(options).await.map(done).map_err(anyhow::Error::msg)
        }
    }
}

/// A built-in agent's client of the task store at `server`, with the
/// bearer token of `token_file` or `CHORUS_TOKEN` when there is one.
async fn worker_client(server: &str, token_file: Option<&std::path::Path>) -> anyhow::Result<chorus_worker::Client> {
    Ok(match cli::bearer_token(token_file)? {
        Some(token) => chorus_worker::connect_with_token(server, &token).await?,
        None => chorus_worker::connect(server).await?,
    })
}

/// One line on stdout saying where chorus listens (tests and scripts read it).
fn announce(address: std::net::SocketAddr) {
    println!("chorus listening on http://{address}");
}
