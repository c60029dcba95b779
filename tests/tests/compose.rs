//! Static checks of the local stack: docker-compose.yml, the Dockerfile it builds and the
//! OpenTelemetry collector config it mounts. They need no Docker engine (CI has none) and catch
//! mistakes that would otherwise surface only at `docker compose up`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_norway::Value;

fn repo_path(relative: impl AsRef<Path>) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(relative)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn load_yaml(relative: &str) -> Value {
    let text = read(&repo_path(relative));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"))
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => panic!("expected a string or a number, found {other:?}"),
    }
}

/// The items of a list; empty when absent. (Indexing a `Value` yields `Null` when absent.)
fn list(value: &Value) -> &[Value] {
    value.as_sequence().map_or(&[], Vec::as_slice)
}

/// The keys of a map, such as the collector's `receivers` or compose's top-level `volumes`.
fn keys(value: &Value) -> BTreeSet<String> {
    let map = value.as_mapping();
    map.map_or_else(BTreeSet::new, |m| m.keys().map(scalar).collect())
}

fn services(compose: &Value) -> BTreeMap<String, &Value> {
    let services = compose["services"].as_mapping();
    let services = services.expect("docker-compose.yml has a `services` map");
    services.iter().map(|(name, s)| (scalar(name), s)).collect()
}

#[test]
fn every_service_has_an_image_or_a_build() {
    let compose = load_yaml("docker-compose.yml");
    let services = services(&compose);
    assert!(!services.is_empty(), "docker-compose.yml has no services");
    for (name, service) in services {
        let runs = service.get("image").is_some() || service.get("build").is_some();
        assert!(runs, "service `{name}` has neither `image` nor `build`");
    }
}

/// A worker kept under one name across restarts requeues at once what the
/// container before it held; under new ids, that waits for the leases.
#[test]
fn every_agent_service_names_its_workers() {
    let compose = load_yaml("docker-compose.yml");
    for (name, service) in services(&compose) {
        let command: Vec<String> =
            service.get("command").map(|command| list(command).iter().map(scalar).collect()).unwrap_or_default();
        if command.first().map(String::as_str) == Some("agent") {
            assert!(command.iter().any(|arg| arg == "--worker-name"), "service `{name}` runs workers without a name");
        }
    }
}

/// An agent container is checked, and scraped, on the address its `--listen` names.
#[test]
fn every_agent_service_is_health_checked_and_scraped() {
    let compose = load_yaml("docker-compose.yml");
    let collector = read(&repo_path("deploy/otel-collector.yaml"));
    for (name, service) in services(&compose) {
        let command: Vec<String> =
            service.get("command").map(|command| list(command).iter().map(scalar).collect()).unwrap_or_default();
        if command.first().map(String::as_str) != Some("agent") {
            continue;
        }
        let listen = command.iter().skip_while(|arg| *arg != "--listen").nth(1);
        let port = listen.and_then(|listen| listen.rsplit_once(':')).map(|(_, port)| port.to_owned());
        let port = port.unwrap_or_else(|| panic!("agent service `{name}` serves no /healthz (--listen)"));
        let check: Vec<String> = list(&service["healthcheck"]["test"]).iter().map(scalar).collect();
        let probed = format!("http://127.0.0.1:{port}/healthz");
        assert!(check.contains(&probed), "service `{name}`'s healthcheck does not GET {probed}: {check:?}");
        assert!(collector.contains(&format!("{name}:{port}")), "the collector does not scrape {name}:{port}");
    }
}

/// The host port of a `ports` entry, with its protocol ("7800/tcp"); None for a container port.
fn host_port(entry: &Value) -> Option<String> {
    if entry.is_mapping() {
        let protocol = entry["protocol"].as_str().unwrap_or("tcp");
        let published = entry.get("published");
        return published.map(|port| format!("{}/{protocol}", scalar(port)));
    }
    let spec = scalar(entry);
    let (spec, protocol) = spec.split_once('/').unwrap_or((&spec, "tcp"));
    let parts: Vec<&str> = spec.rsplitn(3, ':').collect(); // "[ip:]host:container"
    parts.get(1).map(|host| format!("{host}/{protocol}"))
}

