//! The spawner: the trampoline started once per engine (`switchboard sandbox-exec --spawner
//! --parent <engine pid>`) that forks every call's trampoline, so that a call costs no program
//! start besides its command's shell (see `docs/sandbox.md`, "What it costs").
//!
//! Its stdin is one end of a Unix stream socket pair whose other end the engine keeps
//! ([`super::spawned`]). For each call the engine sends one [`Request`] — the call's policy
//! ([`CallPolicy`], read once here: the child runs under that same value), the command, its whole
//! environment and its working directory — with the call's stdin, stdout and stderr attached
//! (`SCM_RIGHTS`). The
//! spawner forks (it is single-threaded: [`super::fork`]); the child first leads a session of its
//! own — a process group too, and no controlling terminal ([`own_session`]; the spawner answers
//! the pid only once it does) — takes those descriptors as 0, 1 and 2, enters the directory and
//! runs the trampoline as [`super::exec`] describes, with the spawner as its parent (its
//! parent-death signal, its check that the parent is still there). For a root engine it makes
//! the call's PID namespace itself just before the fork ([`PidNamespaces`]): the child is then
//! the namespace's init, and no process stands between them. The spawner answers `started
//! <pid>` and, when that child has ended (its pidfd turns readable), `exited <wait status>`: the
//! engine waits for the call as for a child of its own.
//!
//! Before its first confined call it empties its capability bounding set, which its calls
//! inherit (each would otherwise empty its own); it keeps its own capabilities, and no longer
//! forks unconfined calls (an engine's calls are all of one mode).
//!
//! It keeps none of the engine's environment (the engine starts it with an empty one), holds no
//! descriptor but the socket, `/dev/null`, its children's pidfds, its own namespaces, the
//! network namespaces it gives calls ([`Spare`]), `O_PATH` descriptors of the system paths
//! every call's Landlock rules name ([`super::landlock_rules::preopen`]), and a pidfd of itself
//! — all close-on-exec, and dropped in every child it forks but for what that child is given —
//! and dies with the engine: parent-death signal `SIGKILL`, and an end of file on the socket
//! (the engine dropped its end) ends it too. Either way every call it started dies with it
//! (their parent-death signal), and with them their namespaces.

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions, getpid, getppid, pidfd_open};

use super::policy::CallPolicy;

/// The flag that makes the trampoline a spawner.
pub(super) const FLAG: &str = "--spawner";
/// Descriptors sent with each request: the call's stdin, stdout and stderr.
pub(super) const STDIO_FDS: usize = 3;
/// The largest request body accepted (the engine sends arguments that `execve` would take:
/// far less).
const MAX_REQUEST: usize = 64 << 20;
/// A reply: `started`, the call's pid.
pub(super) const STARTED: u8 = 1;
/// A reply: `exited`, the call's raw wait status.
pub(super) const EXITED: u8 = 2;
/// A reply: the spawner could not fork (the value is the errno, or -1).
pub(super) const FAILED: u8 = 3;
/// A reply: the spawner is ready (id 0; the value is its pid).
pub(super) const READY: u8 = 4;
/// Bytes of one reply: the call's id (u64), the kind (u8), the value (i32), little-endian.
pub(super) const REPLY_LEN: usize = 13;

/// One call to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Request {
    pub id: u64,
    /// How the call is confined.
    pub policy: CallPolicy,
    /// The program and its arguments.
    pub program: Vec<OsString>,
    /// The command's whole environment.
    pub env: Vec<(OsString, OsString)>,
    /// The directory the command starts in.
    pub cwd: OsString,
}

impl Request {
    /// The request as sent: a little-endian u32 length, then the body: the id, the policy (as
    /// the trampoline's options, [`CallPolicy::args`]), the program, the environment and the
    /// directory — each list a count, each string a length and its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(256);
        body.extend_from_slice(&self.id.to_le_bytes());
        let string = |body: &mut Vec<u8>, s: &std::ffi::OsStr| {
            body.extend_from_slice(&(s.len() as u32).to_le_bytes());
            body.extend_from_slice(s.as_bytes());
        };
        for list in [self.policy.args(), self.program.clone()] {
            body.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for arg in &list {
                string(&mut body, arg);
            }
        }
        body.extend_from_slice(&(self.env.len() as u32).to_le_bytes());
        for (name, value) in &self.env {
            string(&mut body, name);
            string(&mut body, value);
        }
        string(&mut body, &self.cwd);
        let mut out = Vec::with_capacity(4 + body.len());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// A request's body (after its length).
    pub fn decode(body: &[u8]) -> Result<Request, String> {
        let mut body = Cursor(body);
        let id = u64::from_le_bytes(body.take(8)?.try_into().expect("8 bytes"));
        let policy = CallPolicy::parse(body.strings()?)?;
        let program = body.strings()?;
        let n = body.count()?;
        let mut env = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let name = body.string()?;
            env.push((name, body.string()?));
        }
        let cwd = body.string()?;
        if !body.0.is_empty() {
            return Err("a request has bytes after its end".into());
        }
        Ok(Request {
            id,
            policy,
            program,
            env,
            cwd,
        })
    }
}

