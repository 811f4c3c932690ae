"""Shared by the benchmarks: a `switchboard serve` on a free loopback port, from
``$SWITCHBOARD_BIN`` (else ``target/release/switchboard`` of this repository)."""

from __future__ import annotations

import os
import pathlib
import platform
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from typing import List, Sequence

REPO = pathlib.Path(__file__).resolve().parents[3]
TOKEN = "switchboard-bench-token"


class Server:
    def __init__(self, extra: Sequence[str] = ()):
        path = os.environ.get("SWITCHBOARD_BIN") or str(REPO / "target" / "release" / "switchboard")
        if not os.path.exists(path):
            raise SystemExit(f"no switchboard binary at {path}: set SWITCHBOARD_BIN")
        self.root = tempfile.TemporaryDirectory(prefix="switchboard-bench-")
        env = dict(os.environ, SWITCHBOARD_TOKEN=TOKEN)
        for proxy in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(proxy, None)
        self.proc = subprocess.Popen(
            [path, "serve", "--listen", "127.0.0.1:0", "--workspace-root",
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
            raise SystemExit("switchboard serve did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        self.token = TOKEN

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.root.cleanup()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def machine() -> str:
    try:
        load = "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = ""
    return (f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {platform.python_implementation()} "
            f"{platform.python_version()}, {os.cpu_count()} CPUs, {load}")


def pct(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def median(values: List[float]) -> float:
    return statistics.median(values)


def noop_message(i: int = 0) -> dict:
    return {"role": "assistant", "content": [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file",
         "input": {"path": "tiny.txt"}}]}
