#!/usr/bin/env python3
"""What the call journal costs in memory and disk over many calls: `switchboard dispatch --lines
--journal DIR` answers CALLS read_file calls of a 2 KB file (eight per turn, one session), and the
script prints the process's resident memory (VmRSS, and its peak VmHWM) and the journal file's
size every REPORT calls, then once more after a restart of `dispatch` on the same journal (the
integrity check at open reads the whole file).

With `--steady SECONDS` (and `--retention 1m`), it measures a steady load instead: one
`dispatch` process after another on the same journal, each a new session (`--session-id`) that
reads for 20 s at 500 calls/s, and the file's size after each — sessions older than the retention are forgotten
by the compaction that runs every quarter of it, and their pages reused, so the size levels off.

Usage: journal_memory.py PATH/TO/switchboard [CALLS] [--retention DURATION] [--steady SECONDS]

Bounded: CALLS calls (default 100,000), or SECONDS of steady load; nothing but local processes and
a temporary directory.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

BINARY = sys.argv[1]
CALLS = int(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else 100_000
RETENTION = sys.argv[sys.argv.index("--retention") + 1] if "--retention" in sys.argv else None
STEADY = float(sys.argv[sys.argv.index("--steady") + 1]) if "--steady" in sys.argv else None
PERIOD = 20.0
RATE = 500  # calls per second in the steady mode
PER_TURN = 8
REPORT = 10_000


def status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields


def start(ws, journal, session="dispatch"):
    args = [BINARY, "dispatch", "--lines", "--workspace", ws, "--journal", journal,
            "--log-format", "text", "--session-id", session]
    if RETENTION:
        args += ["--journal-retention", RETENTION]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=1)


def turn(proc, first):
    blocks = [{"type": "tool_use", "id": f"r{first + k}", "name": "read_file",
               "input": {"path": "two-kb.txt"}} for k in range(PER_TURN)]
    proc.stdin.write(json.dumps({"role": "assistant", "content": blocks}) + "\n")
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert len(answer["content"]) == PER_TURN, answer
    assert not answer["content"][0].get("is_error"), answer["content"][0]


def steady(ws, journal, file):
    started = time.monotonic()
    print(f"{'session':>8} {'calls':>9} {'file MiB':>9} {'s':>6}")
    done, k = 0, 0
    while time.monotonic() - started < STEADY:
        k += 1
        proc = start(ws, journal, f"steady-{k}")
        begun = time.monotonic()
        until = begun + PERIOD
        sent = 0
        while time.monotonic() < until:
            turn(proc, done)
            done += PER_TURN
            sent += PER_TURN
            ahead = begun + sent / RATE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        proc.stdin.close()
        proc.wait(timeout=60)
        print(f"{k:>8} {done:>9} {os.path.getsize(file) / (1 << 20):>9.1f} "
              f"{time.monotonic() - started:>6.0f}", flush=True)


def main():
    tmp = tempfile.mkdtemp(prefix="switchboard-journal-memory-")
    ws, journal = os.path.join(tmp, "ws"), os.path.join(tmp, "journal")
    os.makedirs(ws)
    with open(os.path.join(ws, "two-kb.txt"), "w") as f:
        f.write(("0123456789abcdef" * 128)[:2047] + "\n")
    file = os.path.join(journal, "journal.redb")
    if STEADY:
        steady(ws, journal, file)
        subprocess.run(["rm", "-rf", tmp], check=True)
        return
    proc = start(ws, journal)
    started = time.monotonic()
    print(f"{'calls':>8} {'RSS MiB':>8} {'peak MiB':>9} {'file MiB':>9} {'s':>6}")
    done = 0
    while done < CALLS:
        turn(proc, done)
        done += PER_TURN
        if done % REPORT < PER_TURN:
            s = status(proc.pid)
            size = os.path.getsize(file) / (1 << 20)
            print(f"{done:>8} {s['VmRSS']:>8.1f} {s['VmHWM']:>9.1f} {size:>9.1f} "
                  f"{time.monotonic() - started:>6.1f}", flush=True)
    proc.stdin.close()
    proc.wait(timeout=60)
    # A restart on the same journal: the integrity check at open reads the whole file.
    proc = start(ws, journal)
    turn(proc, done)
    s = status(proc.pid)
    print(f"after a restart: RSS {s['VmRSS']:.1f} MiB, peak {s['VmHWM']:.1f} MiB, file "
          f"{os.path.getsize(file) / (1 << 20):.1f} MiB")
    proc.stdin.close()
    proc.wait(timeout=60)
    subprocess.run(["rm", "-rf", tmp], check=True)


if __name__ == "__main__":
    main()
