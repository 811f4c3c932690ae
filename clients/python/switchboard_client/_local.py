"""``local()``: the ``switchboard`` binary started as a private sidecar, with a client connected.

For notebooks, tests and single-machine harnesses. The binary is the one the ``switchboard-sidecar``
wheel put beside this Python (the virtualenv's scripts directory), else ``$SWITCHBOARD_BIN``, else
``switchboard`` on ``PATH``. The server listens on a free loopback port with a fresh random token
and a temporary workspace root, and says where on a channel of its own (``--ready-fd``: a pipe
only it writes; never its stderr, where an MCP server's warning may print anything). Closing the
client cancels its turns in flight and stops the server (``SIGTERM``, then ``SIGKILL`` after a
grace), so does the interpreter's exit, and so does this process dying any other way: the server
stops when its stdin, a pipe this process holds, reaches end of file (``--stop-on-stdin-close``),
and on Linux it also gets ``PR_SET_PDEATHSIG``. Only the process that started a server stops it:
a forked child that exits leaves it alone. Nothing here needs the binary until ``local()`` is
called: the pure ``switchboard-client`` install imports it as well.
"""

import asyncio
import atexit
import collections
import concurrent.futures
import json
import os
import queue
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ._async import AsyncClient
from ._common import SwitchboardError
from ._sync import Client

__all__ = ["AsyncLocalClient", "LocalClient", "LocalServer", "LocalServerError", "find_binary",
           "local", "local_async", "serve_args"]

BINARY_ENV = "SWITCHBOARD_BIN"

# `switchboard serve`'s options a keyword may set: keyword -> (flag, kind). Kinds: "value" (one
# value: `--flag VALUE`), "duration" (a value; a number is seconds), "flag" (True: the bare flag,
# False: left out), "repeat" (a list or tuple: the flag once per item; a dict for
# `session_policy`: NAME=FILE per item). `--workspace-root` and `--listen` are local()'s own
# keywords; `--token-file` is refused (local() chooses the token, or takes `token=`).
# clients/python/tests/test_local.py checks this table against `switchboard serve --help`.
SERVE_OPTIONS: Dict[str, Tuple[str, str]] = {
    "log_format": ("--log-format", "value"),
    "no_auth": ("--no-auth", "flag"),
    "max_sessions": ("--max-sessions", "value"),
    "session_idle_timeout": ("--session-idle-timeout", "duration"),
    "max_body": ("--max-body", "value"),
    "grace": ("--grace", "duration"),
    "max_requests": ("--max-requests", "value"),
    "max_session_turns": ("--max-session-turns", "value"),
    "read_timeout": ("--read-timeout", "duration"),
    "with_load_tools": ("--with-load-tools", "flag"),
    "allow_hard_links": ("--allow-hard-links", "flag"),
    "max_client_tools": ("--max-client-tools", "value"),
    "max_client_schema_bytes": ("--max-client-schema-bytes", "value"),
    "policy": ("--policy", "value"),
    "audit_log": ("--audit-log", "value"),
    "audit_args": ("--audit-args", "flag"),
    "approval_timeout": ("--approval-timeout", "duration"),
    "session_policy": ("--session-policy", "repeat"),
    "sandbox": ("--sandbox", "value"),
    "allow_network": ("--allow-network", "flag"),
    "max_processes": ("--max-processes", "value"),
    "max_memory": ("--max-memory", "value"),
    "max_file_size": ("--max-file-size", "value"),
    "max_tmp_size": ("--max-tmp-size", "value"),
    "sandbox_read": ("--sandbox-read", "repeat"),
    "sandbox_read_path": ("--sandbox-read-path", "flag"),
    "mcp_config": ("--mcp-config", "value"),
    "defer_auto_above": ("--defer-auto-above", "value"),
    "context_budget": ("--context-budget", "value"),
    "journal": ("--journal", "value"),
    "journal_retention": ("--journal-retention", "value"),
    "metrics_addr": ("--metrics-addr", "value"),
    "metrics_file": ("--metrics-file", "value"),
    "cluster": ("--cluster", "value"),
    "node_id": ("--node-id", "value"),
    "lease_ttl": ("--lease-ttl", "duration"),
    "cluster_retention": ("--cluster-retention", "duration"),
    "cluster_journal_shards": ("--cluster-journal-shards", "value"),
    "cluster_journal_memory": ("--cluster-journal-memory", "value"),
    "cluster_replicas": ("--cluster-replicas", "value"),
    "cluster_creds": ("--cluster-creds", "value"),
    "cluster_tls_ca": ("--cluster-tls-ca", "value"),
    "cluster_tls_cert": ("--cluster-tls-cert", "value"),
    "cluster_tls_key": ("--cluster-tls-key", "value"),
}
# The flags local() sets itself (or refuses), for the check against `--help`: `--ready-fd`
# (`--ready-file` where descriptors cannot be passed) and `--stop-on-stdin-close` are how it
# learns the URL and ties the server's life to its own.
MANAGED_FLAGS = ("--listen", "--workspace-root", "--token-file", "--ready-fd", "--ready-file",
                 "--stop-on-stdin-close")