/// What is left of a request's body.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("a request ends early".into());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn count(&mut self) -> Result<usize, String> {
        let bytes = self.take(4)?.try_into().expect("4 bytes");
        Ok(u32::from_le_bytes(bytes) as usize)
    }

    fn strings(&mut self) -> Result<Vec<OsString>, String> {
        let n = self.count()?;
        let mut list = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            list.push(self.string()?);
        }
        Ok(list)
    }

    fn string(&mut self) -> Result<OsString, String> {
        let len = self.count()?;
        self.take(len).map(|b| OsString::from_vec(b.to_vec()))
    }
}

/// One reply as sent.
pub(super) fn encode_reply(id: u64, kind: u8, value: i32) -> [u8; REPLY_LEN] {
    let mut out = [0u8; REPLY_LEN];
    out[..8].copy_from_slice(&id.to_le_bytes());
    out[8] = kind;
    out[9..].copy_from_slice(&value.to_le_bytes());
    out
}

/// One reply as received: id, kind, value.
pub(super) fn decode_reply(bytes: &[u8; REPLY_LEN]) -> (u64, u8, i32) {
    let id = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let value = i32::from_le_bytes(bytes[9..].try_into().expect("4 bytes"));
    (id, bytes[8], value)
}

/// A call the spawner started and has not yet seen end.
struct Running {
    id: u64,
    pid: Pid,
    pidfd: OwnedFd,
    /// The network namespace the call was given, back to [`Spare`] once the call has ended:
    /// only for a call that is the init of a PID namespace the spawner made, so that its end
    /// is the end of every process that could hold anything in the namespace.
    netns: Option<OwnedFd>,
}

