//! How a process that starts `switchboard serve` learns that it is ready, and makes it stop with
//! it — for the clients' `local()` and any launcher in any language.
//!
//! * `--ready-fd N`: once the server listens (its MCP servers up or failed), one line of JSON,
//!   `{"pid":PID,"url":"http://127.0.0.1:PORT"}`, is written to descriptor `N` (a pipe or a
//!   file); read up to its newline. A server that fails before that exits, so the reader sees
//!   end of file and no line.
//!   Nothing else writes there: the descriptor is the launcher's (it must have been open when the
//!   process started — never one the server opened itself), close-on-exec from the first line of
//!   `main`, so no command, MCP server or hook inherits it. Reading stderr for a "listening on"
//!   line is not a channel: an MCP server's warning or a tool's name can print one first.
//! * `--ready-file PATH`: the same line in a file, written beside it and renamed into place, so a
//!   reader that polls never sees half a line.
//! * `--stop-on-stdin-close`: the server stops as on SIGTERM (turns in flight get `--grace`) when
//!   its standard input reaches end of file — when every process holding the write end of the
//!   pipe has gone, however it went (`kill -9` included). What is written there is read and
//!   ignored. Linux's parent-death signal covers only the thread that forked; this covers any
//!   launcher that keeps a pipe.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Flags of `switchboard serve` for a launcher.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ReadyArgs {
    /// Once listening, write one line of JSON ({"pid": ..., "url": ...}) to this descriptor (a
    /// pipe or file inherited from the process that started the server).
    #[arg(long, value_name = "FD")]
    pub ready_fd: Option<i32>,
    /// Once listening, write the same line to this file (written beside it, then renamed).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// Stop, as on SIGTERM, when standard input reaches end of file (for a launcher that keeps a
    /// pipe to the server's stdin: the server stops when the launcher exits, however it exits).
    #[arg(long)]
    pub stop_on_stdin_close: bool,
}

/// Where the ready line goes, claimed at start (before anything could be written there).
#[derive(Debug, Default)]
pub struct Ready {
    fd: Option<std::fs::File>,
    file: Option<PathBuf>,
}