#: The ``--grace`` (seconds) ``local()`` gives the server unless ``grace=`` says otherwise:
#: ``close()`` cancels its own turns first, so the grace only spares turns it does not know
#: (another client of the same server, an exit without ``close()``).
LOCAL_GRACE = 1.0

_STDERR_LINES = 200
# Whether the server reports ready on an inherited pipe (else: in a file, polled).
_READY_BY_FD = os.name == "posix"


class LocalServerError(SwitchboardError):
    """The local server could not be found or started. ``code`` is ``binary_not_found``,
    ``server_exited`` (it ended before it was ready; ``stderr`` is what it printed),
    ``start_timeout`` or ``bad_ready_line`` (what it reported on its ready channel is not
    ``{"url": ..., "pid": ...}``)."""

    def __init__(self, code: str, message: str, stderr: str = ""):
        super().__init__(code, message)
        self.stderr = stderr


def _binary_name() -> str:
    return "switchboard.exe" if os.name == "nt" else "switchboard"


def _candidates() -> List[Tuple[str, Optional[str]]]:
    """Where ``find_binary`` looks, in order: (description, path or None)."""
    name = _binary_name()
    found: List[Tuple[str, Optional[str]]] = []
    scripts = sysconfig.get_path("scripts")
    found.append((f"this Python's scripts directory ({scripts})",
                  os.path.join(scripts, name) if scripts else None))
    try:
        user = sysconfig.get_path("scripts", f"{os.name}_user")
    except KeyError:
        user = None
    if user and user != scripts:
        found.append((f"the user scripts directory ({user})", os.path.join(user, name)))
    env = os.environ.get(BINARY_ENV)
    found.append((f"${BINARY_ENV} ({env or 'unset'})", env or None))
    found.append((f"PATH ({os.environ.get('PATH', '')})", shutil.which(name)))
    return found


def _executable(path: Optional[str]) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)  # type: ignore[arg-type]


def find_binary() -> str:
    """The ``switchboard`` binary ``local()`` starts: the one installed beside this Python (the
    ``switchboard-sidecar`` wheel puts it there), else ``$SWITCHBOARD_BIN``, else ``PATH``.
    Raises :class:`LocalServerError` (``binary_not_found``) naming every place searched."""
    searched = []
    for where, path in _candidates():
        if _executable(path):
            return os.path.abspath(path)  # type: ignore[arg-type]
        searched.append(f"{where}: no executable {path}" if path else where)
    raise LocalServerError(
        "binary_not_found",
        "no switchboard binary found; searched " + "; ".join(searched)
        + ". Install the switchboard-sidecar wheel, or set $SWITCHBOARD_BIN to the binary")


