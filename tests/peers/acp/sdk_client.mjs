// An IDE as the official TypeScript ACP SDK (@agentclientprotocol/sdk) makes
// one, driving `chorus acp` bridged to a chorus gateway's `reviewer` agent:
// initialize, a new session with IDE context, prompts whose streamed updates
// come in order, a file read and permission questions answered both ways, a
// cancel mid-turn, then a second connection that lists and loads the session.
//
// Usage: node sdk_client.mjs NODE_DIR CHORUS_BIN GATEWAY_URL WORKDIR
//   NODE_DIR holds node_modules with the SDK (`make peers`); WORKDIR is the
//   IDE's project, holding notes.txt. Prints one JSON line of results on
//   stdout and exits 0, or names the first broken expectation and exits 1.

import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { readFile } from "node:fs/promises";
import { pathToFileURL } from "node:url";

const [nodeDir, chorusBin, gatewayUrl, workdir] = process.argv.slice(2);
if (!workdir) {
  console.error("usage: node sdk_client.mjs NODE_DIR CHORUS_BIN GATEWAY_URL WORKDIR");
  process.exit(2);
}
const require = createRequire(join(nodeDir, "package.json"));
const acp = await import(pathToFileURL(require.resolve("@agentclientprotocol/sdk")).href);

function expect(condition, message, detail) {
  if (!condition) {
    throw new Error(`${message}${detail === undefined ? "" : `: ${JSON.stringify(detail)}`}`);
  }
}

const textOf = (update) => (update.content && update.content.type === "text" ? update.content.text : undefined);

// One `chorus acp` process and an SDK client connected to it. `answers`
// decides each permission question (none left: the question is cancelled);
// updates are kept in arrival order.
async function withAgent(answers, work) {
  const child = spawn(chorusBin, ["acp", "--agent", "reviewer", "--gateway", gatewayUrl], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  const state = { updates: [], permissions: [], reads: [], answers, onUpdate: () => {} };
  const app = acp
    .client({ name: "chorus-acp-sdk-test" })
    .onNotification("session/update", ({ params: notification }) => {
      state.updates.push(notification.update);
      state.onUpdate(notification);
    })
    .onRequest("session/request_permission", ({ params: request }) => {
      state.permissions.push(request);
      const optionId = state.answers.shift();
      if (optionId === undefined) return { outcome: { outcome: "cancelled" } };
      return { outcome: { outcome: "selected", optionId } };
    })
    .onRequest("fs/read_text_file", async ({ params: request }) => {
      state.reads.push(request.path);
      return { content: await readFile(request.path, "utf8") };
    });
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  try {
    return await app.connectWith(stream, (ctx) => work(ctx, state));
  } finally {
    child.stdin.end();
    const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r("still running"), 10000))]);
    if (code === "still running") child.kill("SIGKILL");
  }
}

async function initialize(ctx) {
  return ctx.request("initialize", {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: true, writeTextFile: false }, terminal: false },
    clientInfo: { name: "chorus-acp-sdk-test", version: "1.0.0" },
  });
}

const results = {};
const notes = join(workdir, "notes.txt");

