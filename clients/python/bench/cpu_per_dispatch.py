"""CPU per dispatch of the async client against raw aiohttp sending the same requests.

N sessions (default 50) each run no-op turns (one ``read_file`` of a tiny file) back to back,
concurrently; each side runs for ``--turns`` turns per session per round, alternating sides,
``--rounds`` rounds, in one run. Measured: this process's CPU time (``time.process_time``) per
dispatch and dispatches per second; the server runs in its own process.

    SWITCHBOARD_BIN=target/release/switchboard python clients/python/bench/cpu_per_dispatch.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import aiohttp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _harness import Server, machine, median, noop_message  # noqa: E402
from switchboard_client import AsyncClient  # noqa: E402


async def run_client(sessions, turns):
    msg = noop_message()

    async def one(session):
        for _ in range(turns):
            answer = await session.dispatch(msg)
            assert answer["content"][0]["content"] == "x", answer

    await asyncio.gather(*(one(s) for s in sessions))


async def run_raw(http, urls, headers, turns):
    body = json.dumps(noop_message()).encode()

    async def one(url):
        for _ in range(turns):
            h = dict(headers)
            h["Switchboard-Turn-Id"] = "py-" + os.urandom(8).hex()
            async with http.post(url, data=body, headers=h) as r:
                data = await r.read()
                if r.status != 200:
                    raise RuntimeError(data)
                answer = json.loads(data)
            assert answer["content"][0]["content"] == "x", answer

    await asyncio.gather(*(one(u) for u in urls))


async def measure(label, coro_fn, dispatches):
    t0, c0 = time.perf_counter(), time.process_time()
    await coro_fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"side": label, "cpu_us": cpu / dispatches * 1e6, "per_s": dispatches / wall}


async def main(args):
    with Server() as server:
        async with AsyncClient(server.base_url, token=server.token) as client:
            sessions = [client.session(f"bench{i}") for i in range(args.sessions)]
            for s in sessions:
                await s.create()
                with open(os.path.join(s.workspace, "tiny.txt"), "w") as f:
                    f.write("x")
            urls = [f"{server.base_url}/v1/sessions/{s.id}/dispatch?format=anthropic"
                    for s in sessions]
            headers = {"Authorization": f"Bearer {server.token}",
                       "Content-Type": "application/json"}
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as http:
                # Warm both up: connections, caches.
                await run_client(sessions, 5)
                await run_raw(http, urls, headers, 5)
                dispatches = args.sessions * args.turns
                results = {"client": [], "raw": []}
                deadline = time.monotonic() + args.max_seconds
                for r in range(args.rounds):
                    order = [("client", lambda: run_client(sessions, args.turns)),
                             ("raw", lambda: run_raw(http, urls, headers, args.turns))]
                    if r % 2:
                        order.reverse()
                    for label, fn in order:
                        m = await measure(label, fn, dispatches)
                        results[label].append(m)
                        print(f"round {r + 1} {label:6s} {m['cpu_us']:7.1f} us CPU/dispatch  "
                              f"{m['per_s']:8.0f} dispatches/s", flush=True)
                    if time.monotonic() > deadline:
                        print("(time bound reached)")
                        break
    c = median([m["cpu_us"] for m in results["client"]])
    raw = median([m["cpu_us"] for m in results["raw"]])
    cs = median([m["per_s"] for m in results["client"]])
    rs = median([m["per_s"] for m in results["raw"]])
    print(f"\n{machine()}")
    print(f"{args.sessions} sessions x {args.turns} turns per round, {len(results['client'])} "
          "rounds, medians:")
    print(f"  AsyncClient: {c:7.1f} us CPU per dispatch, {cs:8.0f} dispatches/s")
    print(f"  raw aiohttp: {raw:7.1f} us CPU per dispatch, {rs:8.0f} dispatches/s")
    print(f"  ratio (client / raw CPU): {c / raw:.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--turns", type=int, default=100, help="turns per session per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=300)
    asyncio.run(main(p.parse_args()))