def _duration(key: str, value: Any) -> str:
    if isinstance(value, bool):
        raise TypeError(f"local(): {key}= takes a duration such as '30s' or a number of seconds, "
                        f"not {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"local(): {key}= must not be negative")
        return f"{round(value * 1000)}ms"
    return str(value)


def serve_args(**options: Any) -> List[str]:
    """The ``switchboard serve`` flags for ``options`` (what ``local()`` passes): ``sandbox=
    "read-only"`` is ``--sandbox read-only``, ``allow_network=True`` the bare flag (False or None:
    left out), a list such as ``sandbox_read=[...]`` one flag per item, ``session_policy=`` a dict
    NAME -> FILE or a list of ``NAME=FILE``, and a duration a string (``"30s"``) or seconds. An
    option ``serve`` does not have is a :class:`TypeError`."""
    args: List[str] = []
    unknown = sorted(k for k in options if k not in SERVE_OPTIONS)
    if unknown:
        managed = {"listen", "workspace_root", "token", "binary", "env", "startup_timeout",
                   "stop_timeout", *_CLIENT_OPTIONS}
        hint = ""
        if "token_file" in unknown:
            hint = " (local() chooses the token; pass token= to choose it yourself)"
        raise TypeError(
            f"local(): unknown serve option(s) {', '.join(unknown)}{hint}; known: "
            + ", ".join(sorted(set(SERVE_OPTIONS) | managed)))
    for key, value in options.items():
        flag, kind = SERVE_OPTIONS[key]
        if value is None:
            continue
        if kind == "flag":
            if not isinstance(value, bool):
                raise TypeError(f"local(): {key}= is a switch (True or False), not {value!r}")
            if value:
                args.append(flag)
        elif kind == "repeat":
            if isinstance(value, dict):
                items = [f"{name}={path}" for name, path in value.items()]
            elif isinstance(value, (list, tuple)):
                items = [os.fspath(v) if isinstance(v, os.PathLike) else str(v) for v in value]
            else:
                items = [os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
            for item in items:
                args += [flag, item]
        else:
            if isinstance(value, (list, tuple, dict)) or isinstance(value, bool):
                raise TypeError(f"local(): {key}= takes one value, not {value!r}")
            text = _duration(key, value) if kind == "duration" else (
                os.fspath(value) if isinstance(value, os.PathLike) else str(value))
            args += [flag, text]
    return args


# --- starting the process ---------------------------------------------------------------------
#
# On Linux the child asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), so a
# Python process that is killed (SIGKILL, a crash, os._exit) does not leave the server behind.
# The kernel sends that signal when the *thread* that forked the child ends, not the process, so
# every server is forked from one daemon thread that lives as long as the process.

def _pdeathsig() -> Optional[Callable[[], None]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    PR_SET_PDEATHSIG = 1
    sigterm = int(signal.SIGTERM)
    sigkill = int(signal.SIGKILL)
    getppid, kill, getpid = os.getppid, os.kill, os.getpid

    def make(parent: int) -> Callable[[], None]:
        def preexec() -> None:  # runs in the child between fork and exec: no imports, no locks
            prctl(PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
            if getppid() != parent:  # the parent died before the prctl took effect
                kill(getpid(), sigkill)
        return preexec

    return make  # type: ignore[return-value]


_make_preexec = _pdeathsig()
_spawn_queue: "queue.Queue[Tuple[Callable[[], Any], concurrent.futures.Future[Any]]]" = queue.Queue()
_spawn_lock = threading.Lock()
_spawner: Optional[threading.Thread] = None


def _spawn_loop() -> None:
    while True:
        job, future = _spawn_queue.get()
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(job())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)


def _popen(argv: List[str], env: Dict[str, str],
           pass_fds: Tuple[int, ...] = ()) -> "subprocess.Popen[str]":
    def job() -> "subprocess.Popen[str]":
        preexec = _make_preexec(os.getpid()) if _make_preexec else None  # type: ignore[misc]
        # stdin: a pipe never written, whose end of file (this process gone, however it went)
        # stops the server (--stop-on-stdin-close).
        return subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env, text=True, errors="replace", start_new_session=True, preexec_fn=preexec,
            pass_fds=pass_fds)

    global _spawner
    with _spawn_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawn_loop, name="switchboard-local-spawner",
                                        daemon=True)
            _spawner.start()
    future: "concurrent.futures.Future[subprocess.Popen[str]]" = concurrent.futures.Future()
    _spawn_queue.put((job, future))
    return future.result()


def _rmtree(path: str) -> None:
    def retry(func: Callable[..., Any], p: str, _exc: Any) -> None:
        try:
            os.chmod(p, stat.S_IRWXU)
            if os.path.isdir(p):
                os.chmod(os.path.dirname(p), stat.S_IRWXU)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=retry)


# --- the ready channel ---------------------------------------------------------------------

