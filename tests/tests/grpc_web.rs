//! chorus's gRPC services as a web page reaches them: grpc-web through the
//! gateway's HTTP port, from a real grpc-web client (Connect's web transport,
//! `@connectrpc/connect-web`, from npm) running in Node over `fetch`, with an
//! Origin on every request and responses filtered as a browser's CORS check
//! filters them (`peers/grpc-web/client.cjs`).
//!
//! `make peers` installs the client's packages (`npm ci`) and `make test` says
//! where (`PEERS_NODE_DIR`). Without that variable (a plain `cargo test`) the
//! test says so and skips; with it set, a client that does not run is a
//! failure.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use chorus_tests::{Sandbox, process::command};
use serde_json::Value;

/// Where `npm ci` of `peers/grpc-web` was run, set by `make test`.
const NODE_DIR_VAR: &str = "PEERS_NODE_DIR";
/// How long the client may take (Node's start, about six calls).
const CLIENT_DEADLINE: Duration = Duration::from_secs(60);

/// The peer's `node_modules`, or `None` (after saying why) when unset.
fn node_modules() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(NODE_DIR_VAR) else {
        eprintln!("skipped: {NODE_DIR_VAR} is not set; `make test` installs the grpc-web client and sets it");
        return None;
    };
    let modules = Path::new(&dir).join("node_modules");
    let connect = modules.join("@connectrpc/connect-web/package.json");
    assert!(connect.is_file(), "{NODE_DIR_VAR}={}: no {}; run `make peers`", modules.display(), connect.display());
    Some(modules)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_web_client_calls_the_task_store_health_and_a2a_across_origins() {
    let Some(modules) = node_modules() else { return };
    let sandbox = Sandbox::new();
    // The client's page is on http://app.example.test: allowed, as no origin is by default.
    let server = sandbox.dev().env("CHORUS_GATEWAY__CORS_ORIGINS", "[\"http://app.example.test\"]").start().await;

    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/grpc-web/client.cjs");
    let mut node = command("node", sandbox.path());
    node.arg(client).arg(server.url()).env("NODE_PATH", &modules).stdin(Stdio::null()).kill_on_drop(true);
    let output = match tokio::time::timeout(CLIENT_DEADLINE, node.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(error)) => panic!("cannot run node (is Node.js installed?): {error}"),
        Err(_) => panic!("the grpc-web client did not finish within {CLIENT_DEADLINE:?}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the grpc-web client failed ({}):\n{stderr}\nstdout:\n{stdout}", output.status);
    let line = stdout.lines().rfind(|line| line.starts_with('{'));
    let line = line.unwrap_or_else(|| panic!("no JSON result line in:\n{stdout}"));
    let results: Value = serde_json::from_str(line).unwrap_or_else(|error| panic!("bad result line {line}: {error}"));

    assert_eq!(results["ok"], true, "{results}");
    // A browser may send the calls at all: the preflight allows the origin.
    assert_eq!(results["preflight"]["status"], 200, "{results}");
    assert_eq!(results["health"], "SERVING", "{results}");
    assert_eq!(results["taskstoreUnknown"], "NotFound", "{results}");
    assert_eq!(results["task"]["state"], "TASK_STATE_COMPLETED", "the echo task created over grpc-web: {results}");
    let watched = results["task"]["watched"].as_array().and_then(|states| states.last());
    assert_eq!(watched, Some(&Value::from("TASK_STATE_COMPLETED")), "WatchTask streamed to the end: {results}");
    assert_eq!(results["a2aUnknown"], "NotFound", "{results}");
    server.assert_serving().await;
}
