// A grpc-web client of chorus, as a browser page would be: Connect's web
// transport (@connectrpc/connect-web) over fetch, every request carrying an
// Origin and every response filtered the way a browser's CORS check filters
// it. The messages are described here (a few fields of each; the rest is
// skipped as unknown fields), so no protoc and no generated code are needed.
//
// Usage: node client.cjs BASE_URL   (with NODE_PATH naming the node_modules
// that `npm ci` of this directory made)
//
// Prints one JSON line of results and exits 0, or prints the first mismatch
// to stderr and exits 1.
"use strict";

const { create, createFileRegistry } = require("@bufbuild/protobuf");
const { FileDescriptorSetSchema } = require("@bufbuild/protobuf/wkt");
const { Code, ConnectError, createClient } = require("@connectrpc/connect");
const { createGrpcWebTransport } = require("@connectrpc/connect-web");

const ORIGIN = "http://app.example.test";
const TIMEOUT_MS = 30000;

// --- Descriptors -------------------------------------------------------------

const TYPE = { bool: 8, string: 9, uint32: 13, message: 11, enum: 14 };

/** A field: `[name, number, type]`, `type` a scalar name, or `.pkg.Message` / `enum .pkg.Enum`. */
function field([name, number, type], extra = {}) {
  const described = { name, number, label: extra.repeated ? 3 : 1, jsonName: camel(name) };
  if (type.startsWith("enum ")) {
    Object.assign(described, { type: TYPE.enum, typeName: type.slice(5) });
  } else if (type.startsWith(".")) {
    Object.assign(described, { type: TYPE.message, typeName: type });
  } else {
    described.type = TYPE[type];
  }
  if (extra.oneof !== undefined) described.oneofIndex = extra.oneof;
  return described;
}

function camel(name) {
  return name.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase());
}

function message(name, fields, extra = {}) {
  return { name, field: fields.map((spec) => field(spec, spec[3])), ...extra };
}

function enumeration(name, values) {
  return { name, value: values.map((value, number) => ({ name: value, number })) };
}

function unary(name, input, output) {
  return { name, inputType: input, outputType: output };
}

