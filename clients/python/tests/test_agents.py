"""The OpenAI Agents SDK adapter against the real openai-agents and the real server.

The model is the SDK's own ``agents.testing.ScriptedModel`` (a ``Model`` returning scripted
responses; no network). The write-then-read figures print with ``-s``:

    SWITCHBOARD_BIN=target/release/switchboard python -m pytest -q -s \
        clients/python/tests/test_agents.py -k write_then_read
"""

import asyncio
import threading
import uuid
from typing import Any, Callable, List

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.exceptions import ModelBehaviorError  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402

import switchboard_client  # noqa: E402
from switchboard_client import agents as sb_agents  # noqa: E402
from switchboard_client.agents import switchboard_tools  # noqa: E402

import _adapters as shared  # noqa: E402
from _adapters import order, order_lock  # noqa: E402
from conftest import binary  # noqa: E402

TRIALS = 50
set_tracing_disabled(True)      # no trace export (and no network) from the tests


def turn(*calls: Any, k: int = 0) -> list:
    """One model response: the function calls, ids ``c{k}_{i}``."""
    return [function_call(name, args, call_id=f"c{k}_{i}") for i, (name, args) in
            enumerate(calls)]


def scripted(*turns: list) -> ScriptedModel:
    return ScriptedModel([*turns, [assistant_message("done")]])