/// The spawner's main: serves requests until the engine closes its end ([`Served::Done`]). In a
/// child it forked, returns the call to run ([`Served::Call`]).
pub(super) fn serve(parent: Option<i32>) -> Result<Served, String> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    if parent.is_none_or(|p| getppid() != Pid::from_raw(p)) {
        return Err("the engine that started the spawner is gone".into());
    }
    // The socket is stdin: move it off fd 0 and put /dev/null there.
    let socket = rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3)
        .map_err(|e| format!("cannot take the engine's socket: {e}"))?;
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    rustix::stdio::dup2_stdin(&null).map_err(|e| format!("cannot replace stdin: {e}"))?;
    drop(null);
    let mut socket = UnixStream::from(socket);
    let me = getpid();
    reply(&mut socket, 0, READY, me.as_raw_nonzero().get())?;
    let mut running: Vec<Running> = Vec::new();
    let mut spare = Spare::new();
    super::landlock_rules::preopen();
    let pid_ns = PidNamespaces::new(me);
    let mut bounding_set = BoundingSet::Full;
    let (request, stdio, netns, made_pid_ns) = loop {
        // A network namespace is made ahead when none is ready and no request waits.
        if spare.free.is_empty() && spare.home.is_some() && !waiting(&socket) {
            spare.fill()?;
        }
        let (readable, ended) = {
            let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(&socket, PollFlags::IN))
                .chain(running.iter().map(|r| PollFd::new(&r.pidfd, PollFlags::IN)))
                .collect();
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(format!("poll: {e}")),
            }
            let ended: Vec<usize> = (1..fds.len())
                .filter(|&i| !fds[i].revents().is_empty())
                .map(|i| i - 1)
                .collect();
            (!fds[0].revents().is_empty(), ended)
        };
        // Largest index first, so that `swap_remove` moves only entries already looked at.
        for i in ended.into_iter().rev() {
            let call = running.swap_remove(i);
            let status = loop {
                match rustix::process::waitpid(Some(call.pid), WaitOptions::NOHANG) {
                    Ok(Some((_, status))) => break Some(status.as_raw()),
                    Ok(None) => break None,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(_) => break None,
                }
            };
            match status {
                Some(status) => {
                    spare.give_back(call.netns);
                    reply(&mut socket, call.id, EXITED, status)?;
                }
                // Not ended after all (a spurious wake-up): keep watching it.
                None => running.push(call),
            }
        }
        if !readable {
            continue;
        }
        let Some((request, stdio)) = read_request(&socket)? else {
            // The engine closed its end: it is gone or done with us.
            return Ok(Served::Done);
        };
        if stdio.len() != STDIO_FDS {
            return Err(format!(
                "a request came with {} descriptors, not {STDIO_FDS}",
                stdio.len()
            ));
        }
        let confined = request.policy.confines();
        if confined && bounding_set == BoundingSet::Full {
            // Once for all calls rather than in each (about 40 system calls, 50 µs): the
            // spawner keeps its own capabilities, its calls inherit the empty set.
            bounding_set = match super::caps::empty_bounding_set() {
                Ok(()) => BoundingSet::Empty,
                Err(_) => BoundingSet::Touched,
            };
        }
        if !confined && bounding_set != BoundingSet::Full {
            // An unconfined call keeps what its user may do, so not from this spawner: the
            // engine starts it itself. (An engine's calls are all of one mode: not expected.)
            drop(stdio);
            reply(
                &mut socket,
                request.id,
                FAILED,
                rustix::io::Errno::PERM.raw_os_error(),
            )?;
            continue;
        }
        // Closed by the child once it leads a session of its own (or by its end). Out of
        // descriptors is this call's failure, not the spawner's: its other calls go on.
        let (in_session, session_made) =
            match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
                Ok(pipe) => pipe,
                Err(e) => {
                    drop(stdio);
                    reply(&mut socket, request.id, FAILED, e.raw_os_error())?;
                    continue;
                }
            };
        let netns = spare.take_for(&request.policy);
        let made_pid_ns = pid_ns.enter_new(&request.policy);
        let forked = super::fork::fork();
        if made_pid_ns && !matches!(forked, Ok(super::fork::Forked::Child)) {
            pid_ns.leave()?;
        }
        match forked {
            Ok(super::fork::Forked::Child) => {
                // First of all, before the engine can hear of this process: a session of its
                // own, without the controlling terminal the engine may have.
                own_session();
                drop(session_made);
                break (request, stdio, netns, made_pid_ns);
            }
            Ok(super::fork::Forked::Parent(pid)) => {
                // Kept for the next calls only when the call's end is all of its processes'.
                let netns = netns.filter(|_| made_pid_ns);
                // The engine kills the call's process group, which is its session's: the pid
                // is answered only once that exists.
                drop(session_made);
                wait_for_eof(&in_session);
                drop(stdio);
                match pidfd_open(pid, PidfdFlags::empty()) {
                    Ok(pidfd) => {
                        reply(&mut socket, request.id, STARTED, pid.as_raw_nonzero().get())?;
                        running.push(Running {
                            id: request.id,
                            pid,
                            pidfd,
                            netns,
                        });
                    }
                    Err(e) => {
                        // Without a pidfd its end would go unseen: end it now.
                        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
                        let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
                        spare.give_back(netns);
                        reply(&mut socket, request.id, FAILED, e.raw_os_error())?;
                    }
                }
            }
            Err(_) => {
                drop(stdio);
                spare.give_back(netns);
                reply(&mut socket, request.id, FAILED, -1)?;
            }
        }
    };
    // The child: one call's trampoline, with nothing of the spawner's but its code.
    drop(socket);
    drop(running);
    drop(spare);
    let spawner_pidfd = pid_ns.into_pidfd();
    rustix::stdio::dup2_stdin(&stdio[0])
        .and_then(|()| rustix::stdio::dup2_stdout(&stdio[1]))
        .and_then(|()| rustix::stdio::dup2_stderr(&stdio[2]))
        .map_err(|e| format!("cannot take the call's stdio: {e}"))?;
    drop(stdio);
    rustix::process::chdir(request.cwd.as_os_str())
        .map_err(|e| format!("cannot enter {:?}: {e}", request.cwd))?;
    Ok(Served::Call(
        request.policy,
        request.program,
        Forked {
            env: request.env,
            spawner: me.as_raw_nonzero().get(),
            netns,
            pid_ns: made_pid_ns,
            spawner_pidfd,
            bounding_set_empty: bounding_set == BoundingSet::Empty,
        },
    ))
}

