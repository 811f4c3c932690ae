//! The MCP server configuration: the `mcpServers` JSON of Claude Desktop / Claude Code
//! (`.mcp.json`), plus Switchboard's own per-server keys.
//!
//! ```json
//! {"mcpServers": {
//!   "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."],
//!             "env": {"TOKEN": "${MY_TOKEN}"}, "cwd": "/srv", "timeout_ms": 30000},
//!   "remote": {"type": "http", "url": "https://example.com/mcp",
//!              "headers": {"Authorization": "Bearer ${API_KEY}"}, "parallel": true}
//! }}
//! ```
//!
//! Parsing is strict: an unknown key or a value of the wrong type is an error naming the server and
//! the key. `${VAR}` (and `${VAR:-default}`) in `env`, `headers` and `url` expand from the engine's
//! environment when the file is loaded; an unset variable without a default is an error. This
//! module owns no state: it turns text into a [`McpConfig`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

/// Default per-call timeout of an MCP tool.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(60_000);
/// Default time a server has to start and answer `initialize` and `tools/list`.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_millis(30_000);
/// Longest server name (it is part of every registry name of its tools).
pub const MAX_SERVER_NAME: usize = 32;
/// Default bound on the pages of one `tools/list` (`max_list_pages`).
pub const DEFAULT_MAX_LIST_PAGES: usize = 100;
/// Default bound on the tools of one server (`max_tools`).
pub const DEFAULT_MAX_TOOLS: usize = 10_000;
/// Default bound on the JSON bytes of one server's tool definitions, all pages together
/// (`max_list_bytes`): 16 MiB.
pub const DEFAULT_MAX_LIST_BYTES: usize = 16 * 1024 * 1024;

/// Every configured server, by name (sorted, so start order and listings are stable).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct McpConfig {
    /// The servers.
    pub servers: BTreeMap<String, ServerSpec>,
}

/// How to reach one server and the policy of its tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    /// Where the server is.
    pub transport: Transport,
    /// Per-call timeout of its tools (`timeout_ms`, default 60 s).
    pub timeout: Duration,
    /// Start, `initialize` and the first `tools/list` must finish within this
    /// (`startup_timeout_ms`, default 30 s).
    pub startup_timeout: Duration,
    /// `parallel`: `Some(true)` makes every tool concurrency-safe, `Some(false)` every tool serial;
    /// `None` follows each tool's `readOnlyHint`.
    pub parallel: Option<bool>,
    /// `max_concurrency`: at most this many calls of each of its tools at once.
    pub max_concurrency: Option<usize>,
    /// `enabled` (default true): a disabled server is listed but never started.
    pub enabled: bool,
    /// `defer` (`never`, `auto` or `always`; default `auto`): whether its tools may be left out
    /// of the model's context until `tool_search` finds them.
    pub defer: crate::tool::Defer,
    /// What its `tools/list` may bring in; beyond it the server fails to load.
    pub list_limits: ListLimits,
    /// `effect` (`read_only`, `idempotent` or `side_effect`): what a second run of any of its
    /// tools would do, overriding their `readOnlyHint` / `idempotentHint` (`None`: the hints).
    pub effect: Option<crate::tool::Effect>,
}

/// Bounds on one server's `tools/list`, all pages together: past any of them the listing stops
/// and the server fails to load (a re-listing keeps the tools it had), so a server that pages
/// forever or lists huge schemas cannot exhaust the engine's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListLimits {
    /// `max_list_pages`: pages (default 100).
    pub pages: usize,
    /// `max_tools`: tools (default 10,000).
    pub tools: usize,
    /// `max_list_bytes`: bytes of the tool definitions as JSON — names, descriptions, schemas,
    /// annotations (default 16 MiB).
    pub bytes: usize,
}

impl Default for ListLimits {
    fn default() -> Self {
        ListLimits {
            pages: DEFAULT_MAX_LIST_PAGES,
            tools: DEFAULT_MAX_TOOLS,
            bytes: DEFAULT_MAX_LIST_BYTES,
        }
    }
}

/// The transport of one server.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A child process speaking JSON-RPC lines on stdin/stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to the allowlisted environment (already expanded).
        env: BTreeMap<String, String>,
        /// Working directory (default: the engine's).
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The endpoint URL (already expanded).
        url: String,
        /// Headers sent with every request (already expanded).
        headers: BTreeMap<String, String>,
    },
}

impl Transport {
    /// `stdio` or `http`.
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "http",
        }
    }
}

impl ServerSpec {
    /// A stdio server with the default policy.
    pub fn stdio(command: impl Into<String>, args: impl IntoIterator<Item = String>) -> Self {
        Self::with_transport(Transport::Stdio {
            command: command.into(),
            args: args.into_iter().collect(),
            env: BTreeMap::new(),
            cwd: None,
        })
    }

