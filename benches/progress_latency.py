#!/usr/bin/env python3
"""How late a command's line reaches the client as live progress, through `switchboard serve`.

    python3 benches/progress_latency.py SWITCHBOARD_BINARY [LINES [INTERVAL_MS]]

Starts the binary as `serve` on a free loopback port, opens a session, and dispatches (streamed,
through the repository's Python client: `clients/python`, which needs `urllib3`) one `bash` call
that prints LINES lines (default 200), one every INTERVAL_MS (default 20), each with the moment
it was written
(`date +%s%N`). Each line's lag is the moment its `event: progress` was read here minus that
moment. Prints p50, p99 and max of the lags, and how many events carried the lines (the server
joins what a call writes within 50 ms into one batch). The server is stopped at the end.
"""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))

from switchboard_client import Client  # noqa: E402


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    lines = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    interval = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    root = tempfile.TemporaryDirectory(prefix="switchboard-progress-")
    env = dict(os.environ)
    env.pop("SWITCHBOARD_TOKEN", None)
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--no-auth", "--workspace-root", root.name],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=env)
    try:
        base = None
        for _ in range(50):
            line = proc.stderr.readline()
            if "listening on " in line:
                base = line.split("listening on ", 1)[1].strip()
                break
        if base is None:
            print("the server did not start", file=sys.stderr)
            return 1
        command = (f"for i in $(seq 1 {lines}); do echo \"$(date +%s%N)\"; "
                   f"sleep {interval / 1000}; done")
        lags = []
        events = 0

        def on_progress(event):
            nonlocal events
            now = time.time_ns()
            events += 1
            for written in event.get("text", "").split():
                lags.append((now - int(written)) / 1e6)

        with Client(base) as client, client.session() as session:
            session.dispatch({"role": "assistant", "content": [
                {"type": "tool_use", "id": "lag", "name": "bash", "input": {"command": command}}]},
                on_progress=on_progress)
        lags.sort()

        def at(q: float) -> float:
            return lags[min(len(lags) - 1, max(0, int(q * len(lags) + 0.999999) - 1))]

        print(f"{len(lags)} lines in {events} progress events; line written -> its event at "
              f"the client: p50 {at(0.5):.2f} ms, p99 {at(0.99):.2f} ms, max {lags[-1]:.2f} ms")
        return 0 if len(lags) == lines else 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        root.cleanup()


if __name__ == "__main__":
    sys.exit(main())
