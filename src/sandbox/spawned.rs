//! The engine's side of the spawner ([`super::spawner`]): one per engine (per [`super::Sandbox`]
//! prepared), started with the first call that needs it and again after it died, and a call
//! started through it ([`Spawned`]), which the engine reads and waits for as for a child.
//!
//! A call's command ([`super::CallSandbox::command`]) is sent as it is — its policy and program,
//! its environment, its directory — with a `/dev/null` stdin and the write ends of
//! two fresh pipes; the spawner forks it and answers with its pid, then its wait status. Where
//! the spawner cannot serve (it would not start, it died, no async runtime), the call starts
//! its trampoline as a child of the engine instead, as before: same confinement, one program
//! start dearer.
//!
//! Nothing started through it is left running unowned: a call whose future is dropped kills its
//! process group (as `kill_on_drop` does for a child), a `started` answer that finds nobody
//! waiting kills the group it names, and the spawner's process is killed with the engine's last
//! handle on it (and by its parent-death signal should the engine die).

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncRead, AsyncReadExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::Command;
use tokio::sync::mpsc;

use super::exec::SUBCOMMAND;
use super::policy::CallCommand;
use super::spawner::{
    EXITED, FAILED, READY, REPLY_LEN, Request, STARTED, decode_reply, send_with_fds,
};
use crate::locks::lock;

/// How long a fresh spawner has to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the spawner said of one call (or that it is gone).
#[derive(Debug)]
enum Reply {
    Started(i32),
    Exited(i32),
    Failed(i32),
    Gone,
}

type Pending = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Reply>>>>;

/// An engine's spawner, started when first needed.
#[derive(Default)]
pub(super) struct SpawnerSlot {
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    /// Set when a spawner would not start: calls then start their trampolines themselves.
    disabled: AtomicBool,
}

impl std::fmt::Debug for SpawnerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnerSlot")
    }
}

/// A running spawner.
struct Conn {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
    alive: Arc<AtomicBool>,
    pid: Option<u32>,
    /// Killed when the connection is dropped (`kill_on_drop`).
    _process: tokio::process::Child,
}

impl SpawnerSlot {
    /// Starts `call` — a trampoline command of `trampoline` ([`super::CallSandbox::command`]) —
    /// through the spawner. `None` when the spawner cannot serve: the caller starts it itself.
    pub(super) async fn spawn(&self, trampoline: &Path, call: &CallCommand) -> Option<Spawned> {
        if self.disabled.load(Ordering::Relaxed) || tokio::runtime::Handle::try_current().is_err() {
            return None;
        }
        let request = request_of(call)?;
        let conn = self.conn(trampoline).await?;
        match conn.run(request).await {
            Ok(spawned) => Some(spawned),
            Err(e) => {
                tracing::warn!(
                    "sandbox: the spawner did not start a call ({e}); starting it directly"
                );
                None
            }
        }
    }

    /// The pid of the running spawner, if one runs.
    pub(super) async fn pid(&self) -> Option<u32> {
        let conn = self.conn.lock().await;
        conn.as_ref()
            .filter(|c| c.alive.load(Ordering::Relaxed))
            .and_then(|c| c.pid)
    }

    async fn conn(&self, trampoline: &Path) -> Option<Arc<Conn>> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| c.alive.load(Ordering::Relaxed)) {
            return Some(Arc::clone(conn));
        }
        *slot = None;
        match Conn::open(trampoline).await {
            Ok(conn) => {
                let conn = Arc::new(conn);
                *slot = Some(Arc::clone(&conn));
                Some(conn)
            }
            Err(e) => {
                tracing::warn!(
                    "sandbox: cannot start the spawner ({e}); each call starts its trampoline"
                );
                self.disabled.store(true, Ordering::Relaxed);
                None
            }
        }
    }
}

/// The request of a call's command: its policy and program as they are (no command line read
/// back), its environment (set whole: the bash tool clears the engine's), its directory (else
/// the engine's).
fn request_of(call: &CallCommand) -> Option<Request> {
    let cmd = call.command().as_std();
    let cwd: OsString = match cmd.get_current_dir() {
        Some(dir) => dir.into(),
        None => std::env::current_dir().ok()?.into(),
    };
    Some(Request {
        id: 0,
        policy: call.policy.clone(),
        program: call.program.clone(),
        env: cmd
            .get_envs()
            .filter_map(|(name, value)| Some((name.into(), value?.into())))
            .collect(),
        cwd,
    })
}

