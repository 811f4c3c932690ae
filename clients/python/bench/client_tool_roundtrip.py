"""Latency of a turn calling one no-op client tool (over the stream: ``event: call``, the
answer POST, ``done``) against a turn of one built-in no-op call (``read_file`` of a tiny
file, plain JSON), sync and async, one session, turns back to back.

    SWITCHBOARD_BIN=target/release/switchboard python clients/python/bench/client_tool_roundtrip.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _harness import Server, machine, noop_message, pct, tiny_file  # noqa: E402
from switchboard_client import AsyncClient, Client  # noqa: E402

CLIENT_TOOL = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "c", "name": "noop_tool", "input": {}}]}


def noop_tool() -> str:
    """Does nothing."""
    return "ok"


async def async_noop_tool() -> str:
    """Does nothing."""
    return "ok"


def report(label, samples):
    ms = [s * 1000 for s in samples]
    print(f"  {label:34s} p50 {pct(ms, 0.5):7.3f} ms  p99 {pct(ms, 0.99):7.3f} ms  "
          f"({len(ms)} turns)")


def sync_side(base_url, token, turns, max_seconds):
    out = {}
    with Client(base_url, token=token) as client:
        session = client.session("rt-sync")
        session.register(noop_tool)
        with session:
            tiny_file(session.workspace)
            for label, msg, want in (("client tool (stream)", CLIENT_TOOL, "ok"),
                                     ("built-in read_file (JSON)", noop_message(), "x")):
                samples, end = [], time.monotonic() + max_seconds
                for i in range(turns + 20):
                    t0 = time.perf_counter()
                    answer = session.dispatch(msg)
                    dt = time.perf_counter() - t0
                    assert answer["content"][0]["content"] == want, answer
                    if i >= 20:
                        samples.append(dt)
                    if time.monotonic() > end:
                        break
                out[label] = samples
    return out


async def async_side(base_url, token, turns, max_seconds):
    out = {}
    async with AsyncClient(base_url, token=token) as client:
        for tool in ("sync", "async"):
            session = client.session(f"rt-async-{tool}")
            session.register(noop_tool if tool == "sync" else async_noop_tool, name="noop_tool")
            async with session:
                await session.create()
                tiny_file(session.workspace)
                cases = [(f"client tool, {tool} fn (stream)", CLIENT_TOOL, "ok")]
                if tool == "sync":
                    cases.append(("built-in read_file (JSON)", noop_message(), "x"))
                for label, msg, want in cases:
                    samples, end = [], time.monotonic() + max_seconds
                    for i in range(turns + 20):
                        t0 = time.perf_counter()
                        answer = await session.dispatch(msg)
                        dt = time.perf_counter() - t0
                        assert answer["content"][0]["content"] == want, answer
                        if i >= 20:
                            samples.append(dt)
                        if time.monotonic() > end:
                            break
                    out[label] = samples
    return out


def main(args):
    with Server() as server:
        sync = sync_side(server.base_url, server.token, args.turns, args.max_seconds)
        asy = asyncio.run(async_side(server.base_url, server.token, args.turns, args.max_seconds))
    print(machine())
    print("sync Client:")
    for k, v in sync.items():
        report(k, v)
    print("AsyncClient:")
    for k, v in asy.items():
        report(k, v)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=2000)
    p.add_argument("--max-seconds", type=float, default=60, help="per measured case")
    main(p.parse_args())
