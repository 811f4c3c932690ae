// The README's TypeScript quick start, run as written (the sidecar's URL swapped for the test
// server's) with the real @anthropic-ai/sdk against a scripted model on loopback.
import assert from "node:assert/strict";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { scriptedModel } from "./_models.mjs";
import { TOKEN, startServer } from "./_server.mjs";

const README = fileURLToPath(new URL("../../../README.md", import.meta.url));

function snippet() {
  const text = readFileSync(README, "utf8");
  const section = text.slice(text.indexOf("### TypeScript client"));
  return /```js\n([\s\S]*?)```/.exec(section)[1];
}

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

test("the README's TypeScript quick start runs as written", async () => {
  const model = await scriptedModel();
  // Inside the package, so `switchboard-client` resolves to this package and the SDK to its
  // node_modules, as in a project that installed both.
  const file = fileURLToPath(new URL("./.readme-snippet.mjs", import.meta.url));
  writeFileSync(file, snippet().replace("http://127.0.0.1:7420", server.baseUrl));
  const saved = { ...process.env };
  Object.assign(process.env, {
    ANTHROPIC_BASE_URL: model.url,
    ANTHROPIC_API_KEY: "test-key",
    MODEL_ID: "scripted",
    SWITCHBOARD_TOKEN: TOKEN,
  });
  try {
    await import(file);
    assert.equal(model.requests.length, 2);
    assert.ok(model.requests[0].body.tools.some((t) => t.name === "ticket"));
    const results = model.requests[1].body.messages.at(-1);
    assert.equal(results.role, "user");
    assert.deepEqual(
      results.content.map((b) => b.tool_use_id),
      ["toolu_t", "toolu_g"],
    );
    assert.equal(JSON.parse(results.content[0].content).status, "open");
  } finally {
    process.env = saved;
    rmSync(file, { force: true });
    await model.close();
  }
});
