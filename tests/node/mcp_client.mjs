// Drives `kernelmgr mcp` with the official MCP TypeScript SDK client
// (Client + StdioClientTransport) for tests/e2e/test_mcp*.py.
//
// usage: node mcp_client.mjs KERNELMGR_BINARY STEPS_JSON [SERVER_ARGS_JSON]
//
// STEPS_JSON is an array of steps, run in order on one connection:
//   {"op": "list_tools"}
//   {"op": "call", "name": "code_exec", "arguments": {...},
//    "progress": true,           // ask for progress (onprogress + token)
//    "cancel_after_ms": 3000,    // abort the request after this long
//    "timeout_ms": 120000}
//   {"op": "ping"}
// Prints one JSON object on stdout:
//   {"server": {name, version}, "instructions": "...", "capabilities": {...},
//    "steps": [{"ok": true, "result": ...} | {"ok": false, "error": "...", "code": N},
//              (call steps also get "progress": [{progress, message}], "elapsed_ms")]}
// The server's environment is ours (KERNELMGR_HOME etc.): the SDK's default
// would drop it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [binary, stepsJson, serverArgsJson] = process.argv.slice(2);
if (!binary || !stepsJson) {
  console.error("usage: node mcp_client.mjs KERNELMGR_BINARY STEPS_JSON [SERVER_ARGS_JSON]");
  process.exit(2);
}
const steps = JSON.parse(stepsJson);
const serverArgs = serverArgsJson ? JSON.parse(serverArgsJson) : [];

const transport = new StdioClientTransport({
  command: binary,
  args: ["mcp", ...serverArgs],
  env: { ...process.env },
  stderr: "inherit",
});
const client = new Client({ name: "kernelmgr-tests", version: "1.0.0" }, { capabilities: {} });

const out = { steps: [] };
try {
  await client.connect(transport);
  out.server = client.getServerVersion();
  out.instructions = client.getInstructions();
  out.capabilities = client.getServerCapabilities();
  for (const step of steps) {
    const rec = {};
    const t0 = Date.now();
    try {
      if (step.op === "list_tools") {
        rec.result = await client.listTools();
      } else if (step.op === "ping") {
        rec.result = await client.ping();
      } else if (step.op === "call") {
        const opts = { timeout: step.timeout_ms ?? 120000 };
        if (step.progress) {
          rec.progress = [];
          opts.onprogress = (p) => rec.progress.push(p);
          opts.resetTimeoutOnProgress = true;
        }
        let timer = null;
        if (step.cancel_after_ms) {
          const ac = new AbortController();
          opts.signal = ac.signal;
          timer = setTimeout(() => ac.abort("test cancels the call"), step.cancel_after_ms);
        }
        try {
          rec.result = await client.callTool(
            { name: step.name, arguments: step.arguments ?? {} },
            undefined,
            opts,
          );
        } finally {
          if (timer) clearTimeout(timer);
        }
      } else {
        throw new Error(`unknown step op ${step.op}`);
      }
      rec.ok = true;
    } catch (e) {
      rec.ok = false;
      rec.error = String(e?.message ?? e);
      if (typeof e?.code === "number") rec.code = e.code;
    }
    rec.elapsed_ms = Date.now() - t0;
    out.steps.push(rec);
    if (step.pause_ms) await new Promise((r) => setTimeout(r, step.pause_ms));
  }
} catch (e) {
  out.fatal = String(e?.stack ?? e);
}
try {
  await client.close();
} catch (e) {
  // the server may already be gone; the result says what happened
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(out.fatal ? 1 : 0);
