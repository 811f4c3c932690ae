"""Shared by the benchmarks: a `switchboard serve` on a free loopback port, from
``$SWITCHBOARD_BIN`` (else ``target/release/switchboard`` of this repository)."""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

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


# --- the CPU-per-dispatch comparisons (client against raw HTTP) ------------------------------

def cpu_arguments(doc: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--turns", type=int, default=100, help="turns per session per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=300)
    return p.parse_args()


def tiny_file(workspace: str) -> None:
    """The file every no-op turn reads."""
    with open(os.path.join(workspace, "tiny.txt"), "w") as f:
        f.write("x")


def check_noop(answer: Any) -> None:
    assert answer["content"][0]["content"] == "x", answer


def raw_headers(token: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def raw_turn_id() -> str:
    return "py-" + os.urandom(8).hex()


class Rounds:
    """The rounds of a comparison: the two sides alternate which goes first; each measurement
    (this process's CPU per dispatch, dispatches per second) is printed as it ends, the
    medians at the end; no new round starts past ``--max-seconds``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.dispatches = args.sessions * args.turns
        self.results: Dict[str, List[Dict[str, Any]]] = {"client": [], "raw": []}
        self.deadline = time.monotonic() + args.max_seconds

    @staticmethod
    def sides(r: int, client: Callable[[], Any], raw: Callable[[], Any]
              ) -> List[Tuple[str, Callable[[], Any]]]:
        order = [("client", client), ("raw", raw)]
        if r % 2:
            order.reverse()
        return order

    @staticmethod
    def start() -> Tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def record(self, r: int, label: str, started: Tuple[float, float]) -> None:
        wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
        m = {"side": label, "cpu_us": cpu / self.dispatches * 1e6,
             "per_s": self.dispatches / wall}
        self.results[label].append(m)
        print(f"round {r + 1} {label:6s} {m['cpu_us']:7.1f} us CPU/dispatch  "
              f"{m['per_s']:8.0f} dispatches/s", flush=True)

    def over(self) -> bool:
        if time.monotonic() > self.deadline:
            print("(time bound reached)")
            return True
        return False

    def report(self, setup: str, client: str, raw: str) -> None:
        """``setup``: what a round is; ``client``, ``raw``: the two sides' names."""
        results = self.results
        c = median([m["cpu_us"] for m in results["client"]])
        rc = median([m["cpu_us"] for m in results["raw"]])
        cs = median([m["per_s"] for m in results["client"]])
        rs = median([m["per_s"] for m in results["raw"]])
        print(f"\n{machine()}")
        print(f"{setup}, {len(results['client'])} rounds, medians:")
        print(f"  {client + ':':12s} {c:7.1f} us CPU per dispatch, {cs:8.0f} dispatches/s")
        print(f"  {raw + ':':12s} {rc:7.1f} us CPU per dispatch, {rs:8.0f} dispatches/s")
        print(f"  ratio (client / raw CPU): {c / rc:.3f}")