    /// A Streamable HTTP server with the default policy.
    pub fn http(url: impl Into<String>) -> Self {
        Self::with_transport(Transport::Http {
            url: url.into(),
            headers: BTreeMap::new(),
        })
    }

    fn with_transport(transport: Transport) -> Self {
        ServerSpec {
            transport,
            timeout: DEFAULT_CALL_TIMEOUT,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            parallel: None,
            max_concurrency: None,
            enabled: true,
            defer: crate::tool::Defer::Auto,
            list_limits: ListLimits::default(),
            effect: None,
        }
    }
}

/// Why a configuration was refused: one line naming the file, server and key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// True when `name` is a valid server name: 1–32 of `[A-Za-z0-9_-]`, without `__` (the
/// separator of registry names) and not ending in `_` (`a_` would make `mcp__a___x`, which
/// begins with server `a`'s prefix `mcp__a__`): so no two servers can give a tool the same
/// registry name.
pub fn valid_server_name(name: &str) -> bool {
    (1..=MAX_SERVER_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !name.contains("__")
        && !name.ends_with('_')
}

/// The rule of [`valid_server_name`], as error messages state it.
pub(crate) fn server_name_rule() -> String {
    format!(
        "names must be 1-{MAX_SERVER_NAME} of [A-Za-z0-9_-], without \"__\" and not ending in \"_\""
    )
}

impl McpConfig {
    /// Reads and parses `path`, expanding `${VAR}` from the process environment.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text, &|k| std::env::var(k).ok())
            .map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    /// Parses a configuration, expanding `${VAR}` through `env`.
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let doc: Value =
            serde_json::from_str(text).map_err(|e| ConfigError(format!("not valid JSON: {e}")))?;
        let Value::Object(top) = doc else {
            return Err(ConfigError("the top level must be a JSON object".into()));
        };
        let mut servers = BTreeMap::new();
        for (key, value) in top {
            if key != "mcpServers" {
                return Err(ConfigError(format!(
                    "unknown top-level key {key:?} (expected \"mcpServers\")"
                )));
            }
            let Value::Object(entries) = value else {
                return Err(ConfigError("\"mcpServers\" must be an object".into()));
            };
            for (name, entry) in entries {
                if !valid_server_name(&name) {
                    return Err(ConfigError(format!(
                        "server {name:?}: {}",
                        server_name_rule()
                    )));
                }
                let spec = parse_server(entry, env)
                    .map_err(|e| ConfigError(format!("server {name:?}: {e}")))?;
                servers.insert(name, spec);
            }
        }
        Ok(McpConfig { servers })
    }
}

fn parse_server(entry: Value, env: &dyn Fn(&str) -> Option<String>) -> Result<ServerSpec, String> {
    let Value::Object(mut obj) = entry else {
        return Err("must be an object".into());
    };
    let kind = match obj.remove("type") {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err("\"type\": must be a string".into()),
    };
    let kind = kind.unwrap_or_else(|| {
        if obj.contains_key("url") {
            "http"
        } else {
            "stdio"
        }
        .to_string()
    });
    let mut spec = match kind.as_str() {
        "stdio" => ServerSpec::with_transport(Transport::Stdio {
            command: take_string(&mut obj, "command")?
                .ok_or("\"command\": required for a stdio server")?,
            args: take_strings(&mut obj, "args")?,
            env: expand_map(take_string_map(&mut obj, "env")?, "env", env)?,
            cwd: take_string(&mut obj, "cwd")?.map(PathBuf::from),
        }),
        "http" | "streamable-http" => {
            let url =
                take_string(&mut obj, "url")?.ok_or("\"url\": required for an http server")?;
            let url = expand(&url, env).map_err(|e| format!("\"url\": {e}"))?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("\"url\": {url:?} is not an http(s) URL"));
            }
            ServerSpec::with_transport(Transport::Http {
                url,
                headers: expand_map(take_string_map(&mut obj, "headers")?, "headers", env)?,
            })
        }
        "sse" => {
            return Err(
                "\"type\": \"sse\" (the deprecated HTTP+SSE transport) is not supported; use \"http\""
                    .into(),
            );
        }
        other => return Err(format!("\"type\": {other:?} is not \"stdio\" or \"http\"")),
    };
    if let Some(ms) = take_u64(&mut obj, "timeout_ms")? {
        spec.timeout = positive_ms(ms, "timeout_ms")?;
    }
    if let Some(ms) = take_u64(&mut obj, "startup_timeout_ms")? {
        spec.startup_timeout = positive_ms(ms, "startup_timeout_ms")?;
    }
    spec.parallel = take_bool(&mut obj, "parallel")?;
    if let Some(n) = take_u64(&mut obj, "max_concurrency")? {
        if n == 0 {
            return Err("\"max_concurrency\": must be at least 1".into());
        }
        spec.max_concurrency = Some(usize::try_from(n).unwrap_or(usize::MAX));
    }
    spec.enabled = take_bool(&mut obj, "enabled")?.unwrap_or(true);
    let limits = &mut spec.list_limits;
    for (key, limit) in [
        ("max_list_pages", &mut limits.pages),
        ("max_tools", &mut limits.tools),
        ("max_list_bytes", &mut limits.bytes),
    ] {
        if let Some(n) = take_u64(&mut obj, key)? {
            if n == 0 {
                return Err(format!("\"{key}\": must be at least 1"));
            }
            *limit = usize::try_from(n).unwrap_or(usize::MAX);
        }
    }
    if let Some(defer) = take_string(&mut obj, "defer")? {
        spec.defer = crate::tool::Defer::parse(&defer).ok_or_else(|| {
            format!("\"defer\": {defer:?} is not \"never\", \"auto\" or \"always\"")
        })?;
    }
    if let Some(effect) = take_string(&mut obj, "effect")? {
        spec.effect = Some(crate::tool::Effect::parse(&effect).ok_or_else(|| {
            format!(
                "\"effect\": {effect:?} is not \"read_only\", \"idempotent\" or \"side_effect\""
            )
        })?);
    }
    if let Some(key) = obj.keys().next() {
        let kind = spec.transport.kind();
        return Err(format!("unknown key {key:?} for a {kind} server"));
    }
    Ok(spec)
}