// First connection: a whole session.
await withAgent(["allow", "reject"], async (ctx, state) => {
  const init = await initialize(ctx);
  expect(init.protocolVersion === 1, "protocol version 1", init);
  expect(init.agentCapabilities.loadSession === true, "loadSession advertised", init);
  expect(init.agentCapabilities.sessionCapabilities.list !== undefined, "session/list advertised", init);
  expect(init.agentCapabilities.sessionCapabilities.resume !== undefined, "session/resume advertised", init);
  expect(init.agentCapabilities.promptCapabilities.embeddedContext === true, "embedded context taken", init);

  const created = await ctx.request("session/new", {
    cwd: workdir,
    additionalDirectories: [join(workdir, "lib")],
    mcpServers: [{ name: "files", command: "/usr/bin/mcp-files", args: ["--stdio"], env: [] }],
  });
  const sessionId = created.sessionId;
  results.sessionId = sessionId;

  // A prompt linking a file: the agent reads it through the IDE, asks to
  // publish (allowed), and publishes its review.
  const first = await ctx.request("session/prompt", {
    sessionId,
    prompt: [
      { type: "text", text: "Please review my notes" },
      { type: "resource_link", uri: pathToFileURL(notes).href, name: "notes.txt" },
    ],
  });
  expect(first.stopReason === "end_turn", "the first turn ends end_turn", first);
  expect(state.reads.length === 1 && state.reads[0] === notes, "the agent read notes.txt through the IDE", state.reads);
  const said = state.updates.filter((u) => u.sessionUpdate === "agent_message_chunk").map(textOf);
  results.firstTurn = said;
  results.plans = state.updates
    .filter((u) => u.sessionUpdate === "plan")
    .map((u) => u.entries.map((e) => `${e.content}:${e.priority}:${e.status}`));
  const review = state.updates.find((u) => u.sessionUpdate === "tool_call" && u.title === "review");
  expect(review !== undefined, "the review artifact became a tool call", state.updates);
  const done = state.updates.find(
    (u) => u.sessionUpdate === "tool_call_update" && u.toolCallId === review.toolCallId && u.status === "completed",
  );
  expect(done !== undefined, "the review tool call completed", state.updates);
  results.review = done.content.map((c) => c.content.text).join("");
  const read = state.updates.find((u) => u.sessionUpdate === "tool_call" && u.kind === "read");
  expect(read !== undefined && read.locations[0].path === notes, "the file read showed as a read tool call", read);
  results.permissionOptions = state.permissions[0].options.map((o) => `${o.optionId}:${o.kind}`);

  // A prompt without files, publishing refused.
  state.updates.length = 0;
  const second = await ctx.request("session/prompt", {
    sessionId,
    prompt: [{ type: "text", text: "And this sentence, please." }],
  });
  expect(second.stopReason === "end_turn", "the second turn ends end_turn", second);
  results.secondTurn = state.updates.filter((u) => u.sessionUpdate === "agent_message_chunk").map(textOf);

  // A prompt cancelled as soon as its first chunk arrives; a question asked
  // meanwhile is answered `cancelled`, as the protocol asks of clients.
  state.updates.length = 0;
  let cancelled = false;
  state.onUpdate = (notification) => {
    if (!cancelled && notification.update.sessionUpdate === "agent_message_chunk") {
      cancelled = true;
      ctx.notify("session/cancel", { sessionId });
    }
  };
  const third = await ctx.request("session/prompt", {
    sessionId,
    prompt: [{ type: "text", text: "Take your time with this one." }],
  });
  expect(cancelled, "a chunk arrived before the turn ended", state.updates);
  expect(third.stopReason === "cancelled", "the cancelled turn ends cancelled", third);
  results.cancelledTurn = third.stopReason;
});

// Second connection, as after restarting the IDE: the session is listed and
// loaded, its history replayed before the answer.
await withAgent([], async (ctx, state) => {
  await initialize(ctx);
  const listed = await ctx.request("session/list", { cwd: workdir });
  const mine = listed.sessions.find((s) => s.sessionId === results.sessionId);
  expect(mine !== undefined, "session/list shows the session", listed);
  results.listed = { cwd: mine.cwd, title: mine.title, additionalDirectories: mine.additionalDirectories };

  let answered = false;
  const before = [];
  state.onUpdate = (notification) => {
    if (!answered) before.push(notification.update);
  };
  const loaded = await ctx.request("session/load", { sessionId: results.sessionId, cwd: workdir, mcpServers: [] });
  answered = true;
  expect(loaded !== undefined, "session/load answers", loaded);
  results.replay = before
    .filter((u) => u.sessionUpdate === "user_message_chunk" || u.sessionUpdate === "agent_message_chunk")
    .map((u) => `${u.sessionUpdate === "user_message_chunk" ? "user" : "agent"}: ${textOf(u) ?? u.content.type}`);
  expect(before.length === state.updates.length, "every replayed update came before the answer", state.updates);

  const unknown = await ctx
    .request("session/prompt", { sessionId: "no-such-session", prompt: [{ type: "text", text: "hi" }] })
    .then(
      () => undefined,
      (error) => error,
    );
  expect(unknown !== undefined, "a prompt for an unknown session fails");
  results.unknownSessionCode = unknown.code;
});

console.log(JSON.stringify(results));
