// Approvals: a server with --policy asks before write_file under notes/; onApproval answers,
// and without it the call is denied.
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, SwitchboardError } from "../dist/index.js";
import { TOKEN, assistant, startServer, toolUse } from "./_server.mjs";

let server;
let client;
let dir;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), "switchboard-ts-policy-"));
  const policy = join(dir, "policy.json");
  writeFileSync(policy, JSON.stringify({ permissions: { ask: ["write_file(notes/**)"], default: "allow" } }));
  server = await startServer(["--policy", policy]);
  client = new Client(server.baseUrl, { token: TOKEN });
});
after(async () => {
  assert.equal(await server.stop(), 0);
  rmSync(dir, { recursive: true, force: true });
});

// Each call a fresh tool_use_id: a session answers an id it has seen from its answers.
const write = (path, id) => assistant(toolUse(id, "write_file", { path, content: "hi" }));

test("onApproval decides each asked call", async () => {
  const session = await client.session().create();
  const seen = [];
  const stream = session.stream(write("notes/a.md", "w1"), { onApproval: (req) => (seen.push(req), true) });
  for await (const _ of stream);
  assert.deepEqual(
    seen.map((r) => r.tool_use_id),
    ["w1"],
  );
  assert.equal(seen[0].rule, "write_file(notes/**)");
  assert.equal(stream.approvals.length, 1);
  assert.equal(stream.answer.content[0].is_error, undefined);
  assert.ok(existsSync(join(session.workspace, "notes", "a.md")));

  // An async callback refusing; and dispatch takes onApproval too.
  const refused = await session.dispatch(write("notes/b.md", "w2"), { onApproval: async () => false });
  assert.match(refused.content[0].content, /^Error \[permission_denied\]/);
  assert.equal(existsSync(join(session.workspace, "notes", "b.md")), false);

  // Without a callback the call is denied at once; a call not asked runs.
  const denied = session.stream(write("notes/c.md", "w3"));
  for await (const _ of denied);
  assert.match(denied.answer.content[0].content, /^Error \[permission_denied\]/);
  assert.equal((await session.dispatch(write("free.md", "w4"))).content[0].is_error, undefined);
  await assert.rejects(session.approve("a999999", true), (e) => e instanceof SwitchboardError && e.code === "unknown_approval");
  await session.close();
});
