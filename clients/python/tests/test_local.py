"""``local()``: the bundled ``switchboard`` binary started as a private sidecar. Which binary it
finds, how keywords become ``serve`` flags (checked against the binary's ``--help``), a bash call
through it, two at once, a server that fails to start, and that the server (and the commands it
runs) ends when the client closes, when the interpreter exits, and when the Python process is
killed. The tests that start a server skip where no binary is found (``.ci/run`` has one: the
wheel's, on the virtualenv's PATH)."""

import asyncio
import json
import os
import pathlib
import random
import re
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
import urllib.request

import pytest

import switchboard_client
from switchboard_client import LocalServerError, local, local_async
from switchboard_client import _local

REPO = pathlib.Path(__file__).resolve().parents[3]


def bundled() -> str:
    try:
        return _local.find_binary()
    except LocalServerError as e:
        pytest.skip(f"no switchboard binary: {e}")


def bash(id, command):
    return {"role": "assistant", "content": [
        {"type": "tool_use", "id": id, "name": "bash", "input": {"command": command}}]}


def gone(pid: int, within: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                return True
        except FileNotFoundError:
            return True
        except OSError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def pids_running(needle: bytes):
    """Pids of live processes whose command line contains ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if needle in cmdline and not gone(int(entry), 0):
            found.append(int(entry))
    return found


def wait_for(predicate, within: float = 10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def healthz(base_url: str) -> dict:
    with urllib.request.urlopen(base_url + "/healthz", timeout=5) as r:
        return json.loads(r.read())


# --- finding the binary, keywords to flags (no server) -----------------------------------------

def fake_binary(directory: pathlib.Path) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "switchboard"
    path.write_text("#!/bin/sh\nexit 3\n")
    path.chmod(0o755)
    return path


def test_the_scripts_directory_wins_over_the_env_variable_and_path(tmp_path, monkeypatch):
    scripts = fake_binary(tmp_path / "scripts")
    env = fake_binary(tmp_path / "env")
    on_path = fake_binary(tmp_path / "path")
    real = sysconfig.get_path
    monkeypatch.setattr(sysconfig, "get_path",
                        lambda name, *a: str(tmp_path / "scripts") if name == "scripts" and not a
                        else real(name, *a))
    monkeypatch.setenv("SWITCHBOARD_BIN", str(env))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert _local.find_binary() == str(scripts)
    scripts.unlink()
    assert _local.find_binary() == str(env)
    monkeypatch.delenv("SWITCHBOARD_BIN")
    assert _local.find_binary() == str(on_path)


def test_no_binary_is_an_error_naming_every_place_searched(tmp_path, monkeypatch):
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a: str(tmp_path / "none"))
    monkeypatch.delenv("SWITCHBOARD_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LocalServerError) as e:
        local()
    assert e.value.code == "binary_not_found"
    message = str(e.value)
    assert "scripts directory" in message and str(tmp_path / "none") in message
    assert "$SWITCHBOARD_BIN (unset)" in message and f"PATH ({tmp_path / 'empty'})" in message


def test_in_the_wheels_virtualenv_the_bundled_binary_is_the_one_found():
    scripts = os.path.join(sysconfig.get_path("scripts"), "switchboard")
    if not os.access(scripts, os.X_OK):
        pytest.skip("switchboard_client is not installed from the switchboard-sidecar wheel here")
    assert _local.find_binary() == os.path.abspath(scripts)


def test_keywords_become_serve_flags():
    assert _local.serve_args(sandbox="read-only") == ["--sandbox", "read-only"]
    assert _local.serve_args(allow_network=True, audit_args=False, policy=None) == [
        "--allow-network"]
    assert _local.serve_args(sandbox_read=["/opt/a", pathlib.Path("/opt/b")]) == [
        "--sandbox-read", "/opt/a", "--sandbox-read", "/opt/b"]
    assert _local.serve_args(sandbox_read="/opt/a") == ["--sandbox-read", "/opt/a"]
    assert _local.serve_args(session_policy={"ro": "ro.json", "x": "x.json"}) == [
        "--session-policy", "ro=ro.json", "--session-policy", "x=x.json"]
    assert _local.serve_args(grace=2, approval_timeout=0.25, session_idle_timeout="5m") == [
        "--grace", "2000ms", "--approval-timeout", "250ms", "--session-idle-timeout", "5m"]
    assert _local.serve_args(max_sessions=5, max_memory="512M") == [
        "--max-sessions", "5", "--max-memory", "512M"]
    with pytest.raises(TypeError, match="switch"):
        _local.serve_args(allow_network="yes")
    with pytest.raises(TypeError, match="one value"):
        _local.serve_args(sandbox=["read-only"])


def test_an_unknown_option_is_refused_before_anything_starts(monkeypatch):
    started = []
    monkeypatch.setattr(_local, "_popen", lambda *a: started.append(a))
    with pytest.raises(TypeError, match="unknown serve option.*sandbox_mode") as e:
        local(sandbox_mode="read-only")
    assert "sandbox," in str(e.value)  # the known ones are listed
    with pytest.raises(TypeError, match="pass token="):
        local(token_file="/tmp/t")
    with pytest.raises(TypeError, match="unknown serve option"):
        local(listen_addr="127.0.0.1:0")
    assert started == []


def test_the_option_table_matches_serve_help():
    out = subprocess.run([bundled(), "serve", "--help"], capture_output=True, text=True,
                         check=True).stdout
    flags = {}
    for m in re.finditer(r"^\s+(?:-\w, )?(--[a-z0-9-]+)( <[^>]+>)?", out, re.M):
        flags[m.group(1)] = bool(m.group(2))
    flags.pop("--help")
    table = {flag: kind for flag, kind in _local.SERVE_OPTIONS.values()}
    assert set(flags) == set(table) | set(_local.MANAGED_FLAGS), \
        "switchboard serve's flags changed: update SERVE_OPTIONS in _local.py"
    for flag, kind in table.items():
        assert flags[flag] == (kind != "flag"), (flag, kind)


def test_the_wheel_and_the_pure_client_declare_the_same_dependencies():
    tomllib = pytest.importorskip("tomllib")
    root = REPO / "pyproject.toml"
    if not root.exists():
        pytest.skip("not in the repository")
    wheel = tomllib.loads(root.read_text())["project"]
    pure = tomllib.loads((REPO / "clients/python/pyproject.toml").read_text())["project"]
    assert wheel["dependencies"] == pure["dependencies"]
    assert wheel["optional-dependencies"] == pure["optional-dependencies"]
    assert wheel["requires-python"] == pure["requires-python"]


# --- with the real binary --------------------------------------------------------------------

def test_local_dispatches_a_bash_call_and_close_stops_the_server():
    binary = bundled()
    with local(sandbox="read-only") as client:
        server = client.server
        assert server.binary == binary
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", client.base_url)
        assert healthz(client.base_url)["sandbox"]["mode"] == "read-only"
        root = pathlib.Path(server.workspace_root)
        assert root.is_dir()
        with client.session("w") as session:
            answer = session.dispatch(bash("a", "echo hello from $0; touch f"))
        content = answer["content"][0]["content"]
        assert content.startswith("hello from bash"), content
        assert "Permission denied" in content  # the read-only sandbox
        assert server.running
    assert server.returncode == 0, server.stderr()
    assert gone(server.pid, 0)
    assert not root.exists() and not root.parent.exists(), "the temporary root is removed"
    client.close()  # idempotent


def test_a_token_is_required_and_each_local_server_has_its_own(tmp_path):
    bundled()
    with local() as a, local(workspace_root=tmp_path / "mine") as b:
        assert a.base_url != b.base_url
        assert a.server.token != b.server.token and len(a.server.token) >= 32
        assert a.server.workspace_root != b.server.workspace_root
        with a.session() as s:
            s.tools()
        with switchboard_client.Client(a.base_url, token=b.server.token) as wrong:
            with pytest.raises(switchboard_client.SwitchboardError) as e:
                wrong.session().create()
            assert e.value.code == "unauthorized"
        with b.session("kept") as s:
            s.dispatch(bash("a", "echo x > x.txt"))
    assert gone(a.server.pid, 0) and gone(b.server.pid, 0)
    assert (tmp_path / "mine" / "kept" / "x.txt").read_text() == "x\n", \
        "a workspace_root the caller gave is kept"


def test_a_server_that_fails_to_start_is_reported_with_its_stderr(tmp_path):
    bundled()
    missing = tmp_path / "no-such-policy.json"
    with pytest.raises(LocalServerError) as e:
        local(policy=missing, startup_timeout=30)
    assert e.value.code == "server_exited"
    assert "exited with status" in str(e.value)
    assert str(missing) in e.value.stderr, e.value.stderr
    assert str(missing) in str(e.value)
    assert not _local._live, "nothing is left running"


def test_closing_ends_the_commands_in_flight():
    bundled()
    marker = f"{random.randint(100000, 999999)}.5"
    client = local(grace=0.5)
    turn = client.session().start(bash("a", f"sleep {marker}"))
    sleepers = wait_for(lambda: pids_running(b"sleep\0" + marker.encode()))
    assert sleepers, "the command started"
    client.close()
    assert gone(client.server.pid, 0)
    assert all(gone(pid) for pid in sleepers), "the command died with the server"
    answer = turn.result(timeout=10)  # the server answered the call before it ended
    assert answer["content"][0]["content"].startswith("Error [cancelled]"), answer


CHILD = textwrap.dedent("""
    import sys, time
    import switchboard_client
    client = switchboard_client.local(binary=sys.argv[1], grace=0.5)
    if sys.argv[2] != "-":
        session = client.session()
        session.start({"role": "assistant", "content": [{"type": "tool_use", "id": "a",
                       "name": "bash", "input": {"command": "sleep " + sys.argv[2]}}]})
    print(client.server.pid, client.server.workspace_root, flush=True)
    if sys.argv[3] == "wait":
        time.sleep(600)
""")


def child(binary: str, marker: str, mode: str) -> subprocess.Popen:
    package = os.path.dirname(os.path.dirname(switchboard_client.__file__))
    env = dict(os.environ, PYTHONPATH=package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", CHILD, binary, marker, mode],
                            stdout=subprocess.PIPE, text=True, env=env)


def test_the_interpreters_exit_stops_a_server_nobody_closed():
    proc = child(bundled(), "-", "exit")
    pid, root = proc.stdout.readline().split()
    assert proc.wait(30) == 0
    assert gone(int(pid), 0), "atexit stopped it before the interpreter ended"
    assert not os.path.exists(root)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_python_does_not_leave_the_server_or_its_commands_behind():
    marker = f"{random.randint(100000, 999999)}.25"
    proc = child(bundled(), marker, "wait")
    try:
        pid, root = proc.stdout.readline().split()
        pid = int(pid)
        sleepers = wait_for(lambda: pids_running(b"sleep\0" + marker.encode()))
        assert sleepers and not gone(pid, 0)
    finally:
        proc.kill()
        proc.wait()
    assert gone(pid, 15), "the server got SIGTERM when its parent died"
    assert all(gone(p) for p in sleepers)
    _local._rmtree(os.path.dirname(root))  # nobody was left to remove the temporary root


def test_local_async():
    bundled()

    async def main():
        async with await local_async(sandbox="read-only") as client:
            async with client.session() as session:
                answer = await session.dispatch(bash("a", "echo async"))
            assert answer["content"][0]["content"] == "async"
            return client.server

    server = asyncio.run(main())
    assert server.returncode == 0 and gone(server.pid, 0)


# --- the ready channel -----------------------------------------------------------------------

def test_a_fake_listening_line_on_stderr_does_not_fool_local(tmp_path):
    """The server reports its URL on a pipe only it writes (--ready-fd), not on stderr, where
    an MCP server's warning or a tool's name may print anything first."""
    real = bundled()
    liar = tmp_path / "switchboard"
    liar.write_text("#!/bin/sh\n"
                    "echo 'switchboard: serve: listening on http://127.0.0.1:1' >&2\n"
                    "sleep 0.3\n"
                    f"exec '{real}' \"$@\"\n")
    liar.chmod(0o755)
    with local(binary=str(liar)) as client:
        assert not client.base_url.endswith(":1"), client.base_url
        assert client.health()["status"] == "ok"
        assert "listening on http://127.0.0.1:1" in client.server.stderr()
        assert "--ready-fd" in client.server.argv and "--stop-on-stdin-close" in client.server.argv


def test_the_ready_file_serves_where_descriptors_cannot_be_passed(monkeypatch):
    bundled()
    monkeypatch.setattr(_local, "_READY_BY_FD", False)
    with local() as client:
        assert "--ready-file" in client.server.argv and "--ready-fd" not in client.server.argv
        assert client.health()["status"] == "ok"


def test_a_binary_without_the_ready_flags_is_named_older_than_the_client(tmp_path):
    old = tmp_path / "switchboard"
    old.write_text("#!/bin/sh\necho \"error: unexpected argument '--ready-fd' found\" >&2\n"
                   "exit 2\n")
    old.chmod(0o755)
    with pytest.raises(LocalServerError) as e:
        local(binary=str(old))
    assert e.value.code == "server_exited" and "older than this client" in str(e.value)


# --- whose server it is, and stopping it promptly ----------------------------------------------

def test_local_clients_are_clients():
    bundled()
    with local() as client:
        assert isinstance(client, switchboard_client.Client)
        assert "--grace" in client.server.argv, "a short grace unless grace= says otherwise"
        assert client.server.argv[client.server.argv.index("--grace") + 1] == "1000ms"

    async def main():
        async with await local_async() as client:
            assert isinstance(client, switchboard_client.AsyncClient)

    asyncio.run(main())


def test_close_cancels_the_turns_in_flight_and_returns_at_once():
    """Even with the server's grace at 10 s: close() cancels its own turns first (a command,
    and a client tool that hangs), and returns without waiting for the grace."""
    bundled()
    release = threading.Event()
    client = local(grace=10)
    commands, tools = client.session(), client.session()

    @tools.tool
    def hang() -> str:
        """Hangs until released."""
        release.wait(30)
        return "late"

    command = commands.start(bash("a", "sleep 30"))
    hung = tools.start({"role": "assistant", "content": [
        {"type": "tool_use", "id": "h", "name": "hang", "input": {}}]})
    assert wait_for(lambda: commands.info()["in_flight"] and tools.info()["in_flight"])
    began = time.monotonic()
    client.close()
    took = time.monotonic() - began
    release.set()
    assert took < 3, f"close() took {took:.1f} s"
    assert client.server.returncode == 0
    for turn in (command, hung):
        content = turn.result(timeout=10)["content"][0]["content"]
        assert content.startswith("Error [cancelled]"), content


FORKED = textwrap.dedent("""
    import json, os, sys
    import switchboard_client
    client = switchboard_client.local(binary=sys.argv[1])
    child = os.fork()
    if child == 0:
        client.close()   # the child's copy of the client: its connections only
        sys.exit(0)      # a normal exit: atexit runs in the child too
    _, status = os.waitpid(child, 0)
    print(json.dumps({"child": status, "running": client.server.running,
                      "health": client.health()["status"]}), flush=True)
    client.close()
    print(client.server.returncode, flush=True)
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_that_exits_leaves_the_parents_server_running():
    package = os.path.dirname(os.path.dirname(switchboard_client.__file__))
    env = dict(os.environ, PYTHONPATH=package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", FORKED, bundled()], capture_output=True,
                          text=True, env=env, timeout=60)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stderr
    assert json.loads(lines[0]) == {"child": 0, "running": True, "health": "ok"}
    assert lines[1] == "0", "the parent stopped it"


