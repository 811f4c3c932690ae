"""CPU per dispatch of the async client against raw aiohttp sending the same requests.

N sessions (default 50) each run no-op turns (one ``read_file`` of a tiny file) back to back,
concurrently; each side runs for ``--turns`` turns per session per round, alternating sides,
``--rounds`` rounds, in one run. Measured: this process's CPU time (``time.process_time``) per
dispatch and dispatches per second; the server runs in its own process.

    SWITCHBOARD_BIN=target/release/switchboard python clients/python/bench/cpu_per_dispatch.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _harness import (Rounds, Server, check_noop, cpu_arguments, noop_message,  # noqa: E402
                      raw_headers, raw_turn_id, tiny_file)
from switchboard_client import AsyncClient  # noqa: E402


async def run_client(sessions, turns):
    msg = noop_message()

    async def one(session):
        for _ in range(turns):
            check_noop(await session.dispatch(msg))

    await asyncio.gather(*(one(s) for s in sessions))


async def run_raw(http, urls, headers, turns):
    body = json.dumps(noop_message()).encode()

    async def one(url):
        for _ in range(turns):
            h = dict(headers)
            h["Switchboard-Turn-Id"] = raw_turn_id()
            async with http.post(url, data=body, headers=h) as r:
                data = await r.read()
                if r.status != 200:
                    raise RuntimeError(data)
                answer = json.loads(data)
            check_noop(answer)

    await asyncio.gather(*(one(u) for u in urls))


async def main(args):
    with Server() as server:
        async with AsyncClient(server.base_url, token=server.token) as client:
            sessions = [client.session(f"bench{i}") for i in range(args.sessions)]
            for s in sessions:
                await s.create()
                tiny_file(s.workspace)
            urls = [f"{server.base_url}/v1/sessions/{s.id}/dispatch?format=anthropic"
                    for s in sessions]
            headers = raw_headers(server.token)
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as http:
                # Warm both up: connections, caches.
                await run_client(sessions, 5)
                await run_raw(http, urls, headers, 5)
                rounds = Rounds(args)
                for r in range(args.rounds):
                    for label, fn in rounds.sides(
                            r, lambda: run_client(sessions, args.turns),
                            lambda: run_raw(http, urls, headers, args.turns)):
                        started = rounds.start()
                        await fn()
                        rounds.record(r, label, started)
                    if rounds.over():
                        break
    rounds.report(f"{args.sessions} sessions x {args.turns} turns per round", "AsyncClient",
                  "raw aiohttp")


if __name__ == "__main__":
    asyncio.run(main(cpu_arguments(__doc__)))
