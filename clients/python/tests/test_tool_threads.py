"""Client-tool calls keep their deadlines: each call starts at once on a thread of its own, so
functions that hang starve no other call of the client (of any session); a call whose deadline
passed before a thread took it never starts; and once the client is closed nothing starts and
nothing is said about late answers."""

import asyncio
import logging
import threading
import time

import pytest

from switchboard_client import AsyncClient, Client, ToolCallContext
from switchboard_client import _common as c


def tool_use(id, name, input):
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def test_forty_hung_charges_start_in_time_and_starve_no_other_session(server, token, caplog,
                                                                      capsys):
    """One turn of 40 calls to a client tool that hangs 3 s, with a 300 ms deadline: all 40
    start at once (none after its deadline), the turn is answered ``timeout`` at about 0.3 s,
    a call of another session runs while the 40 still hang, and after ``close()`` their late
    answers make no noise."""
    caplog.set_level(logging.DEBUG, logger="switchboard_client")
    lock = threading.Lock()
    starts, handed, finished = [], {}, threading.Event()
    client = Client(server.base_url, token=token)
    charges = client.session()
    other = client.session()

    @charges.tool(concurrency_safe=True, timeout_ms=300)
    def charge(order: int, ctx: ToolCallContext) -> str:
        """Charges an order (the payment service hangs: 3 s)."""
        with lock:
            starts.append((time.monotonic(), ctx.deadline_ms))
        time.sleep(3)
        with lock:
            handed[order] = True
            if len(handed) == 40:
                finished.set()
        return "charged"

    @other.tool(timeout_ms=1000)
    def ping() -> str:
        """Answers at once."""
        return "pong"

    charges.create()
    other.create()
    began = time.monotonic()
    answer = charges.dispatch(assistant(*[tool_use(f"c{i}", "charge", {"order": i})
                                          for i in range(40)]))
    answered = time.monotonic() - began
    blocks = answer["content"]
    assert len(blocks) == 40
    assert all(b["content"].startswith("Error [timeout]") for b in blocks), blocks[0]

    asked = time.monotonic()
    pong = other.dispatch(assistant(tool_use("p", "ping", {})))
    ponged = time.monotonic() - asked
    assert pong["content"][0]["content"] == "pong", pong
    assert not finished.is_set(), "the 40 still hang"

    client.close()
    assert finished.wait(10), "every charge ended"
    time.sleep(0.2)  # their answers, dropped
    with lock:
        offsets = sorted(t - began for t, _ in starts)
    # A call handed over at h >= began has its deadline at h + 0.3 >= began + 0.3: a start
    # before began + 0.3 is in time, so this counts every late start (and maybe a few more).
    late = [o for o in offsets if o > 0.3]
    said = capsys.readouterr().err
    with capsys.disabled():
        print(f"\n40 hung charges, timeout_ms=300: answered in {answered:.3f} s; {len(offsets)} "
              f"started, first at {offsets[0]:.3f} s, last at {offsets[-1]:.3f} s; started "
              f"after the deadline: {len(late)}; another session's call answered in "
              f"{ponged * 1000:.1f} ms")
    assert len(offsets) == 40 and late == []
    assert answered < 2.0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert said == "", said


def call_event(deadline_ms):
    return {"call_id": "c1", "tool_use_id": "t1", "name": "charge", "input": {},
            "deadline_ms": deadline_ms, "idempotency_key": None}


def fake_session(session, posted):
    session._id, session._base = "s1", "/v1/sessions/s1"

    def request(method, path, body=None, *args, **kwargs):
        posted.append((path, body))
    return request


def test_a_call_whose_deadline_passed_before_a_thread_took_it_never_starts(monkeypatch):
    ran, posted = [], []
    client = Client("http://127.0.0.1:9", token="t")
    session = client.session()

    @session.tool
    def charge() -> str:
        """Charges."""
        ran.append(1)
        return "charged"

    monkeypatch.setattr(client, "_request", fake_session(session, posted))
    session._run_call(call_event(300), time.monotonic() - 0.5)  # taken 500 ms late
    assert ran == [] and posted == [], "not started, not answered: the engine said timeout"
    session._run_call(call_event(300), time.monotonic())
    assert ran == [1] and len(posted) == 1


def test_the_async_client_does_not_start_an_expired_call_either(monkeypatch):
    ran, posted = [], []
    client = AsyncClient("http://127.0.0.1:9", token="t")
    session = client.session()

    @session.tool
    def charge() -> str:
        """Charges (a plain function: on a thread)."""
        ran.append("thread")
        return "charged"

    async def request(method, path, body=None, *args, **kwargs):
        posted.append(path)

    session._id, session._base = "s1", "/v1/sessions/s1"
    monkeypatch.setattr(client, "_request", request)

    async def main():
        await session._run_call(call_event(300), time.monotonic() - 0.5)
        assert ran == [] and posted == []
        await session._run_call(call_event(300), time.monotonic())
        assert ran == ["thread"] and len(posted) == 1
        # Taken by its thread after the deadline (the thread started late): not started.
        value = c.start_in_time
        with pytest.raises(c.CallExpired):
            value(call_event(1), time.monotonic() - 0.01, ran.append, "late")
        assert ran == ["thread"]

    asyncio.run(main())


def test_tool_threads_are_not_bounded_and_are_reused_when_idle():
    threads = c.ToolThreads()
    barrier = threading.Barrier(100, timeout=10)
    names = set()

    def meet():
        names.add(threading.current_thread().name)
        barrier.wait()  # 100 at once: a pool of 32 could never pass it

    futures = [threads.submit(meet) for _ in range(100)]
    for f in futures:
        f.result(10)
    assert len(names) == 100
    time.sleep(0.1)
    again = threads.submit(lambda: threading.current_thread().name).result(5)
    assert again in names, "an idle thread took the next call"
    threads.shutdown()
    with pytest.raises(RuntimeError):
        threads.submit(lambda: None)
