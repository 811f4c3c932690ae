"""CPU per dispatch of the sync client against raw urllib3 sending the same requests.

N sessions (default 50), one thread each, run no-op turns (one ``read_file`` of a tiny file)
back to back; each side runs ``--turns`` turns per session per round, alternating sides,
``--rounds`` rounds, in one run. Measured: this process's CPU time (``time.process_time``)
per dispatch and dispatches per second.

    SWITCHBOARD_BIN=target/release/switchboard python clients/python/bench/sync_cpu_per_dispatch.py
"""

from __future__ import annotations

import json
import os
import sys
import threading

import urllib3

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _harness import (Rounds, Server, check_noop, cpu_arguments, noop_message,  # noqa: E402
                      raw_headers, raw_turn_id, tiny_file)
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
                check_noop(session.dispatch(msg))
        return go

    in_threads([one(s) for s in sessions])


def run_raw(pool, paths, headers, turns):
    body = json.dumps(noop_message()).encode()

    def one(path):
        def go():
            for _ in range(turns):
                h = dict(headers)
                h["Switchboard-Turn-Id"] = raw_turn_id()
                r = pool.urlopen("POST", path, body=body, headers=h, retries=False)
                if r.status != 200:
                    raise RuntimeError(r.data)
                check_noop(json.loads(r.data))
        return go

    in_threads([one(p) for p in paths])


def main(args):
    with Server() as server, Client(server.base_url, token=server.token,
                                    max_connections=args.sessions) as client:
        sessions = [client.session(f"bench{i}") for i in range(args.sessions)]
        for s in sessions:
            s.create()
            tiny_file(s.workspace)
        paths = [f"/v1/sessions/{s.id}/dispatch?format=anthropic" for s in sessions]
        headers = raw_headers(server.token)
        pool = urllib3.connection_from_url(server.base_url, maxsize=args.sessions, block=False)
        run_client(sessions, 5)
        run_raw(pool, paths, headers, 5)
        rounds = Rounds(args)
        for r in range(args.rounds):
            for label, fn in rounds.sides(r, lambda: run_client(sessions, args.turns),
                                          lambda: run_raw(pool, paths, headers, args.turns)):
                started = rounds.start()
                fn()
                rounds.record(r, label, started)
            if rounds.over():
                break
        pool.close()
    rounds.report(f"{args.sessions} sessions (threads) x {args.turns} turns per round", "Client",
                  "raw urllib3")


if __name__ == "__main__":
    main(cpu_arguments(__doc__))