class _ReadyPipe:
    """``--ready-fd``: a pipe whose write end only the server gets. It writes one line,
    ``{"pid", "url"}``, once it listens (and keeps the descriptor, unused, until it exits); a
    server that fails first exits, and the reader sees end of file without a line."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()   # neither inheritable but through pass_fds
        self._buf = b""
        self._eof = False

    def args(self) -> List[str]:
        return ["--ready-fd", str(self._write)]

    def pass_fds(self) -> Tuple[int, ...]:
        return (self._write,)

    def started(self) -> None:
        """After the spawn: only the server holds the write end now."""
        os.close(self._write)
        self._write = -1

    def line(self, wait: float) -> Optional[bytes]:
        """The ready line once it has come (at most ``wait`` seconds from now), else None."""
        if not self._eof and b"\n" not in self._buf:
            if _readable(self._read, wait):
                chunk = os.read(self._read, 4096)
                self._buf += chunk
                self._eof = not chunk
        if b"\n" in self._buf:
            return self._buf.split(b"\n", 1)[0]
        return None

    @property
    def closed(self) -> bool:
        """Whether the server closed its end without a line: it failed before it was ready."""
        return self._eof and b"\n" not in self._buf

    def close(self) -> None:
        for fd in (self._read, self._write):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._read = self._write = -1


def _readable(fd: int, wait: float) -> bool:
    """Whether ``fd`` has bytes (or end of file) within ``wait`` seconds; ``poll`` where there
    is one (``select`` refuses descriptors past 1023, which a busy process may hand out)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(wait * 1000))
    return bool(select.select([fd], [], [], wait)[0])


