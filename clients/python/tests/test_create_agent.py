"""LangChain's ``create_agent`` with ``SwitchboardMiddleware``, against the real langchain,
langgraph and langchain-core and the real server.

``create_agent`` builds its own tool node and sends it each call of an AI message on its own; the
middleware makes the message one turn of the conversation's session. The model is scripted (no
network): ``ScriptedChat`` of ``test_langgraph.py``, whose human message says which tool calls each
model turn makes.
"""

import asyncio
import threading
import uuid
from typing import Any, List

import pytest

pytest.importorskip("langchain.agents")
pytest.importorskip("langgraph")

from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import AgentMiddleware  # noqa: E402
from langchain_core.messages import ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

import switchboard_client  # noqa: E402
from switchboard_client import langgraph as sb_langgraph  # noqa: E402
from switchboard_client.langgraph import SwitchboardMiddleware, builtin_tools  # noqa: E402

import _adapters as shared  # noqa: E402
from _adapters import order, order_lock  # noqa: E402
from conftest import binary  # noqa: E402
from test_langgraph import (ReusingChat, ScriptedChat, alookup, ask, boom,  # noqa: E402
                            file_tools, lookup, sleepers, thread, tool_messages)


@pytest.fixture()
def client(server, token):
    yield from shared.adapter_client(server, token, sb_langgraph._LoopThread)


def turns_of(mw: SwitchboardMiddleware) -> int:
    """How many turns the middleware's one session has run."""
    (session,) = mw.sessions
    return sb_langgraph._LoopThread.get().run(session.info())["turns"]


def test_a_message_is_one_turn_in_call_order_with_builtins(client):
    mw = SwitchboardMiddleware(client=client, builtins=["bash", "write_file"])
    agent = create_agent(ScriptedChat(), tools=[lookup], middleware=[mw])
    try:
        result = agent.invoke(ask([("lookup", {"key": "a"}),
                                   ("bash", {"command": "echo hi"}),
                                   ("lookup", {"key": "b"}),
                                   ("write_file", {"path": "x.txt", "content": "x"})],
                                  [("lookup", {"key": "c"})]), thread())
        msgs = tool_messages(result)
        assert [m.tool_call_id for m in msgs] == ["call_0_0", "call_0_1", "call_0_2",
                                                  "call_0_3", "call_1_0"]
        assert [m.name for m in msgs] == ["lookup", "bash", "lookup", "write_file", "lookup"]
        assert [msgs[0].content, msgs[1].content.strip(), msgs[2].content] == \
            ["value-of-a", "hi", "value-of-b"]
        assert all(m.status == "success" for m in msgs), msgs
        assert result["messages"][-1].content == "done"
        assert turns_of(mw) == 2          # two AI messages with calls: two turns, not five
    finally:
        mw.close()


def test_ainvoke_works_and_declared_serial_tools_run_in_call_order(client):
    serial = {"concurrency_safe": False}
    mw = SwitchboardMiddleware(client=client,
                               tool_options={"lookup": serial, "alookup": serial})
    agent = create_agent(ScriptedChat(), tools=[lookup, alookup], middleware=[mw])
    with order_lock:
        order.clear()
    calls = [("lookup", {"key": str(i)}) if i % 2 else ("alookup", {"key": str(i)})
             for i in range(6)]
    try:
        result = asyncio.run(agent.ainvoke(ask(calls), thread()))
        assert [m.tool_call_id for m in tool_messages(result)] == \
            [f"call_0_{i}" for i in range(6)]
        assert order == [f"{n}:{a['key']}" for n, a in calls]
        assert turns_of(mw) == 1
    finally:
        mw.close()


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_undeclared_tools_overlap_as_create_agent_runs_them(client, mode):
    meet = tool(shared.meeting(threading.Barrier(2, timeout=60)))
    mw = SwitchboardMiddleware(client=client)
    agent = create_agent(ScriptedChat(), tools=[meet], middleware=[mw])
    question = ask([("meet", {"who": "a"}), ("meet", {"who": "b"})])
    try:
        result = agent.invoke(question, thread()) if mode == "invoke" else \
            asyncio.run(agent.ainvoke(question, thread()))
        assert [m.content for m in tool_messages(result)] == ["met a", "met b"]
    finally:
        mw.close()


