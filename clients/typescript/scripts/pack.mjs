#!/usr/bin/env node
// Packs the npm packages of a release, the way esbuild and biome ship their binaries:
//
//   switchboard-client                the client (dist/, src/), whose optionalDependencies name
//                                     one package per platform at the same version;
//   switchboard-client-linux-<cpu>    the `switchboard` and `switchboard-sandbox` binaries of one
//                                     platform, with `os` and `cpu` set, so npm installs only the
//                                     one that fits the machine.
//
// local() finds the binary through that package (src/local.ts). Nothing here changes a tracked
// file: each package is staged in a temporary directory and packed from there.
//
//   node scripts/pack.mjs --out DIR [--version V] [--binaries DIR --cpu x64|arm64]...
//
// --version: default, the version of the crate (../../Cargo.toml), which `switchboard --version`
// prints too. --binaries DIR --cpu CPU (repeatable, in pairs): a directory holding `switchboard`
// and `switchboard-sandbox` built for linux-CPU. Without any pair only the client is packed.
// Run `npm ci` (or `npm run build`) first: the client's dist/ must be built.
// Prints the path of every tarball it wrote, one a line.

import { execFileSync } from "node:child_process";
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const clientDir = resolve(here, "..");
const repo = resolve(clientDir, "../..");
export const CPUS = ["x64", "arm64"];
export const platformPackage = (cpu) => `switchboard-client-linux-${cpu}`;

class PackError extends Error {}

/** Thrown, so each stage's `finally` removes its directory; reported at the top level. */
function fail(message) {
  throw new PackError(message);
}

function parse(argv) {
  const opts = { out: null, version: null, binaries: [] };
  let pendingDir = null;
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (!["--out", "--version", "--binaries", "--cpu"].includes(flag)) fail(`unknown option ${flag}`);
    if (value === undefined) fail(`${flag} needs a value`);
    i++;
    if (flag === "--out") opts.out = resolve(value);
    else if (flag === "--version") opts.version = value;
    else if (flag === "--binaries") pendingDir = resolve(value);
    else {
      if (!CPUS.includes(value)) fail(`--cpu ${value}: one of ${CPUS.join(", ")}`);
      if (pendingDir === null) fail(`--cpu ${value} needs a --binaries DIR before it`);
      opts.binaries.push({ dir: pendingDir, cpu: value });
      pendingDir = null;
    }
  }
  if (pendingDir !== null) fail("--binaries DIR needs a --cpu after it");
  if (opts.out === null) fail("--out DIR is required");
  return opts;
}

function crateVersion() {
  const toml = readFileSync(join(repo, "Cargo.toml"), "utf8");
  const m = toml.match(/^version\s*=\s*"([^"]+)"/m);
  if (!m) fail("no version in Cargo.toml");
  return m[1];
}

function npmPack(dir, out) {
  const name = execFileSync("npm", ["pack", "--silent", "--pack-destination", out], {
    cwd: dir,
    encoding: "utf8",
    env: { ...process.env, npm_config_ignore_scripts: "true" },
  }).trim().split("\n").pop();
  return join(out, name);
}

function packPlatform({ dir, cpu }, version, out) {
  const stage = mkdtempSync(join(tmpdir(), "switchboard-npm-"));
  try {
    mkdirSync(join(stage, "bin"));
    for (const bin of ["switchboard", "switchboard-sandbox"]) {
      const from = join(dir, bin);
      if (!existsSync(from)) fail(`${from}: no such binary (build it with cargo build --release)`);
      copyFileSync(from, join(stage, "bin", bin));
      chmodSync(join(stage, "bin", bin), 0o755);
    }
    const pkg = {
      name: platformPackage(cpu),
      version,
      description: `The switchboard binary for Linux ${cpu}, for switchboard-client's local(). Installed by switchboard-client; not used directly.`,
      license: "MIT OR Apache-2.0",
      os: ["linux"],
      cpu: [cpu],
      // A glibc (manylinux_2_28) build: npm skips it on musl (Alpine), where it could not run.
      libc: ["glibc"],
      files: ["bin"],
      preferUnplugged: true,
    };
    writeFileSync(join(stage, "package.json"), `${JSON.stringify(pkg, null, 2)}\n`);
    writeFileSync(
      join(stage, "README.md"),
      `# ${pkg.name}\n\nThe \`switchboard\` binary for Linux ${cpu}. \`switchboard-client\` depends on it\n` +
        "optionally; its `local()` starts this binary. Install `switchboard-client`, not this.\n",
    );
    return npmPack(stage, out);
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

function packClient(version, out) {
  if (!existsSync(join(clientDir, "dist", "index.js"))) fail(`${clientDir}/dist is not built: run npm ci --prefix ${clientDir}`);
  const stage = mkdtempSync(join(tmpdir(), "switchboard-npm-"));
  try {
    const pkg = JSON.parse(readFileSync(join(clientDir, "package.json"), "utf8"));
    pkg.version = version;
    pkg.optionalDependencies = Object.fromEntries(CPUS.map((cpu) => [platformPackage(cpu), version]));
    // Built already: a consumer's install runs no compiler.
    delete pkg.scripts;
    delete pkg.devDependencies;
    for (const entry of pkg.files) {
      const from = join(clientDir, entry);
      if (existsSync(from)) cpSync(from, join(stage, entry), { recursive: true });
    }
    writeFileSync(join(stage, "package.json"), `${JSON.stringify(pkg, null, 2)}\n`);
    return npmPack(stage, out);
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

try {
  const opts = parse(process.argv.slice(2));
  const version = opts.version ?? crateVersion();
  mkdirSync(opts.out, { recursive: true });
  for (const platform of opts.binaries) console.log(packPlatform(platform, version, opts.out));
  console.log(packClient(version, opts.out));
} catch (e) {
  if (!(e instanceof PackError)) throw e;
  process.stderr.write(`pack.mjs: ${e.message}\n`);
  process.exit(2);
}