/// Makes this process — a call just forked — the leader of a new session, and so of a new
/// process group, with no controlling terminal: nothing the call runs can open `/dev/tty`
/// (`ENXIO`) and write to the terminal the engine runs in, or be stopped or interrupted by it.
/// A fresh child never leads a group, so `setsid` succeeds; should it fail all the same, the
/// call still leads a process group of its own.
pub(super) fn own_session() {
    if rustix::process::setsid().is_err() {
        let _ = rustix::process::setpgid(None, None);
    }
}

/// Blocks until every write end of the pipe `fd` reads from is closed.
fn wait_for_eof(fd: &OwnedFd) {
    let mut buf = [0u8; 1];
    loop {
        match rustix::io::read(fd, &mut buf) {
            Ok(0) => return,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

/// How [`serve`] returned.
#[allow(
    clippy::large_enum_variant,
    reason = "returned once per process, by the spawner and by each call it forks"
)]
pub(super) enum Served {
    /// The engine closed its end: the spawner is done.
    Done,
    /// In a child it forked, with the call's stdio and directory in place: the trampoline is to
    /// run this program under this policy, in this context.
    Call(CallPolicy, Vec<OsString>, Forked),
}

/// What a call forked by the spawner has that a trampoline the engine started has not.
pub(super) struct Forked {
    /// The command's whole environment (the spawner keeps none of the engine's).
    pub env: Vec<(OsString, OsString)>,
    /// The spawner's pid: the call's parent.
    pub spawner: i32,
    /// A network namespace made ahead or given back by an ended call, when the call asks for
    /// one ([`Spare`]).
    pub netns: Option<OwnedFd>,
    /// This process is pid 1 of a PID namespace the spawner made for it (root engines): it is
    /// the call's init itself, with no process between it and the spawner.
    pub pid_ns: bool,
    /// A pidfd of the spawner, readable once it has ended: how a call in a PID namespace of its
    /// own, where `getppid` says 0, tells that its parent is still there.
    pub spawner_pidfd: Option<OwnedFd>,
    /// The spawner emptied its capability bounding set before it forked this call, whose
    /// bounding set is then empty too.
    pub bounding_set_empty: bool,
}

/// The spawner's capability bounding set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BoundingSet {
    /// As it started.
    Full,
    /// Emptied before its first confined call.
    Empty,
    /// Emptying failed part of the way: each call empties its own, as without the spawner.
    Touched,
}

/// The network namespaces ready for the calls that ask for one: made while the spawner had
/// nothing else to do (making one costs about 0.45 ms of CPU here, and as much again for the
/// kernel to tear it down; joining one costs almost nothing), and those of calls that have
/// ended, given to later calls. Only where the spawner may make network namespaces itself
/// (root). A namespace serves one call at a time, and is given again only when every process
/// that was in it has ended (the call was the init of its own PID namespace, whose end ends all
/// of them): its sockets are closed with them, and nothing else of a call stays in it, since the
/// command has no capability to change it (`lo` stays down, without an address, as the kernel
/// makes it) — see `docs/decisions.md`.
struct Spare {
    /// The spawner's own network namespace, which it returns to after making one.
    home: Option<OwnedFd>,
    free: Vec<OwnedFd>,
}

/// The most namespaces kept for later calls: as many as calls ran at once, up to this.
const MAX_FREE_NETNS: usize = 32;

impl Spare {
    fn new() -> Spare {
        let home = rustix::process::geteuid()
            .is_root()
            .then(open_netns)
            .and_then(Result::ok);
        Spare {
            home,
            free: Vec::new(),
        }
    }

    /// Makes one if none is ready. `Err` only when the spawner could not return to its own
    /// namespace (it must not fork calls from another one).
    #[allow(deprecated)]
    fn fill(&mut self) -> Result<(), String> {
        use rustix::thread::{LinkNameSpaceType, UnshareFlags, move_into_link_name_space};
        let Some(home) = &self.home else {
            return Ok(());
        };
        if !self.free.is_empty() {
            return Ok(());
        }
        // As in `exec::own_namespaces`: sound in a single-threaded process, without `FILES`.
        if rustix::thread::unshare(UnshareFlags::NEWNET).is_err() {
            // Not allowed after all: stop trying.
            self.home = None;
            return Ok(());
        }
        let made = open_netns();
        move_into_link_name_space(home.as_fd(), Some(LinkNameSpaceType::Network))
            .map_err(|e| format!("cannot return to the spawner's network namespace: {e}"))?;
        self.free.extend(made.ok());
        Ok(())
    }

