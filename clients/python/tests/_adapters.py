"""What the adapters' tests (``test_langgraph.py``, ``test_create_agent.py``, ``test_agents.py``)
share: the plain Python tools each framework wraps with its own decorator, the order they ran in,
the adapter's client, the server's live catalog, the cancel of a running turn, and the timing of
a run against the framework's own."""

import asyncio
import json
import os
import threading
import time
import urllib.request
from typing import Any, Callable, Dict, Iterator, List

import pytest

from switchboard_client import AsyncClient

order: List[str] = []
order_lock = threading.Lock()


def lookup(key: str) -> str:
    """Looks a key up."""
    with order_lock:
        order.append(f"lookup:{key}")
    return f"value-of-{key}"


async def alookup(key: str) -> str:
    """Looks a key up, asynchronously."""
    await asyncio.sleep(0.001)
    with order_lock:
        order.append(f"alookup:{key}")
    return f"async-{key}"


def read_note(path: str) -> str:
    """Reads a file."""
    with open(path) as f:
        return f.read()


def meeting(barrier: threading.Barrier) -> Callable[[str], str]:
    """A tool whose calls return only when two of them are running at once."""
    def meet(who: str) -> str:
        """Waits for the other caller."""
        barrier.wait()            # only returns when both calls are running at once
        return f"met {who}"
    return meet


def adapter_client(server: Any, token: str, loop_thread: Any) -> Iterator[AsyncClient]:
    """The body of a ``client`` fixture: an ``AsyncClient`` for the adapter, closed on the
    adapter's private loop (``loop_thread``, its ``_LoopThread``), where it lived."""
    c = AsyncClient(server.base_url, token=token)
    yield c
    loop_thread.get().run(c.close())


def live_catalog(server: Any, token: str) -> Dict[str, Dict[str, Any]]:
    """The server's ``GET /v1/tools``, by tool name."""
    request = urllib.request.Request(f"{server.base_url}/v1/tools",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request) as response:
        catalog = json.load(response)
    return {t["name"]: t for t in catalog}


async def cancel_once_started(run: Any, session_of: Callable[[], Any]) -> None:
    """Runs the coroutine ``run`` (a graph or agent run whose turn runs ``touch started && sleep
    300``) until the file ``started`` is in the workspace of ``session_of()`` (None until the
    adapter has made the session), then cancels it: the run raises ``CancelledError``."""
    task = asyncio.ensure_future(run)
    while True:
        session = session_of()
        if session is not None and session.created and os.path.exists(
                os.path.join(session.workspace, "started")):
            break
        assert not task.done()
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def wait_until_idle(loop_thread: Any, session: Any) -> None:
    """Waits until ``session`` (living on the adapter's loop) runs nothing: after a cancel."""
    deadline = time.monotonic() + 120     # a bound for a hung test, not a measurement
    while loop_thread.run(session.info())["in_flight"] != 0:
        assert time.monotonic() < deadline, "the cancelled turn kept running"
        time.sleep(0.05)


def old_note(tmp_path: Any, i: int) -> str:
    """The path of a fresh file holding ``old``, for write-then-read trial ``i``."""
    p = str(tmp_path / f"note{i}.txt")
    with open(p, "w") as f:
        f.write("old")
    return p


def delete_on_the_server(server: Any, token: str, session_id: str) -> None:
    """Deletes a session behind the adapter's back, as the server's idle timeout would."""
    request = urllib.request.Request(f"{server.base_url}/v1/sessions/{session_id}",
                                     method="DELETE",
                                     headers={"Authorization": f"Bearer {token}"})
    urllib.request.urlopen(request).close()


def best_time(run: Callable[[int], Any], rounds: int = 3) -> float:
    """The fastest of ``rounds`` runs of ``run(round)``, after one unmeasured warm-up run
    (sessions made, imports done): the least disturbed figure on a shared machine. Compared as
    a ratio with the framework's own, measured in the same test."""
    run(-1)
    times = []
    for r in range(rounds):
        start = time.perf_counter()
        run(r)
        times.append(time.perf_counter() - start)
    return min(times)
