#!/usr/bin/env python3
"""How long a freshly started `switchboard dispatch` leaves SIGINT and SIGTERM at their default
action: the window before `main` in which a signal ends the process with no output
(docs/cli.md, "Signals").

For each of N runs: start `BINARY dispatch` (stdin a pipe, nothing written), then read
/proc/PID/status in a tight loop until SigCgt lists both signals; the time from the moment the
spawn returned to that read is the run's window (an upper bound: it includes one read's latency).
Prints p50, p90, p99 and the maximum in milliseconds.

    python3 benches/early_signal_window.py target/release/switchboard 500
"""
import os
import subprocess
import sys
import time

SIGINT_BIT, SIGTERM_BIT = 1 << (2 - 1), 1 << (15 - 1)


def caught(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    mask = int(line.split()[1], 16)
                    return mask & SIGINT_BIT and mask & SIGTERM_BIT
    except OSError:
        pass
    return False


def main() -> None:
    binary, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
    windows = []
    for _ in range(runs):
        p = subprocess.Popen([binary, "dispatch"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.perf_counter()
        deadline = started + 5
        while not caught(p.pid) and time.perf_counter() < deadline:
            pass
        windows.append((time.perf_counter() - started) * 1000)
        p.stdin.close()
        p.wait(timeout=10)
    windows.sort()
    pick = lambda q: windows[min(len(windows) - 1, int(q * len(windows)))]
    print(f"{runs} runs of {os.path.basename(binary)} dispatch: window until SIGINT and SIGTERM are "
          f"caught, ms: p50 {pick(0.5):.2f}, p90 {pick(0.9):.2f}, p99 {pick(0.99):.2f}, max {windows[-1]:.2f}")


if __name__ == "__main__":
    main()
