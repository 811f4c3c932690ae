// Drives `switchboard mcp-serve` with the official TypeScript SDK client (@modelcontextprotocol/sdk):
// lists the tools, calls each, sees an error result, cancels a running bash call and checks its
// process is gone. Prints "mcp-serve end to end: ok" on success; throws (exit 1) otherwise.
//
// Usage: node serve_client.mjs NODE_PREFIX SWITCHBOARD_BINARY WORKSPACE
import { pathToFileURL } from "node:url";
import fs from "node:fs";
import assert from "node:assert/strict";

const [prefix, binary, workspace] = process.argv.slice(2);
const sdk = (p) => import(pathToFileURL(`${prefix}/node_modules/@modelcontextprotocol/sdk/dist/esm/${p}`).href);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");

const transport = new StdioClientTransport({
  command: binary,
  args: ["mcp-serve", "--workspace", workspace],
  stderr: "inherit",
});
const client = new Client({ name: "switchboard-test", version: "1.0.0" });
await client.connect(transport);

// 1. The five built-in tools with their hints.
const { tools } = await client.listTools();
const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
assert.deepEqual(Object.keys(byName).sort(), ["bash", "edit_file", "glob", "read_file", "write_file"]);
for (const name of ["read_file", "glob"]) {
  assert.equal(byName[name].annotations.readOnlyHint, true, name);
}
for (const name of ["write_file", "edit_file", "bash"]) {
  assert.equal(byName[name].annotations.destructiveHint, true, name);
}
assert.equal(byName.read_file.inputSchema.type, "object");

const text = (r) => r.content.map((c) => c.text).join("");
const call = (name, args, options) => client.callTool({ name, arguments: args }, undefined, options);

// 2. Each tool.
let r = await call("write_file", { path: "notes/a.txt", content: "hello\n" });
assert.equal(r.isError, false, text(r));
r = await call("edit_file", { path: "notes/a.txt", old_text: "hello", new_text: "goodbye" });
assert.equal(r.isError, false, text(r));
r = await call("read_file", { path: "notes/a.txt" });
assert.equal(text(r), "goodbye");
r = await call("glob", { pattern: "notes/*.txt" });
assert.equal(text(r), "notes/a.txt");
r = await call("bash", { command: "cat notes/a.txt; echo from-bash" });
assert.equal(r.isError, false, text(r));
assert.match(text(r), /goodbye\s+from-bash/);

// 3. An error result carries the stable code.
r = await call("read_file", { path: "missing.txt" });
assert.equal(r.isError, true);
assert.match(text(r), /^Error \[execution_error\]: /);
r = await call("read_file", { path: "../outside" });
assert.equal(r.isError, true);
assert.match(text(r), /^Error \[permission_denied\]: /);
r = await call("read_file", { nope: 1 });
assert.equal(r.isError, true);
assert.match(text(r), /^Error \[invalid_arguments\]: /);

// 4. Cancel a running bash call: the client sends notifications/cancelled; the process dies.
const token = `sb-cancel-${process.pid}-${Date.now()}`;
const running = () =>
  fs.readdirSync("/proc").filter((p) => /^\d+$/.test(p)).some((p) => {
    try {
      return fs.readFileSync(`/proc/${p}/cmdline`, "utf8").includes(token);
    } catch {
      return false;
    }
  });
const controller = new AbortController();
const pending = call("bash", { command: `sleep 300; echo ${token}` }, { signal: controller.signal, timeout: 600000 });
const until = async (cond, what) => {
  for (let i = 0; i < 200; i++) {
    if (cond()) return;
    await new Promise((res) => setTimeout(res, 50));
  }
  throw new Error(`timed out waiting until ${what}`);
};
await until(running, "the bash call runs");
controller.abort("test cancels");
await assert.rejects(pending);
await until(() => !running(), "the cancelled bash call's processes are gone");

// The server still works after the cancellation.
r = await call("bash", { command: "echo still-here" });
assert.equal(text(r), "still-here");

await client.close();
console.log("mcp-serve end to end: ok");