fn positive_ms(ms: u64, key: &str) -> Result<Duration, String> {
    if ms == 0 {
        return Err(format!("\"{key}\": must be at least 1"));
    }
    Ok(Duration::from_millis(ms))
}

fn take_string(obj: &mut Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match obj.remove(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("\"{key}\": must be a string")),
    }
}

fn take_bool(obj: &mut Map<String, Value>, key: &str) -> Result<Option<bool>, String> {
    match obj.remove(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(_) => Err(format!("\"{key}\": must be true or false")),
    }
}

fn take_u64(obj: &mut Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match obj.remove(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("\"{key}\": must be a non-negative integer")),
    }
}

fn take_strings(obj: &mut Map<String, Value>, key: &str) -> Result<Vec<String>, String> {
    match obj.remove(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s),
                _ => Err(format!("\"{key}\"[{i}]: must be a string")),
            })
            .collect(),
        Some(_) => Err(format!("\"{key}\": must be an array of strings")),
    }
}

fn take_string_map(
    obj: &mut Map<String, Value>,
    key: &str,
) -> Result<BTreeMap<String, String>, String> {
    match obj.remove(key) {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                _ => Err(format!("\"{key}\".{k}: must be a string")),
            })
            .collect(),
        Some(_) => Err(format!("\"{key}\": must be an object of strings")),
    }
}

