// Run by .ci/run inside a fresh Node app that installed the packed npm packages: `local()` must
// find the binary of the platform package (argv[2]) with no $SWITCHBOARD_BIN and no cargo on PATH,
// start it, answer one bash call, and stop it.
import { findBinary, local } from "switchboard-client";

const expected = process.argv[2];
const found = findBinary();
if (found !== expected) {
  console.error(`findBinary() found ${found}, expected the platform package's ${expected}`);
  process.exit(1);
}
const client = await local();
try {
  const answer = await client.withSession({}, (session) =>
    session.dispatch({
      role: "assistant",
      content: [{ type: "tool_use", id: "t1", name: "bash", input: { command: "echo fresh-app" } }],
    }),
  );
  const text = JSON.stringify(answer);
  if (!text.includes("fresh-app")) {
    console.error(`unexpected answer: ${text}`);
    process.exit(1);
  }
} finally {
  await client.close();
}
console.log(`local() dispatched through ${found}`);