def outputs(model: ScriptedModel, call: int = -1) -> dict:
    """call_id -> output of the function_call_output items the model saw in its ``call``-th
    request (default: the last)."""
    items = model.calls[call].input
    items = items if isinstance(items, list) else []
    return {i["call_id"]: i["output"] for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"}


@pytest.fixture()
def client(server, token):
    yield from shared.adapter_client(server, token, sb_agents._LoopThread)


lookup = function_tool(shared.lookup)
alookup = function_tool(shared.alookup)


def boom(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"boom: {reason}")


def file_tools(slow_write_s: float = 0.02):
    """A write tool that sleeps a little before writing (realistic I/O) and a read tool."""

    @function_tool
    async def write_note(path: str, text: str) -> str:
        """Writes text to a file."""
        await asyncio.sleep(slow_write_s)
        with open(path, "w") as f:
            f.write(text)
        return f"wrote {path}"

    return [write_note, function_tool(shared.read_note)]


def test_builtins_match_the_servers_catalog(server, token):
    live = shared.live_catalog(server, token)
    tools, _ = switchboard_tools([], builtins=True)
    assert [t.name for t in tools] == list(sb_agents.BUILTIN_NAMES)
    for t in tools:
        assert t.description == live[t.name]["description"]
        assert t.params_json_schema == live[t.name]["input_schema"]


def test_one_response_is_one_turn_in_the_models_order(client):
    serial = {"concurrency_safe": False}      # declared: they run alone, in call order
    tools, hooks = switchboard_tools([lookup, alookup], client=client, builtins=["bash"],
                                     tool_options={"lookup": serial, "alookup": serial})
    calls = [("alookup", {"key": "0"}), ("lookup", {"key": "1"}),
             ("bash", {"command": "echo hi"}), ("alookup", {"key": "3"}),
             ("lookup", {"key": "4"})]
    model = scripted(turn(*calls))
    agent = Agent(name="a", model=model, tools=tools)
    with order_lock:
        order.clear()
    try:
        result = asyncio.run(Runner.run(agent, "go", hooks=hooks))
        assert result.final_output == "done"
        seen = outputs(model)
        assert seen["c0_0"] == "async-0" and seen["c0_1"] == "value-of-1"
        assert seen["c0_2"].strip() == "hi"
        assert hooks.turns == 1
        assert order == ["alookup:0", "lookup:1", "alookup:3", "lookup:4"]
    finally:
        hooks.close()


@pytest.mark.parametrize("options", [None, {"meet": {"concurrency_safe": True}}],
                         ids=["undeclared", "declared"])
def test_undeclared_and_concurrency_safe_tools_overlap(client, options):
    """A function tool that declares nothing overlaps with its response's other calls, as the
    SDK runs it (the barrier only opens for two calls at once)."""
    meet = function_tool(shared.meeting(threading.Barrier(2, timeout=60)))
    tools, hooks = switchboard_tools([meet], client=client, builtins=False,
                                     tool_options=options)
    model = scripted(turn(("meet", {"who": "a"}), ("meet", {"who": "b"})))
    try:
        asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go", hooks=hooks))
        assert outputs(model) == {"c0_0": "met a", "c0_1": "met b"}
        assert hooks.turns == 1
    finally:
        hooks.close()


def test_tool_options_defer_is_forwarded_and_checked(client):
    tools, hooks = switchboard_tools([lookup], client=client, builtins=False,
                                     tool_options={"lookup": {"defer": "always"}})
    model = scripted(turn(("lookup", {"key": "d"})))
    try:
        asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go", hooks=hooks))
        assert outputs(model) == {"c0_0": "value-of-d"}   # a deferred tool called by name runs
        catalog = {t["name"]: t
                   for t in sb_agents._LoopThread.get().run(hooks.session.tools())}
        assert catalog["lookup"]["defer_loading"] is True
    finally:
        hooks.close()
    with pytest.raises(ValueError, match="'lookup'.*'never', 'auto' or 'always'"):
        switchboard_tools([lookup], client=client, tool_options={"lookup": {"defer": 1}})


def test_a_streamed_run_is_one_turn_too(client):
    tools, hooks = switchboard_tools([lookup, alookup], client=client, builtins=["bash"])
    model = scripted(turn(("lookup", {"key": "s"}), ("bash", {"command": "echo s"}),
                          ("alookup", {"key": "t"})))

    async def main():
        result = Runner.run_streamed(Agent(name="a", model=model, tools=tools), "go",
                                     hooks=hooks)
        async for _ in result.stream_events():
            pass
        return result.final_output
    try:
        assert asyncio.run(main()) == "done"
        seen = outputs(model)
        assert seen["c0_0"] == "value-of-s" and seen["c0_1"].strip() == "s"
        assert seen["c0_2"] == "async-t"
        assert hooks.turns == 1
    finally:
        hooks.close()


def test_a_session_the_server_closed_is_replaced(server, token, client):
    tools, hooks = switchboard_tools([lookup], client=client, builtins=False)
    try:
        asyncio.run(Runner.run(Agent(name="a", model=scripted(turn(("lookup", {"key": "1"}))),
                                     tools=tools), "go", hooks=hooks))
        first = hooks.session
        shared.delete_on_the_server(server, token, first.id)   # as the idle timeout would
        model = scripted(turn(("lookup", {"key": "2"})))
        asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go", hooks=hooks))
        assert outputs(model) == {"c0_0": "value-of-2"}
        assert hooks.session is not first
    finally:
        hooks.close()


def test_a_call_waiting_for_approval_does_not_hold_the_others(client):
    @function_tool(needs_approval=True)
    def delete_everything(why: str) -> str:
        """Deletes everything."""
        return f"deleted ({why})"

    tools, hooks = switchboard_tools([lookup, delete_everything], client=client,
                                     builtins=False)
    model = scripted(turn(("delete_everything", {"why": "asked"}), ("lookup", {"key": "a"})))
    agent = Agent(name="a", model=model, tools=tools)

    async def main():
        result = await Runner.run(agent, "go", hooks=hooks)
        assert [i.name for i in result.interruptions] == ["delete_everything"]
        state = result.to_state()
        state.approve(result.interruptions[0])
        return await Runner.run(agent, state, hooks=hooks)
    try:
        result = asyncio.run(main())
        assert result.final_output == "done"
        assert outputs(model) == {"c0_0": "deleted (asked)", "c0_1": "value-of-a"}
        assert hooks.turns == 2      # lookup went first; the approved call after the approval
    finally:
        hooks.close()


def test_without_the_hooks_the_window_still_makes_one_turn(client):
    tools, hooks = switchboard_tools([lookup, alookup], client=client, builtins=False)
    model = scripted(turn(("lookup", {"key": "a"}), ("alookup", {"key": "b"})))
    try:
        result = Runner.run_sync(Agent(name="a", model=model, tools=tools), "go")
        assert result.final_output == "done"
        assert outputs(model) == {"c0_0": "value-of-a", "c0_1": "async-b"}
        assert hooks.turns == 1
    finally:
        hooks.close()


def test_a_raising_tool_is_an_error_result_and_the_run_goes_on(client):
    tools, hooks = switchboard_tools([lookup, boom], client=client, builtins=False)
    model = scripted(turn(("boom", {"reason": "bad"}), ("lookup", {"key": "k"})),
                     turn(("lookup", {"key": "again"}), k=1))
    try:
        result = asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go",
                                        hooks=hooks))
        assert result.final_output == "done"
        first = outputs(model, 1)
        # The SDK's own failure text (it hides the exception from the model), as the engine's
        # error result: no exception type in front of it.
        assert first["c0_0"] == ("Error [execution_error]: An error occurred while running "
                                 "the tool. Please try again.")
        assert first["c0_1"] == "value-of-k"
        assert outputs(model)["c1_0"] == "value-of-again"
        assert hooks.turns == 2
    finally:
        hooks.close()


