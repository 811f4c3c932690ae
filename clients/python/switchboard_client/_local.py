"""``local()``: the ``switchboard`` binary started as a private sidecar, with a client connected.

For notebooks, tests and single-machine harnesses. The binary is the one the ``switchboard-sidecar``
wheel put beside this Python (the virtualenv's scripts directory), else ``$SWITCHBOARD_BIN``, else
``switchboard`` on ``PATH``. The server listens on a free loopback port with a fresh random token
and a temporary workspace root; closing the client stops it (``SIGTERM``, then ``SIGKILL`` after a
grace), so does the interpreter's exit, and on Linux so does this process dying any other way (the
server is started with ``PR_SET_PDEATHSIG``). Nothing here needs the binary until ``local()`` is
called: the pure ``switchboard-client`` install imports it as well.
"""

import asyncio
import atexit
import collections
import concurrent.futures
import os
import queue
import re
import secrets
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
    "cluster_replicas": ("--cluster-replicas", "value"),
    "cluster_creds": ("--cluster-creds", "value"),
    "cluster_tls_ca": ("--cluster-tls-ca", "value"),
    "cluster_tls_cert": ("--cluster-tls-cert", "value"),
    "cluster_tls_key": ("--cluster-tls-key", "value"),
}
# The flags local() sets itself (or refuses), for the check against `--help`.
MANAGED_FLAGS = ("--listen", "--workspace-root", "--token-file")

_LISTENING = re.compile(r"listening on (http://\S+)")
_STDERR_LINES = 200


class LocalServerError(SwitchboardError):
    """The local server could not be found or started. ``code`` is ``binary_not_found``,
    ``server_exited`` (it ended before it listened; ``stderr`` is what it printed) or
    ``start_timeout``."""

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


def _popen(argv: List[str], env: Dict[str, str]) -> "subprocess.Popen[str]":
    def job() -> "subprocess.Popen[str]":
        preexec = _make_preexec(os.getpid()) if _make_preexec else None  # type: ignore[misc]
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env, text=True, errors="replace", start_new_session=True, preexec_fn=preexec)

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


class LocalServer:
    """A ``switchboard serve`` process ``local()`` started. ``base_url``, ``token``, ``pid``,
    ``binary``, ``argv`` and ``workspace_root`` describe it; ``stderr()`` is the tail of its
    log; ``stop()`` ends it (idempotent; the client's ``close()`` calls it)."""

    def __init__(self, *, binary: Optional[str] = None, workspace_root: Optional[str] = None,
                 listen: str = "127.0.0.1:0", token: Optional[str] = None,
                 startup_timeout: float = 30.0, stop_timeout: float = 15.0,
                 env: Optional[Dict[str, str]] = None, **serve_options: Any):
        extra = serve_args(**serve_options)  # refuses an unknown option before anything starts
        self.binary = os.path.abspath(binary) if binary else find_binary()
        self.token = token or secrets.token_urlsafe(32)
        self.stop_timeout = stop_timeout
        self._tmp: Optional[str] = None
        if workspace_root is None:
            self._tmp = tempfile.mkdtemp(prefix="switchboard-local-")
            workspace_root = os.path.join(self._tmp, "workspaces")
        self.workspace_root = os.path.abspath(os.fspath(workspace_root))
        self.argv = [self.binary, "serve", "--listen", listen,
                     "--workspace-root", self.workspace_root, *extra]
        child_env = dict(os.environ if env is None else env)
        child_env["SWITCHBOARD_TOKEN"] = self.token
        self.base_url = ""
        self.returncode: Optional[int] = None
        self._lines: Deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._ready = threading.Event()
        self._stop_lock = threading.Lock()
        try:
            self._proc = _popen(self.argv, child_env)
        except OSError as e:
            self._remove_tmp()
            raise LocalServerError("server_exited", f"could not start {self.binary}: {e}") from e
        self.pid = self._proc.pid
        with _live_lock:
            _live.add(self)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True,
                                        name=f"switchboard-local-{self.pid}-stderr")
        self._reader.start()
        try:
            self._wait_ready(startup_timeout)
        except BaseException:
            self.stop()
            raise

    def _read_stderr(self) -> None:
        stream = self._proc.stderr
        assert stream is not None
        for line in stream:
            self._lines.append(line.rstrip("\n"))
            if not self._ready.is_set():
                m = _LISTENING.search(line)
                if m:
                    self.base_url = m.group(1)
                    self._ready.set()
        self._ready.set()  # EOF: the process ended (or closed stderr)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self._proc.poll() is not None:
                self._reader.join(1.0)  # what it printed before it ended
                break
            if time.monotonic() > deadline:
                raise LocalServerError(
                    "start_timeout",
                    f"{self.binary} serve did not report listening within {timeout:g} s"
                    + self._stderr_suffix(), self.stderr())
        if not self.base_url:
            code = self._proc.wait(5) if self._proc.poll() is None else self._proc.returncode
            raise LocalServerError(
                "server_exited",
                f"{' '.join(self.argv)} exited with status {code} before it listened"
                + self._stderr_suffix(), self.stderr())

    def _stderr_suffix(self) -> str:
        text = self.stderr().strip()
        return f"; its stderr:\n{text}" if text else "; it printed nothing on stderr"

    def stderr(self) -> str:
        """The last lines the server printed on stderr (its log)."""
        return "\n".join(self._lines)

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def stop(self, timeout: Optional[float] = None) -> int:
        """Stops the server: ``SIGTERM`` (it lets turns in flight finish within its ``--grace``,
        then cancels them; their commands die with it), ``SIGKILL`` if it has not exited after
        ``timeout`` seconds (default ``stop_timeout``), then ``SIGKILL`` to whatever is left in
        its process group; removes the temporary workspace root. Returns its exit status."""
        with self._stop_lock:
            if self.returncode is not None:
                return self.returncode
            timeout = self.stop_timeout if timeout is None else timeout
            proc = self._proc
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
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

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            _rmtree(self._tmp)
            self._tmp = None

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"exited {self.returncode}"
        return f"<LocalServer pid={getattr(self, 'pid', None)} {self.base_url} {state}>"


class LocalClient(Client):
    """A :class:`Client` connected to a server ``local()`` started (``server``); ``close()``
    (and leaving ``with``) stops that server too."""

    def __init__(self, server: LocalServer, **client_options: Any):
        self.server = server
        super().__init__(server.base_url, token=server.token, **client_options)

    def close(self) -> None:
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
    ``max_connections``. A server that cannot start raises :class:`LocalServerError` with its
    stderr."""
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