def test_independent_calls_are_not_slower_than_create_agent_alone(client):
    tools = sleepers(8, 0.2)
    calls = [(t.name, {"x": str(i)}) for i, t in enumerate(tools)]
    mw = SwitchboardMiddleware(client=client)
    ours = create_agent(ScriptedChat(), tools=tools, middleware=[mw])
    theirs = create_agent(ScriptedChat(), tools=tools)
    config = thread("sleepers")
    try:
        def run(agent: Any) -> Any:
            def once(r: int) -> None:
                msgs = tool_messages(agent.invoke(ask(calls, prefix=f"r{r + 1}"), config))
                assert [m.content for m in msgs] == [f"slept {i}" for i in range(8)]
            return once
        t_theirs, t_ours = shared.best_time(run(theirs)), shared.best_time(run(ours))
        print(f"\n8 x 0.2 s tools in one message: create_agent + SwitchboardMiddleware "
              f"{t_ours:.3f} s, create_agent alone {t_theirs:.3f} s, "
              f"ratio {t_ours / t_theirs:.2f}")
        assert t_ours < 2 * t_theirs, (t_ours, t_theirs)
    finally:
        mw.close()


def test_a_write_then_a_read_in_one_message_sees_the_write(client, tmp_path):
    """Conflicting calls run in call order: the built-ins by what they declare, the Python
    tools once the write declares it runs alone."""
    mw = SwitchboardMiddleware(client=client, builtins=["write_file", "read_file"],
                               tool_options={"write_note": {"concurrency_safe": False}})
    agent = create_agent(ScriptedChat(), tools=file_tools(), middleware=[mw])
    try:
        for i in range(10):
            note = shared.old_note(tmp_path, i)
            result = agent.invoke(ask([("write_file", {"path": f"w{i}.txt", "content": "old"})],
                                      [("write_file", {"path": f"w{i}.txt", "content": "new"}),
                                       ("read_file", {"path": f"w{i}.txt"}),
                                       ("write_note", {"path": note, "text": "new"}),
                                       ("read_note", {"path": note})]), thread(f"wr{i}"))
            msgs = tool_messages(result)
            assert "new" in msgs[2].content and "old" not in msgs[2].content, msgs[2]
            assert msgs[4].content == "new", msgs[4]
    finally:
        mw.close()


def test_a_replayed_message_is_answered_from_the_engines_memory(client):
    """The turn is named after the AI message: running the tools node again for the same
    message (a replay from a checkpoint) gets the stored answers; nothing runs twice."""
    runs: List[str] = []

    @tool
    def charge(amount: int) -> str:
        """Charges the card."""
        runs.append(f"charge:{amount}")
        return f"charged {amount} ({len(runs)})"

    mw = SwitchboardMiddleware(client=client)
    agent = create_agent(ScriptedChat(), tools=[charge], middleware=[mw],
                         checkpointer=InMemorySaver())
    config = thread("replay")
    try:
        first = tool_messages(agent.invoke(ask([("charge", {"amount": 5})]), config))
        before_tools = next(s for s in agent.get_state_history(config) if s.next == ("tools",))
        again = tool_messages(agent.invoke(None, before_tools.config))
        assert runs == ["charge:5"]
        assert [m.content for m in again] == [m.content for m in first] == ["charged 5 (1)"]
    finally:
        mw.close()


def test_a_model_that_reuses_call_ids_gets_fresh_answers(client):
    mw = SwitchboardMiddleware(client=client, builtins=["write_file", "read_file"])
    agent = create_agent(ReusingChat(), tools=[], middleware=[mw])
    path = f"reused-{uuid.uuid4().hex[:8]}.txt"
    try:
        result = agent.invoke(ask([("write_file", {"path": path, "content": "v1"})],
                                  [("read_file", {"path": path})],
                                  [("write_file", {"path": path, "content": "v2"})],
                                  [("read_file", {"path": path})]), thread("reuse"))
        reads = [m.content for m in tool_messages(result) if m.name == "read_file"]
        assert reads == ["v1", "v2"], reads
    finally:
        mw.close()


