"""CPU per dispatch of the sync client against raw urllib3 sending the same requests.

N sessions (default 50), one thread each, run no-op turns (one ``read_file`` of a tiny file)
back to back; each side runs ``--turns`` turns per session per round, alternating sides,
``--rounds`` rounds, in one run. Measured: this process's CPU time (``time.process_time``)
per dispatch and dispatches per second.

    SWITCHBOARD_BIN=target/release/switchboard python clients/python/bench/sync_cpu_per_dispatch.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import urllib3

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _harness import Server, machine, median, noop_message  # noqa: E402
from switchboard_client import Client  # noqa: E402


def in_threads(fns):
    errors = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def run_client(sessions, turns):
    msg = noop_message()

    def one(session):
        def go():
            for _ in range(turns):
                answer = session.dispatch(msg)
                assert answer["content"][0]["content"] == "x", answer
        return go

    in_threads([one(s) for s in sessions])


def run_raw(pool, paths, headers, turns):
    body = json.dumps(noop_message()).encode()

    def one(path):
        def go():
            for _ in range(turns):
                h = dict(headers)
                h["Switchboard-Turn-Id"] = "py-" + os.urandom(8).hex()
                r = pool.urlopen("POST", path, body=body, headers=h, retries=False)
                if r.status != 200:
                    raise RuntimeError(r.data)
                answer = json.loads(r.data)
                assert answer["content"][0]["content"] == "x", answer
        return go

    in_threads([one(p) for p in paths])


def measure(label, fn, dispatches):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"side": label, "cpu_us": cpu / dispatches * 1e6, "per_s": dispatches / wall}


def main(args):
    with Server() as server, Client(server.base_url, token=server.token,
                                    max_connections=args.sessions) as client:
        sessions = [client.session(f"bench{i}") for i in range(args.sessions)]
        for s in sessions:
            s.create()
            with open(os.path.join(s.workspace, "tiny.txt"), "w") as f:
                f.write("x")
        paths = [f"/v1/sessions/{s.id}/dispatch?format=anthropic" for s in sessions]
        headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
        pool = urllib3.connection_from_url(server.base_url, maxsize=args.sessions, block=False)
        run_client(sessions, 5)
        run_raw(pool, paths, headers, 5)
        dispatches = args.sessions * args.turns
        results = {"client": [], "raw": []}
        deadline = time.monotonic() + args.max_seconds
        for r in range(args.rounds):
            order = [("client", lambda: run_client(sessions, args.turns)),
                     ("raw", lambda: run_raw(pool, paths, headers, args.turns))]
            if r % 2:
                order.reverse()
            for label, fn in order:
                m = measure(label, fn, dispatches)
                results[label].append(m)
                print(f"round {r + 1} {label:6s} {m['cpu_us']:7.1f} us CPU/dispatch  "
                      f"{m['per_s']:8.0f} dispatches/s", flush=True)
            if time.monotonic() > deadline:
                print("(time bound reached)")
                break
        pool.close()
    c = median([m["cpu_us"] for m in results["client"]])
    raw = median([m["cpu_us"] for m in results["raw"]])
    cs = median([m["per_s"] for m in results["client"]])
    rs = median([m["per_s"] for m in results["raw"]])
    print(f"\n{machine()}")
    print(f"{args.sessions} sessions (threads) x {args.turns} turns per round, "
          f"{len(results['client'])} rounds, medians:")
    print(f"  Client:      {c:7.1f} us CPU per dispatch, {cs:8.0f} dispatches/s")
    print(f"  raw urllib3: {raw:7.1f} us CPU per dispatch, {rs:8.0f} dispatches/s")
    print(f"  ratio (client / raw CPU): {c / raw:.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--turns", type=int, default=100, help="turns per session per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=300)
    main(p.parse_args())