class _ReadyFile:
    """``--ready-file``, where descriptors cannot be passed: the same line, in a file the
    server writes beside its place and renames into it (never seen half written), polled."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="switchboard-ready-")
        self._path = os.path.join(self._dir, "ready.json")
        self.closed = False

    def args(self) -> List[str]:
        return ["--ready-file", self._path]

    def pass_fds(self) -> Tuple[int, ...]:
        return ()

    def started(self) -> None:
        pass

    def line(self, wait: float) -> Optional[bytes]:
        try:
            with open(self._path, "rb") as f:
                return f.read().split(b"\n", 1)[0]
        except FileNotFoundError:
            time.sleep(wait)
            return None

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def _ready_url(line: bytes) -> str:
    """The URL of a ready line, ``{"url": "http://...", "pid": N}``."""
    try:
        ready = json.loads(line)
        url = ready["url"]
    except (ValueError, KeyError, TypeError):
        url = None
    if not isinstance(url, str) or not url.startswith("http://"):
        raise LocalServerError(
            "bad_ready_line", f'the server\'s ready line is not {{"url", "pid"}}: {line[:200]!r}')
    return url.rstrip("/")


# --- the servers of this process -------------------------------------------------------------

_live: "set[LocalServer]" = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - at exit, stop the others regardless
            pass


def _forget_in_child() -> None:
    """In a child forked from this process the servers are the parent's: forget them (the
    child's exit stops none), and point the child's copy of each server's stdin pipe at
    ``/dev/null``, so that the pipe still reaches end of file when the parent goes (even while
    the child lives). The locks a thread of the parent may have held are made anew."""
    global _live, _live_lock, _spawn_queue, _spawn_lock, _spawner
    servers = list(_live)
    _live, _live_lock = set(), threading.Lock()
    _spawn_queue, _spawn_lock, _spawner = queue.Queue(), threading.Lock(), None
    for server in servers:
        server._disown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class LocalServer:
    """A ``switchboard serve`` process ``local()`` started. ``base_url``, ``token``, ``pid``,
    ``binary``, ``argv`` and ``workspace_root`` describe it; ``stderr()`` is the tail of its
    log; ``stop()`` ends it (idempotent; the client's ``close()`` calls it). Only the process
    that started it stops it (``owned``): in a forked child ``stop()`` does nothing."""

    def __init__(self, *, binary: Optional[str] = None, workspace_root: Optional[str] = None,
                 listen: str = "127.0.0.1:0", token: Optional[str] = None,
                 startup_timeout: float = 30.0, stop_timeout: float = 15.0,
                 env: Optional[Dict[str, str]] = None, **serve_options: Any):
        if "grace" not in serve_options:
            serve_options["grace"] = LOCAL_GRACE
        extra = serve_args(**serve_options)  # refuses an unknown option before anything starts
        self.binary = os.path.abspath(binary) if binary else find_binary()
        self.token = token or secrets.token_urlsafe(32)
        self.stop_timeout = stop_timeout
        self._tmp: Optional[str] = None
        if workspace_root is None:
            self._tmp = tempfile.mkdtemp(prefix="switchboard-local-")
            workspace_root = os.path.join(self._tmp, "workspaces")
        self.workspace_root = os.path.abspath(os.fspath(workspace_root))
        ready = _ReadyPipe() if _READY_BY_FD else _ReadyFile()
        self.argv = [self.binary, "serve", "--listen", listen,
                     "--workspace-root", self.workspace_root, *ready.args(),
                     "--stop-on-stdin-close", *extra]
        child_env = dict(os.environ if env is None else env)
        child_env["SWITCHBOARD_TOKEN"] = self.token
        self.base_url = ""
        self.returncode: Optional[int] = None
        self._owner = os.getpid()
        self._lines: Deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._stop_lock = threading.Lock()
        try:
            self._proc = _popen(self.argv, child_env, ready.pass_fds())
        except BaseException as e:
            ready.close()
            self._remove_tmp()
            if isinstance(e, OSError):
                raise LocalServerError("server_exited",
                                       f"could not start {self.binary}: {e}") from e
            raise
        ready.started()
        self.pid = self._proc.pid
        with _live_lock:
            _live.add(self)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True,
                                        name=f"switchboard-local-{self.pid}-stderr")
        self._reader.start()
        try:
            self.base_url = self._wait_ready(ready, startup_timeout)
        except BaseException:
            self.stop()
            raise
        finally:
            ready.close()

    def _read_stderr(self) -> None:
        """Keeps the tail of the server's log, for error messages (never to learn its URL)."""
        stream = self._proc.stderr
        assert stream is not None
        try:
            for line in stream:
                self._lines.append(line.rstrip("\n"))
        except (OSError, ValueError):  # closed by stop()
            pass

    def _wait_ready(self, ready: Any, timeout: float) -> str:
        """The URL the server reports on its ready channel, once it listens."""
        deadline = time.monotonic() + timeout
        while True:
            line = ready.line(0.05)
            if line is not None:
                return _ready_url(line)
            if ready.closed or self._proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                raise LocalServerError(
                    "start_timeout",
                    f"{self.binary} serve did not report ready within {timeout:g} s"
                    + self._stderr_suffix(), self.stderr())
        try:
            code: Any = self._proc.wait(5)
        except subprocess.TimeoutExpired:
            code = "none yet (it closed its ready channel without a line)"
        self._reader.join(1.0)  # what it printed before it ended
        raise LocalServerError(
            "server_exited",
            f"{' '.join(self.argv)} exited with status {code} before it was ready"
            + self._stderr_suffix(), self.stderr())

    def _stderr_suffix(self) -> str:
        text = self.stderr().strip()
        if "--ready-fd" in text and "unexpected argument" in text:
            return (f"; {self.binary} is older than this client (it has no --ready-fd): use the "
                    f"binary of the same release. Its stderr:\n{text}")
        return f"; its stderr:\n{text}" if text else "; it printed nothing on stderr"

    @property
    def owned(self) -> bool:
        """Whether this process started the server (not a child forked from it)."""
        return os.getpid() == self._owner

    def _disown(self) -> None:
        """In a forked child: this copy of the stdin pipe no longer keeps the server alive."""
        stdin = self._proc.stdin
        if stdin is None:
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, stdin.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError):
            pass

    def stderr(self) -> str:
        """The last lines the server printed on stderr (its log)."""
        return "\n".join(self._lines)

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def stop(self, timeout: Optional[float] = None) -> Optional[int]:
        """Stops the server: closes its stdin and sends ``SIGTERM`` (it lets turns in flight
        finish within its ``--grace``, then cancels them; their commands die with it),
        ``SIGKILL`` if it has not exited after ``timeout`` seconds (default ``stop_timeout``),
        then ``SIGKILL`` to whatever is left in its process group; removes the temporary
        workspace root. Returns its exit status. In a process forked from the one that started
        it, does nothing and returns None: the server is the parent's."""
        if not self.owned:
            return None
        with self._stop_lock:
            if self.returncode is not None:
                return self.returncode
            timeout = self.stop_timeout if timeout is None else timeout
            proc = self._proc
            if proc.poll() is None:
                try:
                    if hasattr(signal, "SIGKILL"):  # elsewhere send_signal(SIGTERM) kills
                        proc.send_signal(signal.SIGTERM)
                    self._close_stdin()
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self._close_stdin()
            if hasattr(os, "killpg"):
                try:  # stragglers in its process group (start_new_session made it the leader)
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self._reader.join(2.0)
            if proc.stderr is not None:
                proc.stderr.close()
            self.returncode = proc.returncode
            with _live_lock:
                _live.discard(self)
            self._remove_tmp()
            return self.returncode

    def _close_stdin(self) -> None:
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        except OSError:
            pass

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            _rmtree(self._tmp)
            self._tmp = None

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"exited {self.returncode}"
        return f"<LocalServer pid={getattr(self, 'pid', None)} {self.base_url} {state}>"