    /// One that is ready, for a call that asks for a network namespace of its own (and no user
    /// namespace, inside which a namespace of the spawner's could not be joined).
    fn take_for(&mut self, policy: &CallPolicy) -> Option<OwnedFd> {
        if policy.asks_for("--net") && !policy.asks_for("--user") {
            self.free.pop()
        } else {
            None
        }
    }

    /// A namespace whose call has ended, for the next calls.
    fn give_back(&mut self, netns: Option<OwnedFd>) {
        if let Some(netns) = netns
            && self.free.len() < MAX_FREE_NETNS
        {
            self.free.push(netns);
        }
    }
}

/// PID namespaces made by the spawner itself for the calls of a root engine: `unshare(2)` of
/// `CLONE_NEWPID` just before the fork makes the forked call pid 1 of a fresh namespace — its
/// init, with no process in between (one fork and one exit fewer per call than an outer stage
/// that makes the namespace and forks the init); the spawner then returns to its own.
struct PidNamespaces {
    /// The spawner's own PID namespace; `None` where it may not make others (not root).
    home: Option<OwnedFd>,
    /// A pidfd of the spawner, for the calls.
    me: Option<OwnedFd>,
}

impl PidNamespaces {
    fn new(me: Pid) -> PidNamespaces {
        let me = pidfd_open(me, PidfdFlags::empty()).ok();
        let home = if rustix::process::geteuid().is_root() && me.is_some() {
            open_namespace("/proc/self/ns/pid").ok()
        } else {
            None
        };
        PidNamespaces { home, me }
    }

    /// Makes the next child pid 1 of a fresh PID namespace when the call asks for one (and no
    /// user namespace, which must come first). True when it did.
    #[allow(deprecated)]
    fn enter_new(&self, policy: &CallPolicy) -> bool {
        use rustix::thread::UnshareFlags;
        // As in `exec::own_namespaces`: sound in a single-threaded process, without `FILES`.
        self.home.is_some()
            && policy.asks_for("--pid")
            && !policy.asks_for("--user")
            && rustix::thread::unshare(UnshareFlags::NEWPID).is_ok()
    }

    /// Back to the spawner's own PID namespace for the children that follow. `Err` if it
    /// cannot (its next call would be forked into a namespace that is not its own).
    fn leave(&self) -> Result<(), String> {
        use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
        let home = self.home.as_ref().expect("entered only with a home");
        move_into_link_name_space(home.as_fd(), Some(LinkNameSpaceType::ProcessID))
            .map_err(|e| format!("cannot return to the spawner's PID namespace: {e}"))
    }

    fn into_pidfd(self) -> Option<OwnedFd> {
        self.me
    }
}

fn open_netns() -> rustix::io::Result<OwnedFd> {
    open_namespace("/proc/thread-self/ns/net")
}

fn open_namespace(path: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
}

/// True when a request is waiting to be read.
fn waiting(socket: &UnixStream) -> bool {
    readable_now(socket)
}

/// True when `fd` is readable now (a pidfd: its process has ended), without waiting.
pub(super) fn readable_now(fd: impl AsFd) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0)
}

fn reply(socket: &mut UnixStream, id: u64, kind: u8, value: i32) -> Result<(), String> {
    socket
        .write_all(&encode_reply(id, kind, value))
        .map_err(|e| format!("cannot answer the engine: {e}"))
}

/// The next request and its descriptors, or `None` at the end of the stream.
fn read_request(socket: &UnixStream) -> Result<Option<(Request, Vec<OwnedFd>)>, String> {
    let mut len = [0u8; 4];
    let mut got = 0;
    let mut fds: Vec<OwnedFd> = Vec::new();
    while got < len.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(STDIO_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = match recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut len[got..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(received) => received,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(format!("cannot read a request: {e}")),
        };
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        if received.bytes == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err("the engine's socket closed inside a request".into())
            };
        }
        got += received.bytes;
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_REQUEST {
        return Err(format!("a request of {len} bytes"));
    }
    let mut body = vec![0u8; len];
    let mut reader = socket;
    reader
        .read_exact(&mut body)
        .map_err(|e| format!("cannot read a request: {e}"))?;
    Request::decode(&body).map(|r| Some((r, fds)))
}

