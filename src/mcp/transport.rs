//! Opening one connection's transport: a stdio child process or a Streamable HTTP client.
//!
//! A stdio server gets the allowlisted environment and its configured variables, leads a
//! process group of its own, and runs under the engine's process-tree control
//! ([`crate::sandbox::Containment`]: started through the trampoline, which sets the
//! parent-death signal and moves it into a cgroup of its own before the server runs; or, where
//! there is none, marked by a token in its environment). Its messages go through
//! [`JsonLines`] (bounded lines, an answer for everything that cannot be read) and its stderr
//! into the debug log. Nothing it starts outlives the connection: closing it shuts the
//! server's stdin, then after 3 s sends SIGTERM to its process group, after 3 s more SIGKILL,
//! and then kills whatever is left of its tree (`setsid` daemons included); dropping it kills
//! at once.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use process_wrap::tokio::{ChildWrapper, CommandWrap, ProcessGroup};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, Transport as RmcpTransport};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::ChildStdout;

use super::config::Transport;
use super::wire::{JsonLines, Unread};
use crate::process_env::server_env;
use crate::sandbox::{Containment, Tree};

/// Longest stderr line logged (longer lines are cut).
const STDERR_LINE_CAP: usize = 2_000;
/// Stderr lines logged per connection; later ones are drained but not logged.
const STDERR_LINES_LOGGED: usize = 1_000;
/// How long a closing server gets after its stdin closed, then after SIGTERM.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// A stdio server's connection: its messages, its process, and the guard of its process tree.
pub(crate) struct ChildTransport {
    lines: JsonLines<RoleClient, ChildStdout>,
    child: Option<Box<dyn ChildWrapper>>,
    tree: Option<Tree>,
}

impl ChildTransport {
    /// Where the tools of a `tools/list` page that could not be read are reported.
    pub fn unread(&self) -> Unread {
        self.lines.unread()
    }

    /// Closes stdin, waits, SIGTERM, waits, SIGKILL (to the process group), then kills what is
    /// left of the tree.
    async fn shut_down(&mut self) {
        let _ = self.lines.close().await;
        if let Some(mut child) = self.child.take() {
            let exited = tokio::time::timeout(EXIT_GRACE, child.wait()).await.is_ok();
            if !exited {
                let _ = child.signal(rustix::process::Signal::TERM.as_raw());
                if tokio::time::timeout(EXIT_GRACE, child.wait())
                    .await
                    .is_err()
                {
                    let _ = Box::into_pin(child.kill()).await;
                }
            }
        }
        if let Some(tree) = self.tree.take() {
            tree.kill().await;
        }
    }
}

impl RmcpTransport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.lines.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.lines.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.shut_down().await;
        Ok(())
    }
}

impl Drop for ChildTransport {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL to the group, then reaped in the background.
            let _ = child.start_kill();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = child.wait().await;
                });
            }
        }
        // Dropping the tree kills what is left of it.
    }
}

/// A stdio server's transport, and the process id of its group leader.
pub fn spawn_stdio(
    server: &str,
    transport: &Transport,
    containment: &Containment,
) -> std::io::Result<(ChildTransport, u32)> {
    let Transport::Stdio {
        command,
        args,
        env,
        cwd,
    } = transport
    else {
        return Err(std::io::Error::other("not a stdio server"));
    };
    let env = server_env(std::env::vars(), env);
    // Checked here: started through the trampoline, a missing program would only show as a
    // connection closed before `initialize`.
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    find_program(command, path, cwd.as_deref())?;
    let (mut cmd, tree) = containment.command(command, args, env);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let mut wrapped = CommandWrap::from(cmd);
    wrapped.wrap(ProcessGroup::leader());
    let mut child = wrapped.spawn()?;
    let pid = child.id().unwrap_or(0);
    tree.adopt(pid);
    let (Some(stdin), Some(stdout)) = (child.stdin().take(), child.stdout().take()) else {
        let _ = child.start_kill();
        return Err(std::io::Error::other("the server's stdio was not set up"));
    };
    if let Some(stderr) = child.stderr().take() {
        tokio::spawn(drain_stderr(server.to_string(), stderr));
    }
    Ok((
        ChildTransport {
            lines: JsonLines::new(stdout, stdin),
            child: Some(child),
            tree: Some(tree),
        },
        pid,
    ))
}

/// The program a command names, as `exec` would find it: a path (relative to `cwd`), or a name
/// looked up in `path`. `Err` as `exec` would fail: not found, or not executable.
fn find_program(
    command: &str,
    path: Option<&str>,
    cwd: Option<&std::path::Path>,
) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &std::path::Path| {
        std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let not_found = || std::io::Error::from_raw_os_error(2);
    if command.contains('/') {
        let program = match cwd {
            Some(cwd) => cwd.join(command),
            None => std::path::PathBuf::from(command),
        };
        return match runnable(&program) {
            Ok(true) => Ok(program),
            Ok(false) => Err(std::io::Error::from_raw_os_error(13)),
            Err(e) => Err(e),
        };
    }
    std::env::split_paths(path.unwrap_or_default())
        .map(|dir| dir.join(command))
        .find(|p| runnable(p).unwrap_or(false))
        .ok_or_else(not_found)
}