def test_invalid_arguments_are_the_engines_error_result(client):
    tools, hooks = switchboard_tools([lookup], client=client, builtins=False)
    model = scripted([function_call("lookup", '{"key": 5}', call_id="c0_0"),
                      function_call("lookup", {"key": "ok"}, call_id="c0_1")])
    try:
        asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go", hooks=hooks))
        seen = outputs(model)
        assert "invalid_arguments" in seen["c0_0"], seen
        assert seen["c0_1"] == "value-of-ok"
    finally:
        hooks.close()


def test_an_unknown_tool_is_an_error_result_not_a_crash(client):
    tools, hooks = switchboard_tools([lookup], client=client, builtins=False)
    model = scripted(turn(("no_such_tool", {}), ("lookup", {"key": "k"})))
    try:
        # The SDK decides what an unknown name is: an error result with this setting...
        result = asyncio.run(Runner.run(
            Agent(name="a", model=model, tools=tools), "go", hooks=hooks,
            run_config=RunConfig(tool_not_found_behavior="return_error_to_model")))
        assert result.final_output == "done"
        seen = outputs(model)
        assert "not found" in seen["c0_0"] and seen["c0_1"] == "value-of-k"
        # ...and by default its ModelBehaviorError, before any tool runs.
        model = scripted(turn(("no_such_tool", {}), ("lookup", {"key": "k"}), k=1))
        with pytest.raises(ModelBehaviorError):
            asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go",
                                   hooks=hooks))
    finally:
        hooks.close()


def test_client_tool_mixed_with_builtins_share_the_workspace(client):
    tools, hooks = switchboard_tools([lookup], client=client)
    model = scripted(turn(("write_file", {"path": "m.txt", "content": "mixed"}),
                          ("lookup", {"key": "m"}),
                          ("bash", {"command": "cat m.txt"})),
                     turn(("read_file", {"path": "m.txt"}), k=1))
    try:
        asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go", hooks=hooks))
        first, last = outputs(model, 1), outputs(model)
        assert first["c0_1"] == "value-of-m"
        assert first["c0_2"].strip() == "mixed"
        assert "mixed" in last["c1_0"]
        assert hooks.turns == 2
    finally:
        hooks.close()


def test_cancelling_the_run_cancels_the_turn_and_kills_its_process(client):
    tools, hooks = switchboard_tools([], client=client, builtins=["bash"])
    model = scripted(turn(("bash", {"command": "touch started && sleep 300"})))

    try:
        asyncio.run(shared.cancel_once_started(
            Runner.run(Agent(name="a", model=model, tools=tools), "go", hooks=hooks),
            lambda: hooks.session))
        shared.wait_until_idle(sb_agents._LoopThread.get(), hooks.session)
    finally:
        hooks.close()


# ---- write then read ----------------------------------------------------------------------

def _count_fresh(make_tools, make_turn, read_id: str, trials: int = TRIALS,
                 use_hooks: bool = True) -> int:
    fresh = 0
    for i in range(trials):
        tools, hooks = make_tools()
        model = scripted(*make_turn(i))
        agent = Agent(name="a", model=model, tools=tools)
        try:
            asyncio.run(Runner.run(agent, "go", hooks=hooks if use_hooks else None))
        finally:
            if hasattr(hooks, "close"):
                hooks.close()
        got = outputs(model)[read_id]
        fresh += "new" in got and "old" not in got
    return fresh


