// `switchboard serve`'s options as `local()` takes them: camelCase names, the flag each one is,
// and how its value is written; the refusal of a name `serve` does not have. No I/O here.
// `SERVE_OPTIONS` mirrors the Python client's table (clients/python/switchboard_client/_local.py);
// test/local.test.mjs checks it against `switchboard serve --help`.

/** A duration: a string `serve` reads (`"30s"`, `"500ms"`, `"2m"`) or a number of seconds. */
export type Duration = string | number;

/** `switchboard serve`'s options `local()` passes on, with camelCase names (see
 * `switchboard serve --help`). A switch is `true` (the bare flag) or `false`/left out; a list
 * gives the flag once per item. */
export interface ServeOptions {
  logFormat?: "text" | "json";
  noAuth?: boolean;
  maxSessions?: number;
  sessionIdleTimeout?: Duration;
  maxBody?: number;
  /** How long turns in flight may finish when the server stops (local() default: `"1s"`; the
   * server's own default is 10 s). `close()` cancels its client's own turns first. */
  grace?: Duration;
  maxRequests?: number;
  maxSessionTurns?: number;
  readTimeout?: Duration;
  withLoadTools?: boolean;
  allowHardLinks?: boolean;
  maxClientTools?: number;
  maxClientSchemaBytes?: number;
  policy?: string;
  auditLog?: string;
  auditArgs?: boolean;
  approvalTimeout?: Duration;
  /** Stricter policies a session may choose: `{NAME: FILE}` or `["NAME=FILE", …]`. */
  sessionPolicy?: Record<string, string> | string[];
  sandbox?: "workspace-write" | "read-only" | "best-effort" | "off";
  allowNetwork?: boolean;
  maxProcesses?: number;
  maxMemory?: string | number;
  maxFileSize?: string | number;
  maxTmpSize?: string | number;
  sandboxRead?: string | string[];
  sandboxReadPath?: boolean;
  mcpConfig?: string;
  deferAutoAbove?: number;
  contextBudget?: number;
  journal?: string;
  journalRetention?: Duration;
  metricsAddr?: string;
  metricsFile?: string;
  cluster?: string;
  nodeId?: string;
  leaseTtl?: Duration;
  clusterRetention?: Duration;
  clusterJournalShards?: number;
  clusterJournalMemory?: number;
  clusterReplicas?: number;
  clusterCreds?: string;
  clusterTlsCa?: string;
  clusterTlsCert?: string;
  clusterTlsKey?: string;
}

type Kind = "value" | "duration" | "flag" | "repeat";

/** Each `ServeOptions` key: its flag and how its value is written. `--listen`,
 * `--workspace-root`, `--token-file`, `--ready-fd` and `--stop-on-stdin-close` are local()'s own. */
export const SERVE_OPTIONS: Readonly<Record<keyof ServeOptions, readonly [string, Kind]>> = {
  logFormat: ["--log-format", "value"],
  noAuth: ["--no-auth", "flag"],
  maxSessions: ["--max-sessions", "value"],
  sessionIdleTimeout: ["--session-idle-timeout", "duration"],
  maxBody: ["--max-body", "value"],
  grace: ["--grace", "duration"],
  maxRequests: ["--max-requests", "value"],
  maxSessionTurns: ["--max-session-turns", "value"],
  readTimeout: ["--read-timeout", "duration"],
  withLoadTools: ["--with-load-tools", "flag"],
  allowHardLinks: ["--allow-hard-links", "flag"],
  maxClientTools: ["--max-client-tools", "value"],
  maxClientSchemaBytes: ["--max-client-schema-bytes", "value"],
  policy: ["--policy", "value"],
  auditLog: ["--audit-log", "value"],
  auditArgs: ["--audit-args", "flag"],
  approvalTimeout: ["--approval-timeout", "duration"],
  sessionPolicy: ["--session-policy", "repeat"],
  sandbox: ["--sandbox", "value"],
  allowNetwork: ["--allow-network", "flag"],
  maxProcesses: ["--max-processes", "value"],
  maxMemory: ["--max-memory", "value"],
  maxFileSize: ["--max-file-size", "value"],
  maxTmpSize: ["--max-tmp-size", "value"],
  sandboxRead: ["--sandbox-read", "repeat"],
  sandboxReadPath: ["--sandbox-read-path", "flag"],
  mcpConfig: ["--mcp-config", "value"],
  deferAutoAbove: ["--defer-auto-above", "value"],
  contextBudget: ["--context-budget", "value"],
  journal: ["--journal", "value"],
  journalRetention: ["--journal-retention", "duration"],
  metricsAddr: ["--metrics-addr", "value"],
  metricsFile: ["--metrics-file", "value"],
  cluster: ["--cluster", "value"],
  nodeId: ["--node-id", "value"],
  leaseTtl: ["--lease-ttl", "duration"],
  clusterRetention: ["--cluster-retention", "duration"],
  clusterJournalShards: ["--cluster-journal-shards", "value"],
  clusterJournalMemory: ["--cluster-journal-memory", "value"],
  clusterReplicas: ["--cluster-replicas", "value"],
  clusterCreds: ["--cluster-creds", "value"],
  clusterTlsCa: ["--cluster-tls-ca", "value"],
  clusterTlsCert: ["--cluster-tls-cert", "value"],
  clusterTlsKey: ["--cluster-tls-key", "value"],
};