STDIN_ONLY = textwrap.dedent("""
    import os, sys, time
    import switchboard_client
    from switchboard_client import _local
    _local._make_preexec = None   # no PR_SET_PDEATHSIG: only the stdin pipe ties the server to us
    client = switchboard_client.local(binary=sys.argv[1], grace=0.5)
    child = os.fork()
    if child == 0:                # a forked child lives on, with its copy of the stdin pipe
        time.sleep(600)
        os._exit(0)
    print(client.server.pid, child, client.server.workspace_root, flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_server_stops_when_its_parent_is_killed_even_while_a_forked_child_lives():
    package = os.path.dirname(os.path.dirname(switchboard_client.__file__))
    env = dict(os.environ, PYTHONPATH=package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", STDIN_ONLY, bundled()],
                            stdout=subprocess.PIPE, text=True, env=env)
    grandchild = None
    try:
        pid, grandchild, root = proc.stdout.readline().split()
        pid, grandchild = int(pid), int(grandchild)
        assert not gone(pid, 0)
        proc.kill()  # kill -9: no atexit, no close()
        proc.wait()
        assert gone(pid, 15), "its stdin reached end of file: it stopped"
        assert not gone(grandchild, 0), "the forked child still lives"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if grandchild:
            os.kill(grandchild, 9)
    _local._rmtree(os.path.dirname(root))