/// Logs a server's stderr at debug, line by line, bounded in line length and count; keeps
/// draining after the cap so the server never blocks on a full pipe.
async fn drain_stderr(server: String, stderr: impl AsyncRead + Unpin) {
    let mut reader = BufReader::with_capacity(8 * 1024, stderr);
    let mut line = Vec::with_capacity(256);
    let mut logged = 0usize;
    loop {
        line.clear();
        // Read at most one buffer's worth per step so a line without newline cannot grow memory.
        let (done, used) = match reader.fill_buf().await {
            Ok([]) | Err(_) => return,
            Ok(buf) => match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (true, i + 1),
                None => (false, buf.len()),
            },
        };
        {
            let buf = reader.buffer();
            let take = used.min(STDERR_LINE_CAP);
            line.extend_from_slice(&buf[..take]);
        }
        reader.consume(used);
        if !done {
            // Skip the rest of an overlong line.
            loop {
                let (found, used) = match reader.fill_buf().await {
                    Ok([]) | Err(_) => break,
                    Ok(buf) => match buf.iter().position(|&b| b == b'\n') {
                        Some(i) => (true, i + 1),
                        None => (false, buf.len()),
                    },
                };
                reader.consume(used);
                if found {
                    break;
                }
            }
        }
        if logged < STDERR_LINES_LOGGED {
            logged += 1;
            let text = String::from_utf8_lossy(&line);
            tracing::debug!(target: "switchboard::mcp::stderr", server = %server, "{}", text.trim_end());
            if logged == STDERR_LINES_LOGGED {
                tracing::debug!(target: "switchboard::mcp::stderr", server = %server,
                    "{STDERR_LINES_LOGGED} stderr lines logged; the rest is drained unlogged");
            }
        }
    }
}

/// A Streamable HTTP transport with the configured headers, over the crate's reqwest client
/// (rustls with the `ring` provider).
pub fn http(
    transport: &Transport,
) -> Result<StreamableHttpClientTransport<reqwest::Client>, String> {
    let Transport::Http { url, headers } = transport else {
        return Err("not an http server".into());
    };
    crate::tls::install_crypto_provider();
    let mut custom = HashMap::new();
    for (k, v) in headers {
        let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|e| format!("header {k:?}: {e}"))?;
        let value =
            reqwest::header::HeaderValue::from_str(v).map_err(|e| format!("header {k:?}: {e}"))?;
        custom.insert(name, value);
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
        .custom_headers(custom)
        .max_json_response_size(64 * 1024 * 1024)
        .max_sse_event_size(64 * 1024 * 1024);
    Ok(StreamableHttpClientTransport::with_client(client, config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects what the fmt layer writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn stderr_is_logged_bounded_in_line_length_and_count_and_drained_to_the_end() {
        let captured = Captured::default();
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .without_time()
            .with_writer(move || sink.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        // One 1 MB line without a break, then 3,000 short lines, then a last line.
        let mut input = vec![b'x'; 1 << 20];
        input.push(b'\n');
        for i in 0..3_000 {
            input.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        input.extend_from_slice(b"the end\n");
        drain_stderr("srv".into(), &input[..]).await;
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // 1,000 stderr lines and the notice that the rest is drained unlogged.
        assert_eq!(lines.len(), STDERR_LINES_LOGGED + 1, "{}", lines.len());
        assert!(lines.iter().all(|l| l.len() < STDERR_LINE_CAP + 200));
        assert!(lines[0].contains(&"x".repeat(STDERR_LINE_CAP)));
        assert!(lines[1].contains(": line 0 server=srv"), "{}", lines[1]);
        assert!(lines[STDERR_LINES_LOGGED].contains("the rest is drained unlogged"));
        assert!(!text.contains("the end"));
    }

    #[test]
    fn programs_are_found_as_exec_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::env::var("PATH").unwrap();
        assert!(find_program("sh", Some(&path), None).is_ok());
        let e = find_program("no-such-program-here", Some(&path), None).unwrap_err();
        assert_eq!(e.to_string(), "No such file or directory (os error 2)");
        let e = find_program("/nonexistent/server", None, None).unwrap_err();
        assert_eq!(e.to_string(), "No such file or directory (os error 2)");
        std::fs::write(dir.path().join("plain"), "").unwrap();
        let e = find_program("./plain", None, Some(dir.path())).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn only_the_allowlist_and_configured_env_reach_a_server() {
        let parent = [
            ("PATH", "/bin"),
            ("HOME", "/root"),
            ("LC_ALL", "C"),
            ("ANTHROPIC_API_KEY", "sk-secret"),
            ("SSH_AUTH_SOCK", "/tmp/agent"),
            ("TERM", "xterm"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let configured = [
            ("TOKEN".to_string(), "t".to_string()),
            ("TERM".into(), "dumb".into()),
        ]
        .into_iter()
        .collect();
        let mut env = server_env(parent, &configured);
        env.sort();
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["HOME", "LC_ALL", "PATH", "TERM", "TOKEN"]);
        assert!(env.contains(&("TERM".into(), "dumb".into())));
    }
}