impl Conn {
    async fn open(trampoline: &Path) -> std::io::Result<Conn> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let process = Command::new(trampoline)
            .args([SUBCOMMAND, super::spawner::FLAG, "--parent"])
            .arg(std::process::id().to_string())
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        ours.set_nonblocking(true)?;
        let (reader, writer) = UnixStream::from_std(ours)?.into_split();
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (ready_tx, mut ready) = mpsc::unbounded_channel();
        lock(&pending).insert(0, ready_tx);
        tokio::spawn(read_replies(
            reader,
            Arc::clone(&pending),
            Arc::clone(&alive),
        ));
        let conn = Conn {
            writer: tokio::sync::Mutex::new(writer),
            pending,
            next_id: AtomicU64::new(1),
            alive,
            pid: process.id(),
            _process: process,
        };
        match tokio::time::timeout(READY_TIMEOUT, ready.recv()).await {
            Ok(Some(Reply::Started(_))) => Ok(conn),
            Ok(_) => Err(std::io::Error::other("it ended before it was ready")),
            Err(_) => Err(std::io::Error::other("it did not answer")),
        }
    }

    async fn run(self: &Arc<Conn>, mut request: Request) -> std::io::Result<Spawned> {
        let (out_read, out_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (err_read, err_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let null = std::fs::File::open("/dev/null")?;
        request.id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, replies) = mpsc::unbounded_channel();
        lock(&self.pending).insert(request.id, tx);
        let mut waiting = Waiting {
            conn: Arc::clone(self),
            id: request.id,
            replies: Some(replies),
        };
        let bytes = request.encode();
        // Sent by a task of its own: a call dropped half-way must not tear the stream.
        let conn = Arc::clone(self);
        let sent = tokio::spawn(async move {
            let writer = conn.writer.lock().await;
            let socket: &UnixStream = writer.as_ref();
            let fds = [null.as_fd(), out_write.as_fd(), err_write.as_fd()];
            let mut sent = socket
                .async_io(Interest::WRITABLE, || {
                    send_with_fds(socket, &bytes, &fds).map_err(std::io::Error::from)
                })
                .await?;
            while sent < bytes.len() {
                sent += socket
                    .async_io(Interest::WRITABLE, || {
                        rustix::net::send(socket, &bytes[sent..], rustix::net::SendFlags::NOSIGNAL)
                            .map_err(std::io::Error::from)
                    })
                    .await?;
            }
            Ok::<(), std::io::Error>(())
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|sent| sent);
        if let Err(e) = sent {
            self.alive.store(false, Ordering::Relaxed);
            return Err(e);
        }
        let replies = waiting.replies.as_mut().expect("taken only on drop");
        let pid = match replies.recv().await {
            Some(Reply::Started(pid)) => pid,
            Some(Reply::Failed(errno)) => {
                return Err(std::io::Error::other(format!(
                    "it could not fork (errno {errno})"
                )));
            }
            _ => return Err(std::io::Error::other("it ended")),
        };
        let pid = Pid::from_raw(pid).ok_or_else(|| std::io::Error::other("pid 0"))?;
        Ok(Spawned {
            pid,
            stdout: Some(pipe::Receiver::from_owned_fd(out_read)?),
            stderr: Some(pipe::Receiver::from_owned_fd(err_read)?),
            replies: waiting.replies.take().expect("present"),
            status: None,
            _conn: Arc::clone(self),
        })
    }
}

/// A request sent and not yet answered: dropped early (the call was cancelled), it forgets the
/// request and kills a call that had started meanwhile.
struct Waiting {
    conn: Arc<Conn>,
    id: u64,
    replies: Option<mpsc::UnboundedReceiver<Reply>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut replies) = self.replies.take() else {
            return;
        };
        lock(&self.conn.pending).remove(&self.id);
        while let Ok(reply) = replies.try_recv() {
            if let Reply::Started(pid) = reply {
                kill_group(pid);
            }
        }
    }
}

fn kill_group(pid: i32) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = kill_process_group(pid, Signal::KILL);
    }
}

