// A remote IDE on the TypeScript ACP SDK's WebSocket transport
// (@agentclientprotocol/sdk/experimental/ws-client) against the gateway's
// `GET /acp`: initialize, a new session, one prompt to the echo agent; then,
// on a connection of its own, a message past the gateway's limit.
//
// Usage: node [--experimental-websocket] ws_client.mjs NODE_DIR WS_URL CWD
//   (Node 20 needs the flag for its WebSocket; Node 22 has it built in.)
//   WS_URL is ws://host:port/acp?agent=echo&token=... Prints one JSON line of
//   results on stdout and exits 0, or names what broke and exits 1.

import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeDir, url, cwd] = process.argv.slice(2);
if (!cwd) {
  console.error("usage: node [--experimental-websocket] ws_client.mjs NODE_DIR WS_URL CWD");
  process.exit(2);
}
const require = createRequire(join(nodeDir, "package.json"));
const load = async (name) => import(pathToFileURL(require.resolve(name)).href);
const acp = await load("@agentclientprotocol/sdk");
const { createWebSocketStream } = await load("@agentclientprotocol/sdk/experimental/ws-client");

const updates = [];
const app = acp.client({ name: "chorus-acp-ws-test" }).onNotification("session/update", ({ params }) => {
  updates.push(params.update);
});
const results = await app.connectWith(createWebSocketStream(url), async (ctx) => {
  const init = await ctx.request("initialize", { protocolVersion: 1, clientCapabilities: {} });
  const { sessionId } = await ctx.request("session/new", { cwd, mcpServers: [] });
  const answer = await ctx.request("session/prompt", {
    sessionId,
    prompt: [{ type: "text", text: "hello over a websocket" }],
  });
  return {
    protocolVersion: init.protocolVersion,
    stopReason: answer.stopReason,
    said: updates.filter((u) => u.sessionUpdate === "agent_message_chunk").map((u) => u.content.text),
    toolCalls: updates.filter((u) => u.sessionUpdate === "tool_call").map((u) => u.title),
  };
});
// 3 MiB, past the limit of twice the gateway's 1 MiB body limit: the
// connection is closed (its close code, or null if it stayed open 5 s).
results.tooBigClosedWith = await new Promise((resolve) => {
  const socket = new WebSocket(url);
  const timer = setTimeout(() => resolve(null), 5000);
  socket.onopen = () => socket.send("x".repeat(3 * 1024 * 1024));
  socket.onerror = () => {};
  socket.onclose = (event) => {
    clearTimeout(timer);
    resolve(event.code);
  };
});
console.log(JSON.stringify(results));
process.exit(0);
