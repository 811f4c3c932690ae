//! Without `--allow-network`, bash cannot reach a server on the host's loopback (with bash's
//! `/dev/tcp` or with curl) nor anything else; with it, the same server answers — so the refusal
//! is the sandbox's doing, not a broken test server.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::sandbox::*;
use switchboard::sandbox::SandboxMode;

/// A tiny HTTP server on 127.0.0.1 (a free port) answering `hello-from-host` to each of at most
/// 16 connections; counts the connections it accepted.
fn loopback_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for stream in listener.incoming().take(16) {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let _ =
                stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 15\r\n\r\nhello-from-host");
        }
    });
    (port, accepted)
}

fn curl_present() -> bool {
    std::path::Path::new("/usr/bin/curl").exists()
}

#[tokio::test]
async fn the_hosts_loopback_server_cannot_be_reached_without_network() {
    let (_dir, ws) = temp_workspace();
    let (port, accepted) = loopback_server();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session = engine.session();
    let r = bash(
        &session,
        &format!("echo hi >/dev/tcp/127.0.0.1/{port} && echo CONNECTED"),
    )
    .await;
    let text = ok_text(&r);
    assert!(!text.contains("CONNECTED"), "{text}");
    assert!(text.contains("[exit code: 1]"), "{text}");
    if curl_present() {
        let r = bash(
            &session,
            &format!("curl -sS -m 5 http://127.0.0.1:{port}/ && echo FETCHED"),
        )
        .await;
        let text = ok_text(&r);
        assert!(
            !text.contains("hello-from-host") && !text.contains("FETCHED"),
            "{text}"
        );
    } else {
        println!("curl is not installed; only /dev/tcp was tried");
    }
    // Binding a port inside is possible (its own loopback), but the host cannot reach it: the
    // namespace's loopback is not the host's.
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the server saw a connection"
    );
}

#[tokio::test]
async fn allow_network_lets_the_same_server_answer() {
    let (_dir, ws) = temp_workspace();
    let (port, accepted) = loopback_server();
    let Some(engine) = engine(
        Some(&ws),
        config(SandboxMode::WorkspaceWrite).allow_network(true),
    ) else {
        return;
    };
    let session = engine.session();
    let r = bash(
        &session,
        &format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
        ),
    )
    .await;
    assert!(ok_text(&r).contains("hello-from-host"), "{}", r.content);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// A unix socket server at `path` answering like an agent or a container runtime would (a tiny
/// HTTP response, for curl); counts the connections it accepted.
fn unix_server(path: &std::path::Path) -> Arc<AtomicUsize> {
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\nAGENT-HELLO");
        }
    });
    accepted
}

#[tokio::test]
async fn unix_sockets_of_the_host_in_tmp_and_run_are_out_of_reach() {
    if !curl_present() {
        available("curl (needed to connect to a unix socket from bash)", false);
        return;
    }
    let (_dir, ws) = temp_workspace();
    // SSH_AUTH_SOCK-style (under /tmp) and Docker-style (under /run) sockets.
    let mut sockets = Vec::new();
    for base in ["/tmp", "/run"] {
        if !std::path::Path::new(base).is_dir() {
            continue;
        }
        let dir = tempfile::Builder::new()
            .prefix("switchboard-test-sock-")
            .tempdir_in(base)
            .unwrap();
        let path = dir.path().join("agent.sock");
        let accepted = unix_server(&path);
        sockets.push((dir, path, accepted));
    }
    let command = sockets
        .iter()
        .map(|(_, p, _)| {
            format!(
                "curl -sS -m 5 --unix-socket {} http://x/; echo",
                p.display()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let Some(confined) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let text = bash(&confined.session(), &command).await.content;
    assert!(!text.contains("AGENT-HELLO"), "{text}");
    for (_, path, accepted) in &sockets {
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            0,
            "{} was reached",
            path.display()
        );
    }
    // The same command without the sandbox reaches them: the sockets work.
    let Some(off) = engine(Some(&ws), config(SandboxMode::Off)) else {
        return;
    };
    let text = bash(&off.session(), &command).await.content;
    assert_eq!(text.matches("AGENT-HELLO").count(), sockets.len(), "{text}");
}