def test_a_raising_tool_is_an_error_result_unless_told_otherwise(client):
    mw = SwitchboardMiddleware(client=client)
    agent = create_agent(ScriptedChat(), tools=[boom, lookup], middleware=[mw])
    try:
        result = agent.invoke(ask([("boom", {"reason": "bad"}), ("lookup", {"key": "k"})],
                                  [("lookup", {"key": "again"})]), thread())
        msgs = tool_messages(result)
        assert msgs[0].status == "error" and "boom: bad" in msgs[0].content
        assert "execution_error" in msgs[0].content
        assert [msgs[1].content, msgs[2].content] == ["value-of-k", "value-of-again"]
    finally:
        mw.close()
    strict = SwitchboardMiddleware(client=client, handle_tool_errors=False)
    agent = create_agent(ScriptedChat(), tools=[boom], middleware=[strict])
    try:
        with pytest.raises(ValueError, match="boom: x"):      # as create_agent alone raises
            agent.invoke(ask([("boom", {"reason": "x"})]), thread())
    finally:
        strict.close()


def test_invalid_arguments_and_unknown_tools_are_error_results(client):
    mw = SwitchboardMiddleware(client=client)
    agent = create_agent(ScriptedChat(), tools=[lookup], middleware=[mw])
    try:
        result = agent.invoke(ask([("lookup", {"key": 5}), ("no_such_tool", {}),
                                   ("bash", {"command": "echo no"}),
                                   ("lookup", {"key": "ok"})]), thread())
        msgs = tool_messages(result)
        assert msgs[0].status == "error" and "invalid_arguments" in msgs[0].content
        assert msgs[1].status == "error" and "no_such_tool" in msgs[1].content
        assert msgs[2].status == "error" and "echo no" not in msgs[2].content
        assert msgs[3].content == "value-of-ok"
    finally:
        mw.close()


