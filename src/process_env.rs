//! What the engine's environment passes on to the processes it starts: an allowlist, never the
//! whole environment (which may hold API keys).
//!
//! * Tool commands (`bash`) and external policy hooks start with [`TOOL_ENV`] only, copied by
//!   [`inherit_tool_env`]; each adds what it needs on top (`HOME`/`PWD` set to the workspace, the
//!   call id, the sandbox's `TMPDIR`).
//! * MCP stdio servers start with [`SERVER_ENV`] and every `LC_*` ([`server_env`]), then their
//!   configured `env`: a server is a program the user installed and configured, and commonly
//!   needs `HOME` and `USER` to find its own settings.

use std::collections::BTreeMap;

/// Variables copied from the engine's environment to a tool command or hook, when present;
/// nothing else is.
pub const TOOL_ENV: [&str; 17] = [
    "PATH",
    "LANG",
    "LANGUAGE",
    "TMPDIR",
    "LC_ALL",
    "LC_CTYPE",
    "LC_COLLATE",
    "LC_MESSAGES",
    "LC_MONETARY",
    "LC_NUMERIC",
    "LC_TIME",
    "LC_ADDRESS",
    "LC_IDENTIFICATION",
    "LC_MEASUREMENT",
    "LC_NAME",
    "LC_PAPER",
    "LC_TELEPHONE",
];

/// Variables of the engine's environment a stdio MCP server inherits (plus every `LC_*`);
/// nothing else reaches it except its configured `env`.
pub const SERVER_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM",
];

/// Clears `cmd`'s environment and copies the [`TOOL_ENV`] variables the engine has.
pub fn inherit_tool_env(cmd: &mut tokio::process::Command) {
    cmd.env_clear();
    for name in TOOL_ENV {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
}

/// The environment a stdio server starts with: the allowlisted part of `parent`, then
/// `configured` on top.
pub fn server_env(
    parent: impl IntoIterator<Item = (String, String)>,
    configured: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = parent
        .into_iter()
        .filter(|(k, _)| SERVER_ENV.contains(&k.as_str()) || k.starts_with("LC_"))
        .filter(|(k, _)| !configured.contains_key(k))
        .collect();
    env.extend(configured.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}