impl Ready {
    /// Claims `--ready-fd` (it must be a descriptor this process inherited, open for writing)
    /// and checks that `--ready-file`'s directory exists. The error names the flag.
    pub fn claim(args: &ReadyArgs) -> Result<Ready, String> {
        let fd = match args.ready_fd {
            None => None,
            Some(n) => Some(claim_fd(n)?),
        };
        if let Some(path) = &args.ready_file {
            let dir = parent_dir(path);
            if !dir.is_dir() {
                return Err(format!(
                    "--ready-file {}: the directory {} does not exist",
                    path.display(),
                    dir.display()
                ));
            }
            // A file left by an earlier run would pass for this one's line (a dead pid, a URL
            // that may be another server's): it goes before anything could poll it.
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(format!(
                        "--ready-file {}: cannot remove the file an earlier run left: {e}",
                        path.display()
                    ));
                }
            }
        }
        Ok(Ready {
            fd,
            file: args.ready_file.clone(),
        })
    }

    /// Writes the ready line to the descriptor (then closed) and the file. A launcher that has
    /// gone (a closed pipe) is not an error of the server's: it is logged, and serving goes on
    /// (with `--stop-on-stdin-close` it stops by that road).
    pub fn announce(self, addr: SocketAddr) -> Result<(), String> {
        let line = ready_line(addr);
        if let Some(mut fd) = self.fd
            && let Err(e) = fd.write_all(line.as_bytes())
        {
            tracing::warn!(error = %e, "serve: cannot write the ready line to --ready-fd");
        }
        if let Some(path) = self.file {
            write_atomically(&path, &line)
                .map_err(|e| format!("--ready-file {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

/// The ready line: the URL to use and the server's process id, then a newline.
fn ready_line(addr: SocketAddr) -> String {
    let value = serde_json::json!({
        "url": format!("http://{addr}"),
        "pid": std::process::id(),
    });
    format!("{value}\n")
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn write_atomically(path: &Path, line: &str) -> std::io::Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(parent_dir(path))?;
    tmp.write_all(line.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn claim_fd(n: i32) -> Result<std::fs::File, String> {
    if n <= 2 {
        return Err(format!(
            "--ready-fd {n}: descriptors 0, 1 and 2 are stdin, stdout and stderr; pass another one"
        ));
    }
    if !crate::process_guard::inherited_known() {
        // An embedder's `main` that runs `serve` without recording its inherited descriptors
        // first: no descriptor can be told apart from one the process opened itself.
        return Err(format!(
            "--ready-fd {n}: this program did not record the descriptors it was started with (call process_guard::close_inherited_fds first thing in main)"
        ));
    }
    refuse_unless_inherited(n, crate::process_guard::was_inherited(n))?;
    // The descriptor's open mode, from the kernel's own account of it (no unsafe code is needed
    // to read it, nor to reopen it below).
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{n}"))
        .map_err(|e| format!("--ready-fd {n}: cannot inspect it: {e}"))?;
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .ok_or_else(|| format!("--ready-fd {n}: cannot read its flags"))?;
    // O_ACCMODE is 3: 1 is O_WRONLY, 2 is O_RDWR.
    if flags & 3 == 0 {
        return Err(format!("--ready-fd {n}: not open for writing"));
    }
    // The same pipe or file, opened anew for writing (a socket cannot be reopened this way).
    // The inherited descriptor stays open, close-on-exec and unused, until the process exits:
    // a reader reads up to the line's newline (or end of file, if the server exits first).
    // Appending, so a log file given as the descriptor keeps what it holds; without blocking,
    // since opening a pipe whose reader has gone would otherwise wait for one forever (ENXIO).
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(format!("/proc/self/fd/{n}"))
        .map_err(|e| match e.raw_os_error() {
            Some(6) => format!(
                "--ready-fd {n}: no process reads the pipe any more (its launcher has gone)"
            ),
            _ => format!("--ready-fd {n}: cannot open it for writing (a pipe or a file): {e}"),
        })
}

fn refuse_unless_inherited(n: i32, inherited: bool) -> Result<(), String> {
    if inherited {
        Ok(())
    } else {
        Err(format!(
            "--ready-fd {n}: not a descriptor this process was started with (open it in the launcher, without close-on-exec)"
        ))
    }
}

/// With `--stop-on-stdin-close`: resolves when standard input reaches end of file (or cannot be
/// read). Reads on a thread of its own (a blocking read that outlives the server harms nothing:
/// the process exits).
pub fn stdin_closed() -> impl std::future::Future<Output = ()> + Send + 'static {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("stdin-watch".into())
        .spawn(move || {
            let mut buf = [0u8; 512];
            let mut stdin = std::io::stdin().lock();
            loop {
                match std::io::Read::read(&mut stdin, &mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
    async move {
        match spawned {
            // A sender dropped without sending is the thread's end too.
            Ok(_) => {
                let _ = rx.await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "serve: cannot watch stdin; --stop-on-stdin-close is off");
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_is_one_line_of_json_with_the_url_and_pid() {
        let line = ready_line("127.0.0.1:4567".parse().unwrap());
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["url"], "http://127.0.0.1:4567");
        assert_eq!(v["pid"], std::process::id());
    }

    #[test]
    fn a_descriptor_the_process_did_not_inherit_is_refused() {
        // Which descriptors were inherited is process-wide state that other unit tests set;
        // the real binary's refusal is tested in tests/serve/serve_launcher.rs.
        let e = refuse_unless_inherited(7, false).unwrap_err();
        assert!(
            e.contains("--ready-fd 7: not a descriptor this process was started with"),
            "{e}"
        );
        assert!(refuse_unless_inherited(7, true).is_ok());
        assert!(claim_fd(1).unwrap_err().contains("stdout"));
    }

    #[test]
    fn the_ready_file_appears_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready.json");
        // An earlier run's file is gone once the flag is claimed, before the server is ready.
        std::fs::write(&path, "{\"pid\":1,\"url\":\"http://127.0.0.1:1\"}\n").unwrap();
        let ready = Ready::claim(&ReadyArgs {
            ready_file: Some(path.clone()),
            ..ReadyArgs::default()
        })
        .unwrap();
        assert!(!path.exists());
        ready.announce("127.0.0.1:9".parse().unwrap()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("{\"pid\":") || text.starts_with("{\"url\":"),
            "{text}"
        );
        assert!(text.contains("http://127.0.0.1:9"));
        let missing = Ready::claim(&ReadyArgs {
            ready_file: Some(dir.path().join("no/such/ready.json")),
            ..ReadyArgs::default()
        })
        .unwrap_err();
        assert!(missing.contains("does not exist"), "{missing}");
    }
}