#[test]
fn host_ports_do_not_collide() {
    let compose = load_yaml("docker-compose.yml");
    let mut owners = BTreeMap::new();
    for (name, service) in services(&compose) {
        for port in list(&service["ports"]).iter().filter_map(host_port) {
            if let Some(other) = owners.insert(port.clone(), name.clone()) {
                panic!("host port {port} is published by both `{other}` and `{name}`");
            }
        }
    }
}

/// The services check no credentials on their own ports, and the collector takes any span:
/// published on every interface, they would be open to the whole network the host is on.
#[test]
fn published_ports_bind_to_loopback_only() {
    let compose = load_yaml("docker-compose.yml");
    for (name, service) in services(&compose) {
        for entry in list(&service["ports"]) {
            let host_ip = match entry {
                Value::Mapping(_) => entry["host_ip"].as_str().map(str::to_owned),
                _ => scalar(entry).rsplitn(3, ':').nth(2).map(str::to_owned),
            };
            let host_ip = host_ip.unwrap_or_default();
            assert_eq!(host_ip, "127.0.0.1", "service `{name}` publishes {entry:?} beyond this machine");
        }
    }
}

/// Every `spawn:` step's `role` or `agent` in `value`, however deeply nested.
fn spawned(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Mapping(map) => {
            for (key, item) in map {
                if key.as_str() == Some("spawn") {
                    out.extend(["role", "agent"].iter().filter_map(|k| item[*k].as_str().map(str::to_owned)));
                }
                spawned(item, out);
            }
        }
        Value::Sequence(items) => items.iter().for_each(|item| spawned(item, out)),
        _ => {}
    }
}

/// The workflows compose loads (`workflows/`) spawn tasks for roles; a role no agent service
/// serves leaves its runs waiting out every timeout and retry.
#[test]
fn every_role_the_example_workflows_spawn_has_an_agent_service() {
    let compose = load_yaml("docker-compose.yml");
    let mut served = BTreeSet::new();
    for service in services(&compose).values() {
        let command: Vec<String> = list(&service["command"]).iter().map(scalar).collect();
        match command.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["agent", "echo", ..] => served.insert(chorus_worker::echo::AGENT_ID.to_owned()),
            ["agent", "reviewer", ..] => served.insert(chorus_worker::reviewer::AGENT_ID.to_owned()),
            ["agent", "phases", ..] => {
                served.extend(chorus_worker::phases::ROLES.iter().map(|role| (*role).to_owned()));
                true
            }
            _ => false,
        };
    }
    let mut wanted = BTreeSet::new();
    let entries = std::fs::read_dir(repo_path("workflows")).expect("workflows/ exists");
    for entry in entries.map(|entry| entry.expect("a workflows/ entry").path()) {
        if entry.extension().is_some_and(|ext| ext == "yaml" || ext == "yml") {
            let relative = format!("workflows/{}", entry.file_name().expect("a file name").to_string_lossy());
            spawned(&load_yaml(&relative), &mut wanted);
        }
    }
    assert!(!wanted.is_empty(), "the example workflows spawn no task: the walk missed them");
    let missing: Vec<&String> = wanted.difference(&served).collect();
    assert!(missing.is_empty(), "no compose agent serves {missing:?}");
}

/// `depends_on` as (service, condition) pairs, from its list form or its map form.
fn dependencies(service: &Value) -> Vec<(String, String)> {
    let condition = |s: &Value| String::from(s["condition"].as_str().unwrap_or("service_started"));
    match &service["depends_on"] {
        Value::Null => Vec::new(),
        Value::Sequence(names) => names.iter().map(|n| (scalar(n), condition(n))).collect(),
        Value::Mapping(m) => m.iter().map(|(n, s)| (scalar(n), condition(s))).collect(),
        other => panic!("`depends_on` is neither a list nor a map: {other:?}"),
    }
}