fn expand_map(
    map: BTreeMap<String, String>,
    key: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, String> {
    map.into_iter()
        .map(|(k, v)| {
            let v = expand(&v, env).map_err(|e| format!("\"{key}\".{k}: {e}"))?;
            Ok((k, v))
        })
        .collect()
}

/// Expands `${VAR}` and `${VAR:-default}` in `text` through `env`. `$` not followed by `{` stays
/// as it is. An unset variable without a default, or an unclosed `${`, is an error.
pub(crate) fn expand(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed \"${{\" in {text:?}"))?;
        let inner = &after[..end];
        let (var, default) = match inner.split_once(":-") {
            Some((var, default)) => (var, Some(default)),
            None => (inner, None),
        };
        if var.is_empty() || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("bad variable name {var:?} in {text:?}"));
        }
        match (env(var), default) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => return Err(format!("${{{var}}} is not set in the environment")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "TOKEN" => Some("s3cret".into()),
            "HOST" => Some("example.com".into()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<McpConfig, String> {
        McpConfig::parse(text, &env).map_err(|e| e.0)
    }

    #[test]
    fn the_claude_code_format_parses_with_switchboard_keys() {
        let cfg = parse(
            r#"{"mcpServers": {
                "fs": {"command": "npx", "args": ["-y", "pkg"], "env": {"T": "${TOKEN}"},
                       "cwd": "/tmp", "timeout_ms": 5000, "parallel": false, "defer": "always",
                       "effect": "idempotent"},
                "web": {"type": "http", "url": "https://${HOST}/mcp",
                        "headers": {"Authorization": "Bearer ${TOKEN}"}, "max_concurrency": 4,
                        "startup_timeout_ms": 100, "enabled": false, "max_list_pages": 3,
                        "max_tools": 50, "max_list_bytes": 65536}
            }}"#,
        )
        .unwrap();
        let fs = &cfg.servers["fs"];
        assert_eq!(fs.timeout, Duration::from_millis(5000));
        assert_eq!(fs.startup_timeout, DEFAULT_STARTUP_TIMEOUT);
        assert_eq!(fs.parallel, Some(false));
        assert_eq!(fs.defer, crate::tool::Defer::Always);
        assert_eq!(fs.effect, Some(crate::tool::Effect::Idempotent));
        assert_eq!(cfg.servers["web"].effect, None, "the tools' hints decide");
        assert_eq!(fs.list_limits, ListLimits::default());
        assert_eq!(
            (
                fs.list_limits.pages,
                fs.list_limits.tools,
                fs.list_limits.bytes
            ),
            (100, 10_000, 16 << 20)
        );
        assert!(fs.enabled);
        match &fs.transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                assert_eq!(command, "npx");
                assert_eq!(args, &["-y", "pkg"]);
                assert_eq!(env["T"], "s3cret");
                assert_eq!(cwd.as_deref(), Some(Path::new("/tmp")));
            }
            other => panic!("{other:?}"),
        }
        let web = &cfg.servers["web"];
        assert_eq!(web.timeout, DEFAULT_CALL_TIMEOUT);
        assert_eq!(web.max_concurrency, Some(4));
        assert_eq!(web.defer, crate::tool::Defer::Auto);
        assert_eq!(
            web.list_limits,
            ListLimits {
                pages: 3,
                tools: 50,
                bytes: 65536
            }
        );
        assert!(!web.enabled);
        assert_eq!(
            web.transport,
            Transport::Http {
                url: "https://example.com/mcp".into(),
                headers: [("Authorization".to_string(), "Bearer s3cret".to_string())].into(),
            }
        );
    }

    #[test]
    fn errors_name_the_server_and_the_key() {
        let cases = [
            (
                r#"{"mcpServers": {"a": {"command": "x", "timeout": 5}}}"#,
                r#"server "a": unknown key "timeout" for a stdio server"#,
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "timeout_ms": "5"}}}"#,
                r#"server "a": "timeout_ms": must be a non-negative integer"#,
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "env": {"K": "${NOPE}"}}}}"#,
                r#"server "a": "env".K: ${NOPE} is not set in the environment"#,
            ),
            (
                r#"{"mcpServers": {"a": {"args": []}}}"#,
                r#"server "a": "command": required for a stdio server"#,
            ),
            (
                r#"{"mcpServers": {"a": {"type": "sse", "url": "http://x"}}}"#,
                r#"server "a": "type": "sse" (the deprecated HTTP+SSE transport) is not supported; use "http""#,
            ),
            (
                r#"{"mcpServers": {"a b": {"command": "x"}}}"#,
                r#"server "a b": names must be 1-32 of [A-Za-z0-9_-], without "__" and not ending in "_""#,
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x"}, "a_": {"command": "x"}}}"#,
                r#"server "a_": names must be 1-32 of [A-Za-z0-9_-], without "__" and not ending in "_""#,
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "parallel": 1}}}"#,
                r#"server "a": "parallel": must be true or false"#,
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "defer": "later"}}}"#,
                r#"server "a": "defer": "later" is not "never", "auto" or "always""#,
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "effect": "pure"}}}"#,
                r#"server "a": "effect": "pure" is not "read_only", "idempotent" or "side_effect""#,
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "max_tools": 0}}}"#,
                r#"server "a": "max_tools": must be at least 1"#,
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "max_list_bytes": "1MB"}}}"#,
                r#"server "a": "max_list_bytes": must be a non-negative integer"#,
            ),
            (
                r#"{"servers": {}}"#,
                r#"unknown top-level key "servers" (expected "mcpServers")"#,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).unwrap_err(), want, "{text}");
        }
    }

    #[test]
    fn expansion_handles_defaults_and_leaves_plain_dollars() {
        assert_eq!(expand("a${TOKEN}b", &env).unwrap(), "as3cretb");
        assert_eq!(expand("${UNSET:-dflt}", &env).unwrap(), "dflt");
        assert_eq!(expand("$HOME and $", &env).unwrap(), "$HOME and $");
        assert!(expand("${TOKEN", &env).is_err());
        assert!(expand("${A-B}", &env).is_err());
    }

    #[test]
    fn server_names_exclude_the_separator() {
        assert!(valid_server_name("my-server_1"));
        assert!(!valid_server_name("a__b"));
        assert!(!valid_server_name(""));
        assert!(!valid_server_name(&"a".repeat(33)));
        assert!(!valid_server_name("a.b"));
        assert!(!valid_server_name("a_"));
        assert!(valid_server_name("_a") && valid_server_name("a-") && valid_server_name("a_b"));
    }
}
