"""The LangGraph adapter against the real langgraph/langchain-core and the real server.

The model is scripted (no network): its human message says which tool calls each model turn
makes. The write-then-read figures print with ``-s``:

    SWITCHBOARD_BIN=target/release/switchboard python -m pytest -q -s \
        clients/python/tests/test_langgraph.py -k write_then_read
"""

import asyncio
import json
import threading
import time
import uuid
from typing import Any, Callable, List

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_core")

from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import StructuredTool, tool  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode as LangGraphToolNode  # noqa: E402
from langgraph.prebuilt import create_react_agent, tools_condition  # noqa: E402

import switchboard_client  # noqa: E402
from switchboard_client import langgraph as sb_langgraph  # noqa: E402
from switchboard_client.langgraph import ToolNode, builtin_tools  # noqa: E402

import _adapters as shared  # noqa: E402
from _adapters import order, order_lock  # noqa: E402
from conftest import binary  # noqa: E402

TRIALS = 50
# create_react_agent is deprecated in favour of langchain's create_agent: both are tested (the
# latter, with SwitchboardMiddleware, in test_create_agent.py).
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")


class ScriptedChat(BaseChatModel):
    """Its human message is JSON: a list of model turns, each a list of [name, args] calls.
    Turn k is answered when the conversation holds k AI messages; after the last, "done".
    Call i of turn k has the id ``{prefix}_{k}_{i}``, the prefix the human message's name
    (``call`` if it has none): a session answers a tool_use_id it has seen from its answers, so
    a conversation sent to a session that already ran another names its own prefix. The prefix
    ``no-ids`` sends the calls without ids."""

    bound: List[str] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedChat":
        return self.model_copy(update={"bound": [getattr(t, "name", None) for t in tools]})

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        human = next(m for m in messages if isinstance(m, HumanMessage))
        turns = json.loads(human.content)
        prefix = human.name or "call"
        k = sum(1 for m in messages if isinstance(m, AIMessage))
        if k < len(turns):
            calls = [{"name": n, "args": a, "type": "tool_call",
                      "id": None if prefix == "no-ids" else f"{prefix}_{k}_{i}"}
                     for i, (n, a) in enumerate(turns[k])]
            message = AIMessage(content="", tool_calls=calls)
        else:
            message = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=message)])


def ask(*turns: Any, prefix: Any = None) -> dict:
    """The conversation's input; ``prefix`` names its calls' ids (``ScriptedChat``)."""
    return {"messages": [HumanMessage(json.dumps([list(map(list, t)) for t in turns]),
                                      name=prefix)]}


