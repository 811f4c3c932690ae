// The public types say what they hold: no `any` in the built declarations (dist/*.d.ts), so a
// TypeScript user's mistakes are caught, not waved through. (test/types/consumer.ts, compiled by
// `npm test`, checks that they fit the SDKs' own types.)
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const DIST = fileURLToPath(new URL("../dist/", import.meta.url));

/** The declarations without their comments, which may say "any" in prose. */
function code(text) {
  return text.replace(/\/\*[\s\S]*?\*\//g, (c) => c.replace(/[^\n]/g, "")).replace(/\/\/.*$/gm, "");
}

test("no `any` in the public types", () => {
  const files = readdirSync(DIST).filter((f) => f.endsWith(".d.ts"));
  assert.ok(files.includes("index.d.ts") && files.includes("local.d.ts"), files.join(", "));
  const found = [];
  for (const file of files) {
    code(readFileSync(DIST + file, "utf8"))
      .split("\n")
      .forEach((line, i) => {
        if (/\bany\b/.test(line)) found.push(`${file}:${i + 1}: ${line.trim()}`);
      });
  }
  assert.deepEqual(found, []);
});