/// Reads the spawner's answers and hands each to its call; when the spawner is gone, tells
/// every call still waiting.
async fn read_replies(mut reader: OwnedReadHalf, pending: Pending, alive: Arc<AtomicBool>) {
    /// Runs however the task ends (the runtime shutting down drops it).
    struct Gone(Pending, Arc<AtomicBool>);
    impl Drop for Gone {
        fn drop(&mut self) {
            self.1.store(false, Ordering::Relaxed);
            for (_, tx) in lock(&self.0).drain() {
                let _ = tx.send(Reply::Gone);
            }
        }
    }
    let _gone = Gone(Arc::clone(&pending), alive);
    let mut buf = [0u8; REPLY_LEN];
    while reader.read_exact(&mut buf).await.is_ok() {
        let (id, kind, value) = decode_reply(&buf);
        let mut pending = lock(&pending);
        match kind {
            STARTED | READY => {
                let delivered = pending
                    .get(&id)
                    .is_some_and(|tx| tx.send(Reply::Started(value)).is_ok());
                if kind == READY {
                    pending.remove(&id);
                } else if !delivered {
                    // Nobody waits for it any more.
                    kill_group(value);
                }
            }
            EXITED | FAILED => {
                if let Some(tx) = pending.remove(&id) {
                    let reply = if kind == EXITED {
                        Reply::Exited(value)
                    } else {
                        Reply::Failed(value)
                    };
                    let _ = tx.send(reply);
                }
            }
            _ => break,
        }
    }
}

/// One call started through the spawner. Dropped before it ended, it kills its process group.
pub struct Spawned {
    pid: Pid,
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    replies: mpsc::UnboundedReceiver<Reply>,
    status: Option<ExitStatus>,
    /// The spawner stays while one of its calls runs.
    _conn: Arc<Conn>,
}

impl std::fmt::Debug for Spawned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawned").field("pid", &self.pid).finish()
    }
}

impl Spawned {
    /// Waits for the call's trampoline to end (cancel-safe, like [`tokio::process::Child::wait`]).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        loop {
            match self.replies.recv().await {
                Some(Reply::Exited(raw)) => {
                    let status = ExitStatus::from_raw(raw);
                    self.status = Some(status);
                    return Ok(status);
                }
                Some(Reply::Started(_)) => {}
                Some(Reply::Failed(_) | Reply::Gone) | None => {
                    return Err(std::io::Error::other(
                        "the sandbox's spawner ended while the command ran",
                    ));
                }
            }
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = kill_process_group(self.pid, Signal::KILL);
        }
    }
}

/// A process of a call: a child of the engine, or a call started through the spawner.
#[derive(Debug)]
pub enum Running {
    /// Started by the engine itself.
    Child(tokio::process::Child),
    /// Started by the engine's spawner.
    Spawned(Spawned),
}

/// One of a call's output pipes.
pub type OutputPipe = Box<dyn AsyncRead + Send + Unpin>;

impl Running {
    /// Its pid (which is also its session's and process group's id: it leads both).
    pub fn id(&self) -> Option<u32> {
        match self {
            Running::Child(child) => child.id(),
            Running::Spawned(s) => u32::try_from(s.pid.as_raw_nonzero().get()).ok(),
        }
    }

    /// Its stdout, once.
    pub fn take_stdout(&mut self) -> Option<OutputPipe> {
        match self {
            Running::Child(child) => child.stdout.take().map(|p| Box::new(p) as OutputPipe),
            Running::Spawned(s) => s.stdout.take().map(|p| Box::new(p) as OutputPipe),
        }
    }

    /// Its stderr, once.
    pub fn take_stderr(&mut self) -> Option<OutputPipe> {
        match self {
            Running::Child(child) => child.stderr.take().map(|p| Box::new(p) as OutputPipe),
            Running::Spawned(s) => s.stderr.take().map(|p| Box::new(p) as OutputPipe),
        }
    }

    /// Sends it `SIGKILL` unless it has been waited for: a child of the engine itself (which
    /// may not lead its session yet, just started), or the process group of a call the spawner
    /// started (which does: the spawner answers its pid only then).
    pub fn start_kill(&mut self) {
        match self {
            Running::Child(child) => {
                let _ = child.start_kill();
            }
            Running::Spawned(s) => {
                if s.status.is_none() {
                    let _ = kill_process_group(s.pid, Signal::KILL);
                }
            }
        }
    }

    /// Waits for it to end (cancel-safe).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Running::Child(child) => child.wait().await,
            Running::Spawned(s) => s.wait().await,
        }
    }
}