class LocalClient(Client):
    """A :class:`Client` connected to a server ``local()`` started (``server``); ``close()``
    (and leaving ``with``) cancels this client's turns in flight and stops that server too."""

    def __init__(self, server: LocalServer, **client_options: Any):
        self.server = server
        super().__init__(server.base_url, token=server.token, **client_options)

    def close(self) -> None:
        """Cancels the turns this client has in flight (their calls are answered
        ``cancelled``, their commands killed), closes the connections and stops the server.
        In a child forked from the process that called ``local()``, closes this copy of the
        connections only: the server, and its turns, are the parent's."""
        if not self.server.owned:
            super().close()
            return
        try:
            for session in self._turns_in_flight():
                try:
                    session.cancel()
                except SwitchboardError:
                    pass
        finally:
            try:
                super().close()
            finally:
                self.server.stop()

    def __enter__(self) -> "LocalClient":
        return self


class AsyncLocalClient(AsyncClient):
    """An :class:`AsyncClient` connected to a server ``local_async()`` started (``server``);
    ``await close()`` (and leaving ``async with``) stops that server too."""

    def __init__(self, server: LocalServer, **client_options: Any):
        self.server = server
        super().__init__(server.base_url, token=server.token, **client_options)

    async def close(self) -> None:
        """See :meth:`LocalClient.close`."""
        if not self.server.owned:
            await super().close()
            return
        try:
            for session in self._turns_in_flight():
                try:
                    await session.cancel()
                except SwitchboardError:
                    pass
        finally:
            try:
                await super().close()
            finally:
                await asyncio.get_running_loop().run_in_executor(None, self.server.stop)

    async def __aenter__(self) -> "AsyncLocalClient":
        return self


_CLIENT_OPTIONS = ("timeout", "max_retries", "retry_budget_s", "max_connections")


def _split(options: Dict[str, Any], allowed: Tuple[str, ...]) -> Dict[str, Any]:
    return {k: options.pop(k) for k in allowed if k in options}


def local(**options: Any) -> LocalClient:
    """Starts ``switchboard serve`` on a free loopback port with a fresh random token, waits
    until it listens, and returns a :class:`Client` connected to it; ``close()`` (or leaving
    ``with``) stops the server, and so does the interpreter's exit::

        with switchboard_client.local(sandbox="read-only") as client, client.session() as s:
            s.dispatch(message)

    Keywords: any ``serve`` option with ``_`` for ``-`` (``sandbox="read-only"``,
    ``allow_network=True``, ``sandbox_read=["/opt/tool"]``, ``policy="policy.json"``, ``grace=2``;
    see ``switchboard serve --help``); an unknown one is a :class:`TypeError`. Also
    ``workspace_root`` (default: a temporary directory, removed when the server stops),
    ``listen`` (default ``127.0.0.1:0``), ``token`` (default: random), ``binary`` (default:
    :func:`find_binary`), ``env`` (the server's environment; default this process's),
    ``startup_timeout`` (30 s), ``stop_timeout`` (seconds between SIGTERM and SIGKILL, 15), and
    the :class:`Client` keywords ``timeout``, ``max_retries``, ``retry_budget_s``,
    ``max_connections``. ``grace`` is 1 s unless given (:data:`LOCAL_GRACE`; ``None``: the
    server's own): ``close()`` cancels this client's turns in flight before it stops the server.
    A server that cannot start raises :class:`LocalServerError` with its stderr."""
    client_options = _split(options, _CLIENT_OPTIONS)
    server = LocalServer(**options)
    try:
        return LocalClient(server, **client_options)
    except BaseException:
        server.stop()
        raise


async def local_async(**options: Any) -> AsyncLocalClient:
    """``local()`` for asyncio: ``client = await local_async(...)``, an :class:`AsyncClient`
    whose ``await close()`` (or ``async with client:``) stops the server. The same keywords,
    without ``max_connections``."""
    client_options = _split(options, _CLIENT_OPTIONS[:3])
    if "max_connections" in options:
        raise TypeError("local_async(): max_connections is a Client option; AsyncClient has none")
    loop = asyncio.get_running_loop()
    server = await loop.run_in_executor(None, lambda: LocalServer(**options))
    try:
        return AsyncLocalClient(server, **client_options)
    except BaseException:
        await loop.run_in_executor(None, server.stop)
        raise