/** Names local() refuses, each with why. */
const MANAGED: Record<string, string> = {
  tokenFile: "local() chooses the token and gives it in a file of its own; pass `token` to choose it yourself",
  readyFd: "local() learns that the server is ready through a descriptor of its own",
  readyFile: "local() learns that the server is ready through a descriptor of its own",
  stopOnStdinClose: "local() always sets it: the server stops when this process ends",
  baseUrl: "local() chooses the address; pass `listen` to choose it yourself",
};

function durationArg(key: string, value: unknown): string {
  if (typeof value === "number") {
    if (!Number.isFinite(value) || value < 0) throw new RangeError(`local(): ${key} must be a duration of 0 seconds or more, not ${value}`);
    return `${Math.round(value * 1000)}ms`;
  }
  if (typeof value === "string") return value;
  throw new TypeError(`local(): ${key} takes a duration such as "30s" or a number of seconds, not ${describeValue(value)}`);
}

function describeValue(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return typeof value;
  }
}

export function unknownKeys(keys: string[], known: ReadonlySet<string>): void {
  const unknown = keys.filter((k) => !known.has(k)).sort();
  if (!unknown.length) return;
  const hints = unknown.map((k) => {
    if (k in MANAGED) return `${k}: ${MANAGED[k]}`;
    const camel = k.replace(/[_-]([a-z])/g, (_, c: string) => c.toUpperCase());
    return camel !== k && known.has(camel) ? `${k}: the option is ${camel}` : undefined;
  });
  const hint = hints.filter(Boolean).join("; ");
  throw new TypeError(
    `local(): unknown option(s) ${unknown.join(", ")}${hint ? ` (${hint})` : ""}; known: ${[...known].sort().join(", ")}`,
  );
}

export const SERVE_KEYS: ReadonlySet<string> = new Set(Object.keys(SERVE_OPTIONS));

/**
 * The `switchboard serve` flags for `options` (what `local()` passes): `{sandbox: "read-only"}`
 * is `--sandbox read-only`, `{allowNetwork: true}` the bare flag (`false` or `undefined`: left
 * out), a list such as `sandboxRead: [...]` one flag per item, `sessionPolicy` an object
 * `{NAME: FILE}` or a list of `NAME=FILE`, a duration a string (`"30s"`) or seconds. An option
 * `serve` does not have is a `TypeError`.
 */
export function serveArgs(options: ServeOptions): string[] {
  unknownKeys(Object.keys(options), SERVE_KEYS);
  const args: string[] = [];
  for (const [key, value] of Object.entries(options)) {
    const [flag, kind] = SERVE_OPTIONS[key as keyof ServeOptions];
    if (value === undefined || value === null) continue;
    if (kind === "flag") {
      if (typeof value !== "boolean") throw new TypeError(`local(): ${key} is a switch (true or false), not ${describeValue(value)}`);
      if (value) args.push(flag);
    } else if (kind === "repeat") {
      const items =
        Array.isArray(value) ? value : typeof value === "object" ? Object.entries(value).map(([name, file]) => `${name}=${String(file)}`) : [value];
      for (const item of items) {
        if (typeof item !== "string" && typeof item !== "number") throw new TypeError(`local(): ${key} takes strings, not ${describeValue(item)}`);
        args.push(flag, String(item));
      }
    } else if (kind === "duration") {
      args.push(flag, durationArg(key, value));
    } else {
      if (typeof value !== "string" && typeof value !== "number") throw new TypeError(`local(): ${key} takes one value, not ${describeValue(value)}`);
      args.push(flag, String(value));
    }
  }
  return args;
}

/** Milliseconds in a duration `serve` reads, when it is a plain one (`"2s"`, `"500ms"`, `"1m"`,
 * or seconds as a number); `undefined` for anything else. */
export function durationMs(value: Duration | undefined): number | undefined {
  if (typeof value === "number") return value * 1000;
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/.exec(value ?? "");
  if (!m) return undefined;
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? "s") as "ms" | "s" | "m" | "h"];
  return Number(m[1]) * unit;
}