def test_write_then_read_builtins_through_the_adapter(client):
    def turns(i):
        p = f"wr{i}.txt"
        return (turn(("write_file", {"path": p, "content": "old"})),
                turn(("write_file", {"path": p, "content": "new"}), ("read_file", {"path": p}),
                     k=1))
    fresh = _count_fresh(lambda: switchboard_tools([], client=client), turns, "c1_1")
    print(f"\nwrite-then-read, built-ins through switchboard_tools: "
          f"{fresh}/{TRIALS} reads saw the write")
    assert fresh == TRIALS


def _python_file_turns(tmp_path):
    def turns(i):
        p = shared.old_note(tmp_path, i)
        return (turn(("write_note", {"path": p, "text": "new"}), ("read_note", {"path": p})),)
    return turns


def test_write_then_read_client_tools_through_the_adapter(client, tmp_path):
    # The write declares that it may not overlap (a tool that declares nothing overlaps, as the
    # SDK runs it): the read after it waits for it.
    fresh = _count_fresh(lambda: switchboard_tools(
        file_tools(), client=client, builtins=False,
        tool_options={"write_note": {"concurrency_safe": False}}),
        _python_file_turns(tmp_path), "c0_1")
    print(f"\nwrite-then-read, Python tools through switchboard_tools: "
          f"{fresh}/{TRIALS} reads saw the write")
    assert fresh == TRIALS


def test_write_then_read_through_the_sdk_alone(tmp_path):
    """The peer: the Agents SDK's own concurrent execution of the same Python tools. Reported;
    only "at least one read was stale" is asserted."""
    fresh = _count_fresh(lambda: (file_tools(), None), _python_file_turns(tmp_path), "c0_1",
                         use_hooks=False)
    print(f"\nwrite-then-read, Python tools through the Agents SDK alone: "
          f"{fresh}/{TRIALS} reads saw the write")
    assert fresh < TRIALS


# ---- speed, turn ids, local() ---------------------------------------------------------------

def test_independent_calls_are_not_slower_than_the_sdk_alone(client):
    """8 function tools that each sleep 0.2 s in one response, undeclared: they run at once, as
    the SDK runs them — asserted as a ratio measured in the same test, not as a time."""
    def sleeper(i: int) -> Any:
        async def body(x: str) -> str:
            await asyncio.sleep(0.2)
            return f"slept {x}"
        body.__name__ = f"sleep_{i}"
        body.__doc__ = "Sleeps."
        return function_tool(body)
    plain = [sleeper(i) for i in range(8)]
    ours, hooks = switchboard_tools(plain, client=client, builtins=False)
    calls = [(t.name, {"x": str(i)}) for i, t in enumerate(plain)]

    def run(tools: List[Any], use_hooks: bool) -> Callable[[int], None]:
        def once(r: int) -> None:
            model = scripted(turn(*calls, k=r + 1))
            asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go",
                                   hooks=hooks if use_hooks else None))
            assert outputs(model) == {f"c{r + 1}_{i}": f"slept {i}" for i in range(8)}
        return once
    try:
        t_theirs = shared.best_time(run(plain, False))
        t_ours = shared.best_time(run(ours, True))
        print(f"\n8 x 0.2 s tools in one response: switchboard_tools {t_ours:.3f} s, "
              f"the SDK alone {t_theirs:.3f} s, ratio {t_ours / t_theirs:.2f}")
        assert t_ours < 2 * t_theirs, (t_ours, t_theirs)
    finally:
        hooks.close()


def reusing(response_id: str, *calls: Any) -> ModelStep:
    """A response with its own id whose calls are ``call_0``, ``call_1``, … — as some servers
    number them in every response."""
    return ModelStep(output=[function_call(name, args, call_id=f"call_{i}")
                             for i, (name, args) in enumerate(calls)],
                     response_id=response_id)