const HEALTH = {
  name: "grpc/health/v1/health.proto",
  package: "grpc.health.v1",
  syntax: "proto3",
  messageType: [
    message("HealthCheckRequest", [["service", 1, "string"]]),
    message("HealthCheckResponse", [["status", 1, "enum .grpc.health.v1.HealthCheckResponse.ServingStatus"]], {
      enumType: [enumeration("ServingStatus", ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"])],
    }),
  ],
  service: [
    {
      name: "Health",
      method: [unary("Check", ".grpc.health.v1.HealthCheckRequest", ".grpc.health.v1.HealthCheckResponse")],
    },
  ],
};

const TS = ".chorus.taskstore.v1";
const TASK_STATES = ["UNSPECIFIED", "SUBMITTED", "WORKING", "COMPLETED", "FAILED", "CANCELED", "INPUT_REQUIRED"];
const TASK_STORE = {
  name: "chorus/taskstore/v1/taskstore.proto",
  package: "chorus.taskstore.v1",
  syntax: "proto3",
  enumType: [
    enumeration("TaskState", TASK_STATES.map((state) => `TASK_STATE_${state}`)),
    enumeration("Role", ["ROLE_UNSPECIFIED", "ROLE_USER", "ROLE_AGENT"]),
  ],
  messageType: [
    message("Part", [["text", 1, "string", { oneof: 0 }]], { oneofDecl: [{ name: "content" }] }),
    message("Message", [
      ["message_id", 1, "string"],
      ["context_id", 2, "string"],
      ["task_id", 3, "string"],
      ["role", 4, `enum ${TS}.Role`],
      ["parts", 5, `${TS}.Part`, { repeated: true }],
    ]),
    message("Artifact", [
      ["artifact_id", 1, "string"],
      ["name", 2, "string"],
      ["parts", 4, `${TS}.Part`, { repeated: true }],
    ]),
    message("TaskStatus", [
      ["state", 1, `enum ${TS}.TaskState`],
      ["message", 2, `${TS}.Message`],
    ]),
    message("Task", [
      ["id", 1, "string"],
      ["context_id", 2, "string"],
      ["status", 3, `${TS}.TaskStatus`],
      ["artifacts", 4, `${TS}.Artifact`, { repeated: true }],
      ["history", 5, `${TS}.Message`, { repeated: true }],
      ["namespace", 7, "string"],
      ["agent_id", 8, "string"],
    ]),
    message("CreateTaskRequest", [
      ["namespace", 1, "string"],
      ["agent_id", 2, "string"],
      ["message", 3, `${TS}.Message`],
    ]),
    message("GetTaskRequest", [
      ["namespace", 1, "string"],
      ["id", 2, "string"],
    ]),
    message("WatchTaskRequest", [
      ["namespace", 1, "string"],
      ["task_id", 2, "string"],
      ["snapshot", 4, "bool"],
    ]),
    message("TaskEvent", [
      ["cursor", 1, "string"],
      ["kind", 2, `enum ${TS}.TaskEvent.Kind`],
      ["task_id", 3, "string"],
      ["status", 6, `${TS}.TaskStatus`],
    ], {
      enumType: [
        enumeration("Kind", [
          "KIND_UNSPECIFIED", "KIND_CREATED", "KIND_STATUS_CHANGED", "KIND_ARTIFACT_UPDATED",
          "KIND_MESSAGE_ADDED", "KIND_SNAPSHOT",
        ]),
      ],
    }),
  ],
  service: [
    {
      name: "TaskStore",
      method: [
        unary("CreateTask", `${TS}.CreateTaskRequest`, `${TS}.Task`),
        unary("GetTask", `${TS}.GetTaskRequest`, `${TS}.Task`),
        { ...unary("WatchTask", `${TS}.WatchTaskRequest`, `${TS}.TaskEvent`), serverStreaming: true },
      ],
    },
  ],
};

const A2A = {
  name: "a2a.proto",
  package: "lf.a2a.v1",
  syntax: "proto3",
  messageType: [
    message("GetTaskRequest", [
      ["tenant", 1, "string"],
      ["id", 2, "string"],
    ]),
    message("Task", [["id", 1, "string"]]),
  ],
  service: [{ name: "A2AService", method: [unary("GetTask", ".lf.a2a.v1.GetTaskRequest", ".lf.a2a.v1.Task")] }],
};

const registry = createFileRegistry(create(FileDescriptorSetSchema, { file: [HEALTH, TASK_STORE, A2A] }));

function service(name) {
  const described = registry.getService(name);
  if (!described) throw new Error(`no descriptor of ${name}`);
  return described;
}

// --- A browser's view of the server ------------------------------------------

class Mismatch extends Error {}

function expect(condition, what) {
  if (!condition) throw new Mismatch(what);
}

/** Response headers a page can read without the server exposing them. */
const SAFELISTED = ["cache-control", "content-language", "content-length", "content-type", "expires", "last-modified", "pragma"];

/** fetch as a page on ORIGIN sees it: cross-origin, CORS-checked, headers filtered. */
async function browserFetch(url, init) {
  const headers = new Headers(init.headers);
  headers.set("origin", ORIGIN);
  const response = await fetch(url, { ...init, headers });
  const allowed = response.headers.get("access-control-allow-origin");
  expect(allowed === "*" || allowed === ORIGIN, `${url}: the response allows origin ${allowed}, not ${ORIGIN}`);
  const exposed = (response.headers.get("access-control-expose-headers") || "")
    .split(",")
    .map((name) => name.trim().toLowerCase());
  const visible = new Headers();
  for (const [name, value] of response.headers) {
    if (SAFELISTED.includes(name) || exposed.includes(name)) visible.append(name, value);
  }
  return new Response(response.body, { status: response.status, statusText: response.statusText, headers: visible });
}

/** The preflight a browser sends before a grpc-web POST. */
async function preflight(baseUrl, path) {
  const requested = ["content-type", "x-grpc-web", "x-user-agent", "grpc-timeout"];
  const response = await fetch(`${baseUrl}/${path}`, {
    method: "OPTIONS",
    headers: {
      origin: ORIGIN,
      "access-control-request-method": "POST",
      "access-control-request-headers": requested.join(","),
    },
  });
  expect(response.ok, `preflight of ${path}: HTTP ${response.status}`);
  const header = (name) => (response.headers.get(name) || "").toLowerCase();
  const origin = header("access-control-allow-origin");
  expect(origin === "*" || origin === ORIGIN, `preflight of ${path} allows origin "${origin}"`);
  expect(header("access-control-allow-methods").includes("post"), `preflight of ${path} does not allow POST`);
  const allowedHeaders = header("access-control-allow-headers");
  for (const name of requested) {
    expect(allowedHeaders === "*" || allowedHeaders.includes(name), `preflight of ${path} does not allow ${name}`);
  }
  return { status: response.status, allowOrigin: origin };
}

// --- The calls -----------------------------------------------------------------

async function expectCode(call, code, what) {
  try {
    const answer = await call();
    throw new Mismatch(`${what} answered ${JSON.stringify(answer)}, not ${Code[code]}`);
  } catch (error) {
    if (error instanceof Mismatch) throw error;
    const connectError = ConnectError.from(error);
    expect(connectError.code === code, `${what} failed with ${Code[connectError.code]} (${connectError.rawMessage}), not ${Code[code]}`);
    return Code[connectError.code];
  }
}

function stateName(state) {
  return `TASK_STATE_${TASK_STATES[state] || state}`;
}

async function run(baseUrl) {
  const results = {};
  results.preflight = await preflight(baseUrl, "chorus.taskstore.v1.TaskStore/GetTask");
  const transport = createGrpcWebTransport({ baseUrl, fetch: browserFetch, defaultTimeoutMs: TIMEOUT_MS });

  const health = createClient(service("grpc.health.v1.Health"), transport);
  const checked = await health.check({ service: "chorus.taskstore.v1.TaskStore" });
  expect(checked.status === 1, `Health/Check says ${checked.status}, not SERVING`);
  results.health = "SERVING";

  const tasks = createClient(service("chorus.taskstore.v1.TaskStore"), transport);
  results.taskstoreUnknown = await expectCode(
    () => tasks.getTask({ namespace: "default", id: "no-such-task" }),
    Code.NotFound,
    "TaskStore/GetTask of an unknown id",
  );
  const text = `hello over grpc-web ${Date.now()}`;
  const created = await tasks.createTask({
    namespace: "default",
    agentId: "echo",
    message: { messageId: `grpc-web-${Date.now()}`, role: 1, parts: [{ content: { case: "text", value: text } }] },
  });
  expect(created.id !== "", "CreateTask answered a task without an id");
  expect(created.agentId === "echo", `CreateTask answered agent ${created.agentId}`);
  const states = [];
  for await (const event of tasks.watchTask({ namespace: "default", taskId: created.id, snapshot: true })) {
    if (event.status) states.push(stateName(event.status.state));
  }
  expect(states.at(-1) === "TASK_STATE_COMPLETED", `WatchTask ended with ${states.at(-1)}: ${states}`);
  const task = await tasks.getTask({ namespace: "default", id: created.id });
  expect(stateName(task.status.state) === "TASK_STATE_COMPLETED", `GetTask says ${stateName(task.status.state)}`);
  const echoed = task.artifacts.flatMap((artifact) => artifact.parts.map((part) => part.content.value));
  expect(echoed.includes(text), `the echo task's artifacts carry ${JSON.stringify(echoed)}, not "${text}"`);
  results.task = { id: task.id, state: stateName(task.status.state), watched: states, artifact: text };

  const a2a = createClient(service("lf.a2a.v1.A2AService"), transport);
  results.a2aUnknown = await expectCode(
    () => a2a.getTask({ id: "no-such-task" }, { headers: { "a2a-version": "1.0" } }),
    Code.NotFound,
    "A2AService/GetTask of an unknown id",
  );
  return results;
}

async function main() {
  const baseUrl = process.argv[2];
  if (!baseUrl) {
    console.error("usage: node client.cjs BASE_URL");
    return 2;
  }
  try {
    console.log(JSON.stringify({ ok: true, ...(await run(baseUrl.replace(/\/$/, ""))) }));
    return 0;
  } catch (error) {
    console.error(`grpc-web client: ${error instanceof Mismatch ? error.message : error.stack || error}`);
    return 1;
  }
}

main().then((code) => {
  process.exitCode = code;
});
