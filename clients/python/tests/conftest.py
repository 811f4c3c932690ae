"""Starts the real ``switchboard serve`` binary on a free loopback port for the tests.

The binary is ``$SWITCHBOARD_BIN`` (``.ci/run`` sets it to the release build), else
``target/release/switchboard`` of this repository.
"""

import os
import pathlib
import signal
import subprocess
import tempfile
import threading

import pytest

TOKEN = "python-client-test-token"
REPO = pathlib.Path(__file__).resolve().parents[3]


def binary() -> str:
    path = os.environ.get("SWITCHBOARD_BIN") or str(REPO / "target" / "release" / "switchboard")
    if not os.path.exists(path):
        pytest.exit(f"no switchboard binary at {path}: build it (cargo build --release) "
                    "or set SWITCHBOARD_BIN", returncode=2)
    return path


class Server:
    def __init__(self, extra=()):
        self.root = tempfile.TemporaryDirectory(prefix="switchboard-py-")
        env = dict(os.environ, SWITCHBOARD_TOKEN=TOKEN)
        env.pop("HTTP_PROXY", None)
        env.pop("http_proxy", None)
        self.proc = subprocess.Popen(
            [binary(), "serve", "--listen", "127.0.0.1:0", "--workspace-root",
             os.path.join(self.root.name, "ws"), *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env, text=True)
        self.base_url = None
        for _ in range(50):
            line = self.proc.stderr.readline()
            if not line:
                break
            if "listening on " in line:
                self.base_url = line.split("listening on ", 1)[1].strip()
                break
        if self.base_url is None:
            self.proc.kill()
            raise RuntimeError("switchboard serve did not start")
        # Keep draining stderr so the server never blocks on it.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.root.cleanup()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, "the server exits 0 on SIGTERM"


@pytest.fixture()
def token():
    return TOKEN