def tool_messages(result: dict) -> List[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def last_turn(result: dict) -> List[ToolMessage]:
    """The ToolMessages answering the last AI message that had tool calls."""
    messages = result["messages"]
    ai = [i for i, m in enumerate(messages) if isinstance(m, AIMessage) and m.tool_calls][-1]
    return [m for m in messages[ai + 1:] if isinstance(m, ToolMessage)]


def thread(name: str = "t") -> dict:
    return {"configurable": {"thread_id": f"{name}-{uuid.uuid4().hex[:8]}"}}


@pytest.fixture()
def client(server, token):
    yield from shared.adapter_client(server, token, sb_langgraph._LoopThread)


# ---- tools --------------------------------------------------------------------------------

lookup = tool(shared.lookup)


@tool
def boom(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"boom: {reason}")


alookup = tool(shared.alookup)


def file_tools(slow_write_s: float = 0.02):
    """A write tool that sleeps a little before writing (realistic I/O) and a read tool."""

    @tool
    def write_note(path: str, text: str) -> str:
        """Writes text to a file."""
        time.sleep(slow_write_s)
        with open(path, "w") as f:
            f.write(text)
        return f"wrote {path}"

    return [write_note, tool(shared.read_note)]


def hand_built(model: Any, node: Any):
    tools = list(node.tools_by_name.values())
    bound = model.bind_tools(tools)

    def agent(state: MessagesState):
        return {"messages": [bound.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


# ---- tests --------------------------------------------------------------------------------

def test_builtin_tools_match_the_servers_catalog(server, token):
    live = shared.live_catalog(server, token)
    for t in builtin_tools():
        assert t.name in live
        assert t.description == live[t.name]["description"]
        assert t.args_schema == live[t.name]["input_schema"]
    with pytest.raises(NotImplementedError):
        builtin_tools(["bash"])[0].invoke({"command": "true"})


def test_hand_built_graph_client_tool_mixed_with_builtins(client):
    node = ToolNode([lookup, alookup], client=client, builtins=["bash", "write_file"])
    graph = hand_built(ScriptedChat(), node)
    try:
        result = graph.invoke(ask([("lookup", {"key": "a"}),
                                   ("bash", {"command": "echo hi"}),
                                   ("alookup", {"key": "b"}),
                                   ("write_file", {"path": "x.txt", "content": "x"})]),
                              thread())
        msgs = tool_messages(result)
        assert [m.tool_call_id for m in msgs] == ["call_0_0", "call_0_1", "call_0_2", "call_0_3"]
        assert [m.name for m in msgs] == ["lookup", "bash", "alookup", "write_file"]
        assert msgs[0].content == "value-of-a"
        assert msgs[1].content.strip() == "hi"
        assert msgs[2].content == "async-b"
        assert all(m.status == "success" for m in msgs), msgs
        assert result["messages"][-1].content == "done"
    finally:
        node.close()


def test_tools_declared_not_concurrency_safe_run_alone_in_call_order(client):
    serial = {"concurrency_safe": False}
    node = ToolNode([lookup, alookup], client=client,
                    tool_options={"lookup": serial, "alookup": serial})
    graph = create_react_agent(ScriptedChat(), tools=node)
    try:
        with order_lock:
            order.clear()
        calls = [("lookup", {"key": str(i)}) if i % 2 else ("alookup", {"key": str(i)})
                 for i in range(6)]
        result = graph.invoke(ask(calls), thread())
        msgs = tool_messages(result)
        assert [m.tool_call_id for m in msgs] == [f"call_0_{i}" for i in range(6)]
        # Declared not concurrency-safe: they run alone, one after another, in call order.
        assert order == [f"{n}:{a['key']}" for n, a in calls]
    finally:
        node.close()


@pytest.mark.parametrize("options", [None, {"meet": {"concurrency_safe": True}}],
                         ids=["undeclared", "declared"])
def test_undeclared_and_concurrency_safe_tools_overlap(client, options):
    """A LangChain tool that declares nothing overlaps with its turn's other calls, as
    LangGraph's own ToolNode runs it (the barrier only opens for two calls at once)."""
    meet = tool(shared.meeting(threading.Barrier(2, timeout=60)))
    node = ToolNode([meet], client=client, tool_options=options)
    graph = create_react_agent(ScriptedChat(), tools=node)
    try:
        result = graph.invoke(ask([("meet", {"who": "a"}), ("meet", {"who": "b"})]), thread())
        assert [m.content for m in tool_messages(result)] == ["met a", "met b"]
    finally:
        node.close()


def sleepers(n: int, seconds: float) -> List[Any]:
    """``n`` independent LangChain tools, each sleeping ``seconds`` (I/O a tool waits for)."""
    def body(x: str) -> str:
        time.sleep(seconds)
        return f"slept {x}"
    return [StructuredTool.from_function(body, name=f"sleep_{i}", description="Sleeps.")
            for i in range(n)]


def test_independent_calls_are_not_slower_than_langgraphs_own_toolnode(client):
    """8 tools that each sleep 0.2 s in one AI message, undeclared: the drop-in runs them as
    LangGraph does (at once), so the turn takes about what LangGraph's own ToolNode takes —
    asserted as a ratio measured in the same test, not as a time."""
    tools = sleepers(8, 0.2)
    calls = [(t.name, {"x": str(i)}) for i, t in enumerate(tools)]
    ours_node = ToolNode(tools, client=client)
    ours = create_react_agent(ScriptedChat(), tools=ours_node)
    theirs = create_react_agent(ScriptedChat(), tools=LangGraphToolNode(tools))
    config = thread("sleepers")
    try:
        def run(graph: Any) -> Callable[[int], Any]:
            def once(r: int) -> None:
                msgs = tool_messages(graph.invoke(ask(calls, prefix=f"r{r + 1}"), config))
                assert [m.content for m in msgs] == [f"slept {i}" for i in range(8)]
            return once
        t_theirs, t_ours = shared.best_time(run(theirs)), shared.best_time(run(ours))
        print(f"\n8 x 0.2 s tools in one message: switchboard ToolNode {t_ours:.3f} s, "
              f"LangGraph's ToolNode {t_theirs:.3f} s, ratio {t_ours / t_theirs:.2f}")
        assert t_ours < 2 * t_theirs, (t_ours, t_theirs)
    finally:
        ours_node.close()


def test_tool_options_defer_is_forwarded_and_checked(client):
    session = client.session()
    node = ToolNode([lookup], client=client, session=session,
                    tool_options={"lookup": {"defer": "always"}})
    graph = create_react_agent(ScriptedChat(), tools=node)
    loop = sb_langgraph._LoopThread.get()
    try:
        msgs = tool_messages(graph.invoke(ask([("lookup", {"key": "d"})]), thread()))
        assert msgs[0].content == "value-of-d"      # a deferred tool called by name runs
        catalog = {t["name"]: t for t in loop.run(session.tools())}
        assert catalog["lookup"]["defer_loading"] is True
    finally:
        node.close()
        loop.run(session.close())
    with pytest.raises(ValueError, match="'lookup'.*'never', 'auto' or 'always'"):
        ToolNode([lookup], client=client, tool_options={"lookup": {"defer": "yes"}})


def test_prebuilt_agent_binds_the_builtins_and_client_tools(client):
    model = ScriptedChat()
    node = ToolNode([lookup], client=client, builtins=True)
    assert set(node.tools_by_name) == {"lookup", "bash", "read_file", "write_file",
                                       "edit_file", "glob"}
    graph = create_react_agent(model, tools=node)
    try:
        result = graph.invoke(ask([("glob", {"pattern": "*"}), ("lookup", {"key": "z"})]),
                              thread())
        msgs = tool_messages(result)
        assert [m.name for m in msgs] == ["glob", "lookup"]
        assert msgs[1].content == "value-of-z"
    finally:
        node.close()


def test_a_raising_tool_is_an_error_result_and_the_loop_goes_on(client):
    node = ToolNode([lookup, boom], client=client)
    graph = create_react_agent(ScriptedChat(), tools=node)
    try:
        result = graph.invoke(ask([("boom", {"reason": "bad"}), ("lookup", {"key": "k"})],
                                  [("lookup", {"key": "again"})]), thread())
        msgs = tool_messages(result)
        assert msgs[0].status == "error" and "boom: bad" in msgs[0].content
        assert msgs[1].status == "success" and msgs[1].content == "value-of-k"
        assert msgs[2].content == "value-of-again"
        assert result["messages"][-1].content == "done"
    finally:
        node.close()


def test_invalid_arguments_are_the_engines_error_result(client):
    node = ToolNode([lookup], client=client)
    graph = create_react_agent(ScriptedChat(), tools=node)
    try:
        result = graph.invoke(ask([("lookup", {"key": 5}), ("lookup", {"key": "ok"})]), thread())
        msgs = tool_messages(result)
        assert msgs[0].status == "error" and "invalid_arguments" in msgs[0].content, msgs[0]
        assert msgs[1].content == "value-of-ok"
    finally:
        node.close()


def test_an_unknown_tool_is_an_error_result_not_a_crash(client):
    node = ToolNode([lookup], client=client)          # no built-ins enabled
    for graph in (create_react_agent(ScriptedChat(), tools=node),
                  hand_built(ScriptedChat(), node)):
        result = graph.invoke(ask([("no_such_tool", {}), ("bash", {"command": "echo no"}),
                                   ("lookup", {"key": "k"})]), thread())
        msgs = tool_messages(result)
        assert [m.tool_call_id for m in msgs] == ["call_0_0", "call_0_1", "call_0_2"]
        assert msgs[0].status == "error" and "no_such_tool" in msgs[0].content
        assert msgs[1].status == "error" and "bash" in msgs[1].content
        assert "echo no" not in msgs[1].content
        assert msgs[2].content == "value-of-k"
        assert result["messages"][-1].content == "done"
    node.close()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_state_injection_command_and_both_agent_versions(client, version):
    from typing import Annotated

    from langchain_core.tools import InjectedToolCallId
    from langgraph.prebuilt import InjectedState
    from langgraph.types import Command

    @tool
    def count_messages(label: str, state: Annotated[dict, InjectedState]) -> str:
        """Counts the conversation's messages."""
        return f"{label}: {len(state['messages'])}"

    @tool
    def remember(note: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Adds a note to the conversation."""
        return Command(update={"messages": [
            ToolMessage(f"noted {note}", tool_call_id=tool_call_id, name="remember")]})

    node = ToolNode([count_messages, remember, lookup], client=client)
    assert "state" not in json.dumps(sb_langgraph.convert_to_openai_tool(count_messages))
    graph = create_react_agent(ScriptedChat(), tools=node, version=version)
    try:
        result = graph.invoke(ask([("count_messages", {"label": "n"}),
                                   ("remember", {"note": "x"}),
                                   ("lookup", {"key": "k"})]), thread())
        msgs = {m.tool_call_id: m for m in tool_messages(result)}
        assert msgs["call_0_0"].content == "n: 2"           # the human and the AI message
        assert msgs["call_0_1"].content == "noted x"
        assert msgs["call_0_2"].content == "value-of-k"
        assert result["messages"][-1].content == "done"
    finally:
        node.close()


def test_an_interrupt_in_a_tool_pauses_and_resumes_like_langgraph(client):
    from langgraph.checkpoint.memory import InMemorySaver
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

    node = ToolNode([confirm, side_effect], client=client)
    graph = create_react_agent(ScriptedChat(), tools=node, checkpointer=InMemorySaver())
    config = thread("interrupt")
    try:
        paused = graph.invoke(ask([("side_effect", {"k": "1"}), ("confirm", {"question": "ok?"})],
                                  [("side_effect", {"k": "2"})]), config)
        assert [i.value for i in paused["__interrupt__"]] == ["ok?"]
        result = graph.invoke(Command(resume="yes"), config)
        msgs = {m.tool_call_id: m.content for m in tool_messages(result)}
        assert msgs == {"call_0_0": "done", "call_0_1": "human said yes", "call_1_0": "done"}
        # As with LangGraph's ToolNode: on resume only the interrupted call runs again.
        assert runs == ["side:1", "confirm", "confirm", "side:2"]
    finally:
        node.close()


def test_one_session_per_thread(client):
    node = ToolNode([], client=client, builtins=True)
    graph = create_react_agent(ScriptedChat(), tools=node)
    try:
        a, b = thread("a"), thread("b")
        graph.invoke(ask([("write_file", {"path": "mine.txt", "content": "A's"})]), a)
        seen_a = tool_messages(graph.invoke(ask([("read_file", {"path": "mine.txt"})],
                                                prefix="again"), a))
        seen_b = tool_messages(graph.invoke(ask([("read_file", {"path": "mine.txt"})]), b))
        assert seen_a[0].status == "success" and "A's" in seen_a[0].content
        assert seen_b[0].status == "error"
        assert len(node._conversations) == 2
    finally:
        node.close()


def test_a_session_the_server_closed_is_replaced(server, token, client):
    node = ToolNode([lookup], client=client, builtins=["bash"])
    graph = create_react_agent(ScriptedChat(), tools=node)
    config = thread("gone")
    try:
        graph.invoke(ask([("bash", {"command": "true"})]), config)
        first = node._conversations[config["configurable"]["thread_id"]].session
        shared.delete_on_the_server(server, token, first.id)   # as the idle timeout would
        msgs = tool_messages(graph.invoke(ask([("lookup", {"key": "k"})]), config))
        assert msgs[0].content == "value-of-k"
        assert node._conversations[config["configurable"]["thread_id"]].session is not first
    finally:
        node.close()


def test_a_given_session_serves_every_thread(client):
    session = client.session()
    node = ToolNode([lookup], client=client, session=session, builtins=True)
    graph = create_react_agent(ScriptedChat(), tools=node)
    graph.invoke(ask([("write_file", {"path": "shared.txt", "content": "one"})]), thread("x"))
    msgs = tool_messages(graph.invoke(ask([("read_file", {"path": "shared.txt"}),
                                           ("lookup", {"key": "y"})], prefix="y"), thread("y")))
    assert "one" in msgs[0].content and msgs[1].content == "value-of-y"
    node.close()                       # a given session is the caller's to close
    sb_langgraph._LoopThread.get().run(session.close())


def test_ainvoke_and_no_thread_id_share_the_nodes_session(server, token, monkeypatch):
    monkeypatch.setenv("SWITCHBOARD_URL", server.base_url)
    monkeypatch.setenv("SWITCHBOARD_TOKEN", token)
    node = ToolNode([alookup], builtins=["write_file", "read_file"])   # client from the env
    graph = create_react_agent(ScriptedChat(), tools=node)

    async def main():
        await graph.ainvoke(ask([("write_file", {"path": "n.txt", "content": "node"})]))
        return await graph.ainvoke(ask([("read_file", {"path": "n.txt"}),
                                        ("alookup", {"key": "q"})], prefix="second"))
    try:
        msgs = tool_messages(asyncio.run(main()))     # a loop of its own, then another one
        assert "node" in msgs[0].content and msgs[1].content == "async-q"
        msgs = tool_messages(asyncio.run(graph.ainvoke(ask([("read_file", {"path": "n.txt"})],
                                                           prefix="third"))))
        assert "node" in msgs[0].content
        assert list(node._conversations) == [None]
    finally:
        node.close()


def test_handle_tool_errors_false_raises_like_langgraph(client):
    node = ToolNode([boom], client=client, handle_tool_errors=False)
    graph = create_react_agent(ScriptedChat(), tools=node)
    try:
        with pytest.raises(ValueError, match="boom: x"):
            graph.invoke(ask([("boom", {"reason": "x"})]), thread())
    finally:
        node.close()


def test_cancelling_the_run_cancels_the_turn_and_kills_its_process(client):
    node = ToolNode(builtin_tools(["bash"]), client=client)
    graph = create_react_agent(ScriptedChat(), tools=node)
    config = thread("cancel")
    key = config["configurable"]["thread_id"]

    def session_of():
        conv = node._conversations.get(key)
        return conv.session if conv is not None else None

    try:
        asyncio.run(shared.cancel_once_started(
            graph.ainvoke(ask([("bash", {"command": "touch started && sleep 300"})]), config),
            session_of))
        session = node._conversations[key].session
        shared.wait_until_idle(node._loop, session)
    finally:
        node.close()


# ---- write then read ----------------------------------------------------------------------

def _count_fresh(graph: Any, make_turns: Any, read_index: int, trials: int = TRIALS) -> int:
    fresh = 0
    for i in range(trials):
        result = graph.invoke(ask(*make_turns(i)), thread(f"wr{i}"))
        got = last_turn(result)[read_index]
        assert got.status == "success", got
        fresh += "new" in got.content and "old" not in got.content
    return fresh


def test_write_then_read_builtins_through_the_adapter(client):
    node = ToolNode(builtin_tools(), client=client)
    graph = create_react_agent(ScriptedChat(), tools=node)
    try:
        def turns(i):
            p = f"wr{i}.txt"
            return ([("write_file", {"path": p, "content": "old"})],
                    [("write_file", {"path": p, "content": "new"}), ("read_file", {"path": p})])
        fresh = _count_fresh(graph, turns, 1)
        print(f"\nwrite-then-read, built-ins through switchboard ToolNode: "
              f"{fresh}/{TRIALS} reads saw the write")
        assert fresh == TRIALS
    finally:
        node.close()


def _python_file_turns(tmp_path):
    def turns(i):
        p = shared.old_note(tmp_path, i)
        return ([("write_note", {"path": p, "text": "new"}), ("read_note", {"path": p})],)
    return turns


# The write declares that it may not overlap (a tool that declares nothing overlaps, as in
# LangGraph): the read after it waits for it.
WRITE_RUNS_ALONE = {"write_note": {"concurrency_safe": False}}


def test_write_then_read_client_tools_through_the_adapter(client, tmp_path):
    node = ToolNode(file_tools(), client=client, tool_options=WRITE_RUNS_ALONE)
    graph = create_react_agent(ScriptedChat(), tools=node)
    try:
        fresh = _count_fresh(graph, _python_file_turns(tmp_path), 1)
        print(f"\nwrite-then-read, Python tools through switchboard ToolNode: "
              f"{fresh}/{TRIALS} reads saw the write")
        assert fresh == TRIALS
    finally:
        node.close()


def test_write_then_read_through_langgraphs_own_toolnode(tmp_path):
    """The peer: LangGraph's own ToolNode with the same Python tools. Reported, and only
    "at least one read was stale" is asserted."""
    graph = create_react_agent(ScriptedChat(), tools=LangGraphToolNode(file_tools()))
    fresh = _count_fresh(graph, _python_file_turns(tmp_path), 1)
    print(f"\nwrite-then-read, Python tools through LangGraph's own ToolNode: "
          f"{fresh}/{TRIALS} reads saw the write")
    assert fresh < TRIALS


def test_calls_without_ids_are_not_answered_from_an_earlier_turn(client):
    """A call the model sent without an id gets one unique in the session: two turns of one
    thread, each with an id-less call, both run (a per-turn counter would make the second turn's
    call an already-answered id of the first)."""
    node = ToolNode([lookup], client=client, builtins=["bash"])
    graph = hand_built(ScriptedChat(), node)
    try:
        result = graph.invoke(ask([("bash", {"command": "echo run0"})],
                                  [("bash", {"command": "echo run1"})], prefix="no-ids"),
                              thread())
        msgs = tool_messages(result)
        assert [m.content.strip() for m in msgs] == ["run0", "run1"]
        assert all(m.status == "success" for m in msgs), msgs
        assert len({m.tool_call_id for m in msgs}) == 2
    finally:
        node.close()


class ReusingChat(ScriptedChat):
    """Like ``ScriptedChat``, but every turn's calls are ``call_0``, ``call_1``, … — as some
    OpenAI-compatible servers number them in every response."""

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        result = super()._generate(messages, stop, run_manager, **kwargs)
        message = result.generations[0].message
        for i, call in enumerate(message.tool_calls):
            call["id"] = f"call_{i}"
        return result


def test_a_model_that_reuses_call_ids_gets_fresh_answers(client):
    node = ToolNode(builtin_tools(), client=client)
    graph = create_react_agent(ReusingChat(), tools=node)
    path = f"reused-{uuid.uuid4().hex[:8]}.txt"
    try:
        result = graph.invoke(
            ask([("write_file", {"path": path, "content": "v1"})],
                [("read_file", {"path": path})],
                [("write_file", {"path": path, "content": "v2"})],
                [("read_file", {"path": path})]),
            {"configurable": {"thread_id": f"reuse-{uuid.uuid4().hex[:8]}"}})
        reads = [m.content for m in tool_messages(result) if m.name == "read_file"]
        # The same id and the same arguments in two AI messages are two calls: the second read
        # sees the second write, not the first read's stored answer.
        assert reads == ["v1", "v2"], reads
    finally:
        node.close()



def test_a_replayed_message_is_answered_from_the_engines_memory(client):
    """The turn is named after the AI message, also when LangGraph resumes the graph: running
    the tools node again for the same message (a replay from a checkpoint) gets the stored
    answers; nothing runs twice."""
    from langgraph.checkpoint.memory import InMemorySaver

    runs: List[str] = []

    @tool
    def charge(amount: int) -> str:
        """Charges the card."""
        runs.append(f"charge:{amount}")
        return f"charged {amount} ({len(runs)})"

    node = ToolNode([charge], client=client)
    graph = create_react_agent(ScriptedChat(), tools=node, checkpointer=InMemorySaver())
    config = thread("replay")
    try:
        first = tool_messages(graph.invoke(ask([("charge", {"amount": 5})]), config))
        before_tools = next(s for s in graph.get_state_history(config) if s.next == ("tools",))
        again = tool_messages(graph.invoke(None, before_tools.config))
        assert runs == ["charge:5"]
        assert [m.content for m in again] == [m.content for m in first] == ["charged 5 (1)"]
    finally:
        node.close()

# ---- local() ------------------------------------------------------------------------------

def test_a_local_client_serves_the_node_and_stays_the_callers():
    """``local()`` (a synchronous ``Client``) is accepted; the node opens its own connections to
    its server, and closing the client stops the server."""
    with switchboard_client.local(binary=binary()) as client:
        node = ToolNode([lookup], client=client, builtins=["bash"])
        graph = create_react_agent(ScriptedChat(), tools=node)
        try:
            msgs = tool_messages(graph.invoke(ask([("bash", {"command": "echo local"}),
                                                   ("lookup", {"key": "l"})]), thread()))
            assert [m.content.strip() for m in msgs] == ["local", "value-of-l"]
            assert client.health()["status"] == "ok"     # the client itself still works
        finally:
            node.close()
    assert client.server.returncode == 0, client.server.stderr()


def test_a_local_async_client_serves_the_node_and_closes_on_its_own_loop():
    async def main() -> List[str]:
        client = await switchboard_client.local_async(binary=binary())
        node = ToolNode([alookup], client=client, builtins=["bash"])
        graph = create_react_agent(ScriptedChat(), tools=node)
        try:
            result = await graph.ainvoke(ask([("bash", {"command": "echo async"}),
                                              ("alookup", {"key": "a"})]), thread())
            return [m.content.strip() for m in tool_messages(result)]
        finally:
            await node.aclose()
            await client.close()      # on this loop: the node never used the client's pool
            assert client.server.returncode == 0, client.server.stderr()
    assert asyncio.run(main()) == ["async", "async-a"]


def test_a_running_command_s_lines_reach_langgraph_s_custom_stream(client):
    """A 4-second bash loop printing a line every 200 ms: its output comes through LangGraph's
    custom stream (``stream_mode="custom"``) line by line, before the tool's message, under the
    call id LangGraph knows; sync ``stream`` and async ``astream`` alike."""
    loop = "for i in $(seq 1 20); do echo line $i; sleep 0.2; done"
    node = ToolNode([lookup], client=client, builtins=["bash"])
    graph = hand_built(ScriptedChat(), node)
    expected = "".join(f"line {i}\n" for i in range(1, 21))
    try:
        chunks = list(graph.stream(ask([("bash", {"command": loop})], prefix="sync"), thread(),
                                   stream_mode=["custom", "updates"]))
        progress = [c for mode, c in chunks if mode == "custom"]
        assert len(progress) >= 15, chunks
        assert all(c["event"] == "progress" and c["tool_use_id"] == "sync_0_0"
                   for c in progress), progress
        assert [c["seq"] for c in progress] == list(range(1, len(progress) + 1))
        assert "".join(c["text"] for c in progress) == expected
        # Every progress chunk came before the tools node's update (its ToolMessage).
        tools_update = next(i for i, (mode, c) in enumerate(chunks)
                            if mode == "updates" and "tools" in c)
        last_progress = max(i for i, (mode, _) in enumerate(chunks) if mode == "custom")
        assert last_progress < tools_update
        message = chunks[tools_update][1]["tools"]["messages"][0]
        assert message.content.strip().endswith("line 20")

        async def astream():
            out = []
            async for mode, c in graph.astream(ask([("bash", {"command": loop})],
                                                   prefix="async"),
                                               thread(), stream_mode=["custom", "updates"]):
                out.append((mode, c))
            return out

        chunks = asyncio.run(astream())
        progress = [c for mode, c in chunks if mode == "custom"]
        assert len(progress) >= 15, chunks
        assert "".join(c["text"] for c in progress) == expected
        assert {c["tool_use_id"] for c in progress} == {"async_0_0"}
    finally:
        node.close()
