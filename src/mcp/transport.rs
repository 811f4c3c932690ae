//! Opening one connection's transport: a stdio child process (allowlisted environment, own
//! process group, stderr drained into the debug log) or a Streamable HTTP client.
//!
//! Nothing here outlives the connection: the child is owned by rmcp's transport, which on close
//! shuts its stdin, then sends SIGTERM to its process group, then SIGKILL, and kills the group if
//! the transport is dropped.

use std::collections::HashMap;
use std::process::Stdio;

use process_wrap::tokio::{CommandWrap, ProcessGroup};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use super::config::Transport;
use crate::process_env::server_env;

/// Longest stderr line logged (longer lines are cut).
const STDERR_LINE_CAP: usize = 2_000;
/// Stderr lines logged per connection; later ones are drained but not logged.
const STDERR_LINES_LOGGED: usize = 1_000;

/// A stdio server's transport, and the process id of its group leader.
pub fn spawn_stdio(
    server: &str,
    transport: &Transport,
) -> std::io::Result<(TokioChildProcess, u32)> {
    let Transport::Stdio {
        command,
        args,
        env,
        cwd,
    } = transport
    else {
        return Err(std::io::Error::other("not a stdio server"));
    };
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args)
        .env_clear()
        .envs(server_env(std::env::vars(), env))
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let mut wrapped = CommandWrap::from(cmd);
    wrapped.wrap(ProcessGroup::leader());
    let (child, stderr) = TokioChildProcess::builder(wrapped)
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    if let Some(stderr) = stderr {
        tokio::spawn(drain_stderr(server.to_string(), stderr));
    }
    Ok((child, pid))
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