def test_a_model_that_reuses_call_ids_gets_fresh_answers(client):
    """The turn is named after the model's response id: the same call id and arguments in two
    responses are two calls — the second read sees the second write, not the first read's
    stored answer. (Within one run the SDK refuses a reused call id; across runs of one
    conversation — history kept by the provider, ``previous_response_id`` — it does not.)"""
    tools, hooks = switchboard_tools([], client=client, builtins=["write_file", "read_file"])
    path = f"reused-{uuid.uuid4().hex[:8]}.txt"
    reads = []
    try:
        for k, call in enumerate([("write_file", {"path": path, "content": "v1"}),
                                  ("read_file", {"path": path}),
                                  ("write_file", {"path": path, "content": "v2"}),
                                  ("read_file", {"path": path})]):
            model = ScriptedModel([reusing(f"resp-{k}", call), [assistant_message("done")]])
            asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go",
                                   hooks=hooks))
            if call[0] == "read_file":
                reads.append(outputs(model)["call_0"])
        assert reads == ["v1", "v2"], reads
    finally:
        hooks.close()


def test_the_same_response_run_again_is_answered_from_the_engines_memory(client):
    runs: List[str] = []

    @function_tool
    def charge(amount: int) -> str:
        """Charges the card."""
        runs.append(f"charge:{amount}")
        return f"charged {amount} ({len(runs)})"

    tools, hooks = switchboard_tools([charge], client=client, builtins=False)
    try:
        seen = []
        for _ in range(2):      # a harness replaying the response, e.g. after a restart
            model = ScriptedModel([reusing("resp-pay", ("charge", {"amount": 5})),
                                   [assistant_message("done")]])
            asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go",
                                   hooks=hooks))
            seen.append(outputs(model)["call_0"])
        assert runs == ["charge:5"]
        assert seen == ["charged 5 (1)", "charged 5 (1)"]
    finally:
        hooks.close()


def test_a_local_client_serves_the_bundle_and_stays_the_callers():
    with switchboard_client.local(binary=binary()) as client:
        tools, hooks = switchboard_tools([lookup], client=client, builtins=["bash"])
        model = scripted(turn(("bash", {"command": "echo local"}), ("lookup", {"key": "l"})))
        try:
            asyncio.run(Runner.run(Agent(name="a", model=model, tools=tools), "go",
                                   hooks=hooks))
            seen = outputs(model)
            assert [seen["c0_0"].strip(), seen["c0_1"]] == ["local", "value-of-l"]
            assert client.health()["status"] == "ok"
        finally:
            hooks.close()
    assert client.server.returncode == 0, client.server.stderr()


def test_a_local_async_client_serves_the_bundle_and_closes_on_its_own_loop():
    async def main() -> dict:
        client = await switchboard_client.local_async(binary=binary())
        tools, hooks = switchboard_tools([alookup], client=client, builtins=["bash"])
        model = scripted(turn(("bash", {"command": "echo async"}), ("alookup", {"key": "a"})))
        try:
            await Runner.run(Agent(name="a", model=model, tools=tools), "go", hooks=hooks)
            return outputs(model)
        finally:
            await hooks.aclose()
            await client.close()      # on this loop: the bundle never used the client's pool
            assert client.server.returncode == 0, client.server.stderr()
    seen = asyncio.run(main())
    assert [seen["c0_0"].strip(), seen["c0_1"]] == ["async", "async-a"]


def test_on_progress_gets_a_running_command_s_lines_on_the_run_s_loop(client):
    """A 4-second bash loop printing a line every 200 ms: each line reaches ``on_progress``
    (on the run's own event loop, under the SDK's call id) before the call's output reaches the
    model; a coroutine function works too."""
    loop_cmd = "for i in $(seq 1 20); do echo line $i; sleep 0.2; done"
    seen = []
    loops = set()

    async def on_progress(event):
        loops.add(asyncio.get_running_loop())
        seen.append(event)

    tools, hooks = switchboard_tools([lookup], client=client, builtins=["bash"],
                                     on_progress=on_progress)
    model = scripted(turn(("bash", {"command": loop_cmd}), ("lookup", {"key": "p"})))

    async def main():
        result = await Runner.run(Agent(name="a", model=model, tools=tools), "go", hooks=hooks)
        return result.final_output, asyncio.get_running_loop()

    try:
        final, run_loop = asyncio.run(main())
        assert final == "done"
        assert len(seen) >= 15, seen
        assert loops == {run_loop}
        assert {e["tool_use_id"] for e in seen} == {"c0_0"}
        assert "".join(e["text"] for e in seen) == "".join(f"line {i}\n" for i in range(1, 21))
        assert outputs(model)["c0_0"].strip().endswith("line 20")
    finally:
        hooks.close()
