"""Cancel races: N sessions (default 50) each start a ``sleep 1`` bash turn under a client turn
id and cancel it a uniformly random 0-500 ms later, ``--trials`` trials in all (default 1,000).
Counts the turns that ran to completion (must be 0) and where each cancel found its turn (the
cancel answer's ``state``: running, queued, early or finished).

    SWITCHBOARD_BIN=target/release/switchboard python clients/python/bench/cancel_race.py
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _harness import Server, machine  # noqa: E402
from switchboard_client import AsyncClient  # noqa: E402

MESSAGE = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "s", "name": "bash", "input": {"command": "sleep 1; echo completed"}}]}


async def main(args):
    rng = random.Random(args.seed)
    states = collections.Counter()
    outcomes = collections.Counter()
    lateness = []
    rtts = []
    remaining = [args.trials]
    started = time.monotonic()
    with Server(extra=args.server_arg) as server:
        async with AsyncClient(server.base_url, token=server.token) as client:
            async def worker(i):
                async with client.session(f"race{i}") as session:
                    await session.create()
                    while remaining[0] > 0 and time.monotonic() - started < args.max_seconds:
                        remaining[0] -= 1
                        delay = rng.uniform(0, args.max_delay_ms / 1000)
                        turn = session.start(MESSAGE)
                        await asyncio.sleep(delay)
                        t0 = time.monotonic()
                        answer = await turn.cancel()
                        rtts.append(time.monotonic() - t0)
                        states[answer["state"]] += 1
                        result = await turn
                        lateness.append(time.monotonic() - t0)
                        content = result["content"][0]["content"]
                        if content.startswith("Error [cancelled]"):
                            outcomes["cancelled"] += 1
                        elif content == "completed":
                            outcomes["completed"] += 1
                        else:
                            outcomes["other: " + content[:60]] += 1

            await asyncio.gather(*(worker(i) for i in range(args.sessions)))
    trials = sum(outcomes.values())
    lateness.sort()
    print(machine())
    print(f"{trials} trials over {args.sessions} sessions, cancel 0-{args.max_delay_ms} ms after "
          f"start, {time.monotonic() - started:.1f} s")
    print(f"  ran to completion: {outcomes['completed']}")
    print(f"  outcomes: {dict(outcomes)}")
    print(f"  cancel found the turn: {dict(states)}")
    if lateness:
        print(f"  cancel -> answer: p50 {lateness[len(lateness) // 2] * 1000:.1f} ms, "
              f"p99 {lateness[min(len(lateness) - 1, int(0.99 * len(lateness)))] * 1000:.1f} ms, "
              f"max {lateness[-1] * 1000:.1f} ms")
    if rtts:
        rtts.sort()
        print(f"  cancel request round trip: p50 {rtts[len(rtts) // 2] * 1000:.1f} ms, "
              f"p99 {rtts[min(len(rtts) - 1, int(0.99 * len(rtts)))] * 1000:.1f} ms")
    if outcomes["completed"]:
        sys.exit(1)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--max-delay-ms", type=float, default=500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-seconds", type=float, default=300)
    p.add_argument("--server-arg", action="append", default=[],
                   help="an extra argument for `switchboard serve` (repeatable)")
    asyncio.run(main(p.parse_args()))