#[test]
fn dependencies_exist_and_awaited_health_is_checked() {
    let compose = load_yaml("docker-compose.yml");
    let services = services(&compose);
    for (name, service) in &services {
        for (dependency, condition) in dependencies(service) {
            assert_ne!(&dependency, name, "service `{name}` depends on itself");
            let Some(target) = services.get(&dependency) else {
                panic!("service `{name}` depends on `{dependency}`, which is not a service");
            };
            let check = &target["healthcheck"];
            let disabled = check["disable"].as_bool() == Some(true);
            if condition == "service_healthy" && (check["test"].is_null() || disabled) {
                panic!("service `{name}` waits for `{dependency}` to be healthy: no healthcheck");
            }
        }
    }
}

/// The source of a `volumes` entry in short "source:target[:mode]" or long syntax, if any.
fn mount_source(entry: &Value) -> Option<String> {
    if entry.is_mapping() {
        return entry["source"].as_str().map(str::to_owned);
    }
    scalar(entry).split_once(':').map(|(s, _)| s.to_owned())
}

#[test]
fn named_volumes_are_declared_and_mounted_repo_files_exist() {
    let compose = load_yaml("docker-compose.yml");
    let declared = keys(&compose["volumes"]);
    for (name, service) in services(&compose) {
        for source in list(&service["volumes"]).iter().filter_map(mount_source) {
            // Docker would silently create a missing source as an empty directory.
            if source.starts_with('.') && !repo_path(&source).exists() {
                panic!("service `{name}` mounts {source}, which is not in the repository");
            }
            let named = !source.starts_with(['.', '/', '~']);
            if named && !declared.contains(&source) {
                panic!("service `{name}` mounts volume `{source}`, which is not declared");
            }
        }
    }
}

/// The keyword of each Dockerfile instruction: comments dropped, continuation lines joined.
fn dockerfile_instructions(dockerfile: &str) -> Vec<String> {
    let code = |line: &&str| !line.is_empty() && !line.starts_with('#');
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).filter(code).collect();
    let joined = lines.join("\n").replace("\\\n", " ");
    let first_words = joined.lines().filter_map(|l| l.split_whitespace().next());
    first_words.map(str::to_uppercase).collect()
}

#[test]
fn dockerfiles_have_a_base_image_and_a_final_stage_entrypoint() {
    let compose = load_yaml("docker-compose.yml");
    let mut dockerfiles = BTreeSet::from([repo_path("Dockerfile")]);
    for (name, service) in services(&compose) {
        let build = &service["build"];
        if build.is_null() {
            continue;
        }
        let context = build.as_str().or(build["context"].as_str()).unwrap_or(".");
        let path = repo_path(context).join(build["dockerfile"].as_str().unwrap_or("Dockerfile"));
        let found = path.is_file();
        assert!(found, "service `{name}`: no Dockerfile at {path:?}");
        dockerfiles.insert(path);
    }
    for path in dockerfiles {
        let instructions = dockerfile_instructions(&read(&path));
        let last = |keyword: &str| instructions.iter().rposition(|i| i == keyword);
        let (from, entrypoint, shown) = (last("FROM"), last("ENTRYPOINT"), path.display());
        assert!(from.is_some(), "{shown} has no FROM");
        assert!(entrypoint > from, "{shown}: final stage has no ENTRYPOINT");
    }
}

#[test]
fn collector_pipelines_use_defined_components() {
    let config = load_yaml("deploy/otel-collector.yaml");
    let pipelines = config["service"]["pipelines"].as_mapping();
    let pipelines = pipelines.expect("the collector config has service.pipelines");
    assert!(!pipelines.is_empty(), "the collector has no pipelines");
    // A connector is an exporter of one pipeline and a receiver of another.
    let connectors = keys(&config["connectors"]);
    for (pipeline, spec) in pipelines {
        let pipeline = scalar(pipeline);
        for section in ["receivers", "processors", "exporters"] {
            let (defined, used) = (keys(&config[section]), list(&spec[section]));
            let required = section != "processors";
            if required && used.is_empty() {
                panic!("pipeline `{pipeline}` has no {section}");
            }
            for id in used.iter().map(scalar) {
                let found = defined.contains(&id) || (required && connectors.contains(&id));
                assert!(found, "pipeline `{pipeline}`: undefined {section} `{id}`");
            }
        }
    }
}