def test_state_injection_and_command_through_create_agent(client):
    from typing import Annotated

    from langchain.tools import InjectedState, InjectedToolCallId, ToolRuntime
    from langgraph.types import Command

    @tool
    def count_messages(label: str, state: Annotated[dict, InjectedState]) -> str:
        """Counts the conversation's messages."""
        return f"{label}: {len(state['messages'])}"

    @tool
    def whoami(runtime: ToolRuntime) -> str:
        """Says its call id."""
        return f"I am {runtime.tool_call_id}"

    @tool
    def remember(note: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Adds a note to the conversation."""
        return Command(update={"messages": [
            ToolMessage(f"noted {note}", tool_call_id=tool_call_id, name="remember")]})

    mw = SwitchboardMiddleware(client=client)
    agent = create_agent(ScriptedChat(), tools=[count_messages, whoami, remember],
                         middleware=[mw])
    try:
        result = agent.invoke(ask([("count_messages", {"label": "n"}), ("whoami", {}),
                                   ("remember", {"note": "x"})]), thread())
        msgs = {m.tool_call_id: m.content for m in tool_messages(result)}
        assert msgs == {"call_0_0": "n: 2", "call_0_1": "I am call_0_1",
                        "call_0_2": "noted x"}
    finally:
        mw.close()


def test_an_interrupt_pauses_and_resumes_like_create_agent(client):
    from langgraph.types import Command, interrupt

    runs: List[str] = []

    @tool
    def confirm(question: str) -> str:
        """Asks the human."""
        runs.append("confirm")
        return f"human said {interrupt(question)}"

    @tool
    def side_effect(k: str) -> str:
        """Does something once."""
        runs.append(f"side:{k}")
        return "done"

    mw = SwitchboardMiddleware(client=client)
    agent = create_agent(ScriptedChat(), tools=[confirm, side_effect], middleware=[mw],
                         checkpointer=InMemorySaver())
    config = thread("interrupt")
    try:
        paused = agent.invoke(ask([("side_effect", {"k": "1"}), ("confirm", {"question": "ok?"})],
                                  [("side_effect", {"k": "2"})]), config)
        assert [i.value for i in paused["__interrupt__"]] == ["ok?"]
        result = agent.invoke(Command(resume="yes"), config)
        msgs = {m.tool_call_id: m.content for m in tool_messages(result)}
        assert msgs == {"call_0_0": "done", "call_0_1": "human said yes", "call_1_0": "done"}
        assert runs == ["side:1", "confirm", "confirm", "side:2"]
    finally:
        mw.close()


def test_middleware_after_it_wraps_each_tool_run(client):
    """A middleware listed after SwitchboardMiddleware wraps the tool itself (the handler the
    engine's call runs through), once per call."""
    seen: List[str] = []

    class Record(AgentMiddleware):
        def wrap_tool_call(self, request, handler):
            seen.append(request.tool_call["id"])
            return handler(request)

    mw = SwitchboardMiddleware(client=client, builtins=["bash"])
    agent = create_agent(ScriptedChat(), tools=[lookup], middleware=[mw, Record()])
    try:
        agent.invoke(ask([("lookup", {"key": "a"}), ("bash", {"command": "true"}),
                          ("lookup", {"key": "b"})]), thread())
        assert sorted(seen) == ["call_0_0", "call_0_2"]     # the engine ran bash itself
    finally:
        mw.close()


def test_a_retry_by_middleware_before_it_gets_the_stored_answer(client):
    """A middleware listed before SwitchboardMiddleware that calls it again for the same call
    (a retry) gets the engine's stored answer: the call ran once."""
    runs: List[str] = []

    @tool
    def charge(amount: int) -> str:
        """Charges the card."""
        runs.append(f"charge:{amount}")
        return f"charged {amount} ({len(runs)})"

    class CallTwice(AgentMiddleware):
        def wrap_tool_call(self, request, handler):
            first = handler(request)
            second = handler(request)
            assert second.content == first.content, (first, second)
            return second

    mw = SwitchboardMiddleware(client=client)
    agent = create_agent(ScriptedChat(), tools=[charge], middleware=[CallTwice(), mw])
    try:
        msgs = tool_messages(agent.invoke(ask([("charge", {"amount": 7})]), thread()))
        assert [m.content for m in msgs] == ["charged 7 (1)"]
        assert runs == ["charge:7"]
    finally:
        mw.close()


def test_cancelling_the_run_cancels_the_turn_and_kills_its_process(client):
    mw = SwitchboardMiddleware(client=client, builtins=["bash"])
    agent = create_agent(ScriptedChat(), tools=[], middleware=[mw])
    try:
        asyncio.run(shared.cancel_once_started(
            agent.ainvoke(ask([("bash", {"command": "touch started && sleep 300"})]),
                          thread("cancel")),
            lambda: mw.sessions[0] if mw.sessions else None))
        shared.wait_until_idle(sb_langgraph._LoopThread.get(), mw.sessions[0])
    finally:
        mw.close()


def test_a_local_client_serves_the_middleware():
    with switchboard_client.local(binary=binary()) as client:
        mw = SwitchboardMiddleware(client=client, builtins=["bash"])
        agent = create_agent(ScriptedChat(), tools=[lookup], middleware=[mw])
        try:
            msgs = tool_messages(agent.invoke(ask([("bash", {"command": "echo local"}),
                                                   ("lookup", {"key": "l"})]), thread()))
            assert [m.content.strip() for m in msgs] == ["local", "value-of-l"]
        finally:
            mw.close()
    assert client.server.returncode == 0, client.server.stderr()


def test_builtin_tools_given_to_the_agent_run_in_the_engine(client):
    mw = SwitchboardMiddleware(client=client)
    agent = create_agent(ScriptedChat(), tools=builtin_tools(["bash"]), middleware=[mw])
    try:
        msgs = tool_messages(agent.invoke(ask([("bash", {"command": "echo $0"})]), thread()))
        assert msgs[0].content.strip() == "bash"
    finally:
        mw.close()
