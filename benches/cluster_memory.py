#!/usr/bin/env python3
"""Memory of a cluster node holding many sessions with long histories.

One NATS server (JetStream, `sync_interval: always`, one replica) and one `switchboard serve
--cluster ... --with-load-tools` node, both on 127.0.0.1 with free ports; then `switchboard load
--target URL --sessions SESSIONS --turns TURNS --calls-per-turn 8 --tool noop` against it (every
call's answer is one journal record the node keeps for its session), and the node's resident
memory (VmRSS, and its peak VmHWM) and `switchboard_cluster_journal_memory_bytes` once the load is done.
Extra arguments after `--` go to `serve` (for example `--cluster-journal-memory 0`).

Usage: cluster_memory.py SWITCHBOARD NATS_SERVER [SESSIONS] [TURNS] [-- SERVE_ARGS...]
(default 1,000 sessions × 125 turns of 8 calls: 1,000 calls per session)

Bounded: SESSIONS × TURNS × 8 calls, at most 15 minutes; nothing but local processes and a
temporary directory.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from cluster_shards import end, free_port, wait_for  # the same directory


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def metric(base, name):
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def main():
    args = sys.argv[1:]
    serve_extra = []
    if "--" in args:
        serve_extra = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    if len(args) < 2:
        raise SystemExit(__doc__)
    switchboard, nats_bin = args[0], args[1]
    sessions = int(args[2]) if len(args) > 2 else 1000
    turns = int(args[3]) if len(args) > 3 else 125
    tmp = tempfile.mkdtemp(prefix="sb-cluster-memory-")
    procs = []
    try:
        client, monitor = free_port(), free_port()
        conf = os.path.join(tmp, "nats.conf")
        with open(conf, "w") as f:
            f.write(f"listen: 127.0.0.1:{client}\nhttp: 127.0.0.1:{monitor}\n"
                    f"jetstream {{\n  store_dir: {json.dumps(os.path.join(tmp, 'js'))}\n"
                    f"  sync_interval: always\n}}\n")
        log = open(os.path.join(tmp, "nats.log"), "w")
        procs.append(subprocess.Popen([nats_bin, "-c", conf], stdout=log, stderr=log))
        wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{monitor}/healthz", timeout=1).status == 200, 30, "nats")
        token = os.path.join(tmp, "token")
        with open(token, "w") as f:
            f.write("bench-token\n")
        root = os.path.join(tmp, "ws")
        os.makedirs(root, exist_ok=True)
        node = subprocess.Popen(
            [switchboard, "serve", "--listen", "127.0.0.1:0", "--cluster",
             f"nats://127.0.0.1:{client}", "--node-id", "a", "--cluster-replicas", "1",
             "--with-load-tools", "--workspace-root", root, "--token-file", token,
             "--max-sessions", str(sessions + 16)] + serve_extra,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(node)
        base = None
        deadline = time.time() + 60
        while base is None and time.time() < deadline:
            line = node.stderr.readline()
            if not line:
                break
            if "listening on http://" in line:
                base = "http://" + line.split("listening on http://", 1)[1].split()[0]
        if base is None:
            raise SystemExit("the node did not start")
        started = time.time()
        out = subprocess.run(
            [switchboard, "load", "--target", base, "--token-file", token, "--sessions",
             str(sessions), "--turns", str(turns), "--calls-per-turn", "8", "--tool", "noop",
             "--json"],
            capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise SystemExit(f"load failed: {out.stderr[-2000:]}")
        doc = json.loads(out.stdout.strip().splitlines()[-1])
        engine = doc["engine"]
        print(json.dumps({
            "sessions": sessions,
            "calls": engine["calls"],
            "errors": engine["errors"],
            "seconds": round(time.time() - started, 1),
            "node_rss_mib": round(status_kib(node.pid, "VmRSS") / 1024, 1),
            "node_peak_rss_mib": round(status_kib(node.pid, "VmHWM") / 1024, 1),
            "journal_memory_mib": round(metric(base, "switchboard_cluster_journal_memory_bytes") / 2**20, 1),
            "serve_args": serve_extra,
        }))
    finally:
        end(procs, tmp)


if __name__ == "__main__":
    main()
