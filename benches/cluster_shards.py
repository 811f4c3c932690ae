#!/usr/bin/env python3
"""Journal write throughput of cluster mode with 1 and N journal shards.

For each shard count: a fresh 3-server NATS cluster (JetStream, `sync_interval: always`) and one
`switchboard serve --cluster ... --cluster-journal-shards K --with-load-tools` node, all on
127.0.0.1 with free ports; then `switchboard load --target URL --sessions 64 --calls-per-turn 8
--duration 10s --json` against it (every call's answer is one journal record; the load's no-op
calls do no other work). Prints one line per shard count: calls/s, turn p50/p99. Indicative on
one machine: the three NATS servers, the node and the load generator share its cores.

Usage: cluster_shards.py SWITCHBOARD NATS_SERVER [SHARDS ...]   (default shards: 1 3)
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, bound, what):
    deadline = time.time() + bound
    while time.time() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} not ready within {bound} s")


def end(procs, tmp=None):
    """Kills and reaps the processes a run started (by their own handles), then removes its
    temporary directory, if given."""
    for p in procs:
        p.kill()
        p.wait()
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def nats_cluster(nats_bin, tmp, procs):
    """Starts 3 clustered NATS servers (JetStream, `sync_interval: always`) on free loopback
    ports, their files in `tmp`, each process added to `procs`; returns their client URLs once
    every one is healthy."""
    ports = [(free_port(), free_port(), free_port()) for _ in range(3)]
    for i, (client, route, monitor) in enumerate(ports):
        conf = os.path.join(tmp, f"n{i}.conf")
        routes = "".join(f"    nats-route://127.0.0.1:{p[1]}\n" for p in ports)
        with open(conf, "w") as f:
            f.write(f"server_name: n{i}\nlisten: 127.0.0.1:{client}\nhttp: 127.0.0.1:{monitor}\n"
                    f"jetstream {{\n  store_dir: {json.dumps(os.path.join(tmp, f'js{i}'))}\n"
                    f"  sync_interval: always\n}}\n"
                    f"cluster {{\n  name: sb\n  listen: 127.0.0.1:{route}\n  routes: [\n{routes}  ]\n}}\n")
        log = open(os.path.join(tmp, f"n{i}.log"), "w")
        procs.append(subprocess.Popen([nats_bin, "-c", conf], stdout=log, stderr=log))
    for _, _, monitor in ports:
        wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{monitor}/healthz", timeout=1).status == 200, 30, "nats")
    return [f"nats://127.0.0.1:{c}" for c, _, _ in ports]


def run(switchboard, nats_bin, shards, tmp):
    procs = []
    try:
        urls = ",".join(nats_cluster(nats_bin, tmp, procs))
        token = os.path.join(tmp, "token")
        with open(token, "w") as f:
            f.write("bench-token\n")
        root = os.path.join(tmp, "ws")
        os.makedirs(root, exist_ok=True)
        node = subprocess.Popen(
            [switchboard, "serve", "--listen", "127.0.0.1:0", "--cluster", urls, "--node-id", "a",
             "--cluster-journal-shards", str(shards), "--with-load-tools", "--workspace-root", root,
             "--token-file", token],
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
        out = subprocess.run(
            [switchboard, "load", "--target", base, "--token-file", token, "--sessions", "64",
             "--calls-per-turn", "8", "--duration", "10s", "--json"],
            capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise SystemExit(f"load failed: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        end(procs)


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    switchboard, nats_bin = sys.argv[1], sys.argv[2]
    counts = [int(a) for a in sys.argv[3:]] or [1, 3]
    for shards in counts:
        tmp = tempfile.mkdtemp(prefix="sb-shards-")
        try:
            doc = run(switchboard, nats_bin, shards, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        engine = doc["engine"]
        latency = engine.get("turn_latency_us") or {}
        print(json.dumps({
            "shards": shards,
            "calls": engine["calls"],
            "calls_per_s": round(engine["calls_per_s"]),
            "errors": engine["errors"],
            "turn_p50_ms": round(latency.get("p50", 0) / 1000, 2),
            "turn_p99_ms": round(latency.get("p99", 0) / 1000, 2),
            "violations": doc["violations"],
        }))


if __name__ == "__main__":
    main()