/// Sends `bytes` with `fds` attached to its first byte; `Ok(n)` is how many bytes went.
pub(super) fn send_with_fds(
    socket: impl AsFd,
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> rustix::io::Result<usize> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(STDIO_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(rustix::io::Errno::INVAL);
    }
    sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: super::super::SandboxMode) -> CallPolicy {
        CallPolicy {
            mode: Some(mode),
            status: Some("/s".into()),
            unshare: Some("/usr/bin/unshare".into()),
            ns_flags: vec!["--pid".into(), "--fork".into(), "--net".into()],
            ..CallPolicy::default()
        }
    }

    #[test]
    fn a_request_reads_back_as_it_was_written_and_a_torn_one_is_refused() {
        let request = Request {
            id: 7,
            policy: policy(super::super::SandboxMode::Off),
            program: vec!["bash".into(), OsString::from_vec(vec![0xff, b'x'])],
            env: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("EMPTY".into(), "".into()),
            ],
            cwd: "/work space".into(),
        };
        let bytes = request.encode();
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 4);
        assert_eq!(Request::decode(&bytes[4..]).unwrap(), request);
        assert!(Request::decode(&bytes[4..bytes.len() - 1]).is_err());
        let mut longer = bytes[4..].to_vec();
        longer.push(0);
        assert!(Request::decode(&longer).is_err());
        assert_eq!(
            decode_reply(&encode_reply(u64::MAX, EXITED, -9)),
            (u64::MAX, EXITED, -9)
        );
    }

    #[test]
    fn only_the_policy_asks_for_namespaces_never_the_commands_words() {
        let request = Request {
            id: 1,
            policy: policy(super::super::SandboxMode::ReadOnly),
            program: [
                "bash",
                "--unshare",
                "/bin/x",
                "--ns-flag",
                "--user",
                "--mode",
                "off",
            ]
            .into_iter()
            .map(OsString::from)
            .collect(),
            env: Vec::new(),
            cwd: "/".into(),
        };
        let got = Request::decode(&request.encode()[4..]).unwrap();
        assert!(got.policy.asks_for("--pid") && got.policy.asks_for("--net"));
        assert!(
            !got.policy.asks_for("--user"),
            "a word of the command is no option"
        );
        assert!(
            got.policy.confines(),
            "the command's `--mode off` is a word"
        );
        let off = Request {
            policy: policy(super::super::SandboxMode::Off),
            ..request
        };
        assert!(
            !Request::decode(&off.encode()[4..])
                .unwrap()
                .policy
                .confines()
        );
    }

    #[test]
    fn a_request_whose_policy_does_not_read_is_refused() {
        let mut request = Request {
            id: 1,
            policy: CallPolicy::default(),
            program: vec!["true".into()],
            env: Vec::new(),
            cwd: "/".into(),
        }
        .encode();
        // The policy's list: one option the trampoline does not know.
        let at = 4 + 8;
        let bogus = b"--bogus";
        let mut body = request.split_off(at);
        body.splice(0..4, 1u32.to_le_bytes());
        let mut option = (bogus.len() as u32).to_le_bytes().to_vec();
        option.extend_from_slice(bogus);
        body.splice(4..4, option);
        request.extend_from_slice(&body);
        let err = Request::decode(&request[4..]).unwrap_err();
        assert!(err.contains("--bogus"), "{err}");
    }

    #[test]
    fn descriptors_sent_with_a_request_arrive_with_it() {
        let (engine, spawner) = UnixStream::pair().unwrap();
        let (read, write) = rustix::pipe::pipe().unwrap();
        let request = Request {
            id: 1,
            policy: CallPolicy::default(),
            program: vec!["x".into()],
            env: Vec::new(),
            cwd: "/".into(),
        };
        let bytes = request.encode();
        let sent = send_with_fds(
            &engine,
            &bytes,
            &[write.as_fd(), write.as_fd(), read.as_fd()],
        )
        .unwrap();
        (&engine).write_all(&bytes[sent..]).unwrap();
        let (got, fds) = read_request(&spawner).unwrap().unwrap();
        assert_eq!(got, request);
        assert_eq!(fds.len(), 3);
        // The received stdout is the pipe's write end.
        rustix::io::write(&fds[1], b"hi").unwrap();
        let mut buf = [0u8; 2];
        rustix::io::read(&read, &mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        drop(engine);
        assert!(read_request(&spawner).unwrap().is_none());
    }
}
