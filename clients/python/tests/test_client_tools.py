"""Client tools: the platform's own Python functions, declared with the session and run by the
client when the server hands their calls over on the turn's stream."""

import asyncio
import enum
import json
import threading
from typing import List, Literal, Optional

import pytest

from switchboard_client import AsyncClient, Client, SwitchboardError, ToolError, tool_spec


def tool_use(id, name, input):
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def contents(answer):
    return [b["content"] for b in answer["content"]]


def test_decorator_register_and_builtins_answer_in_call_order(server, token):
    seen = []
    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool
        def lookup(key: str, upper: bool = False) -> str:
            """Looks a key up in the platform's store."""
            seen.append(("lookup", key))
            value = {"alpha": "one", "beta": "two"}[key]
            return value.upper() if upper else value

        def add(a: int, b: int) -> dict:
            seen.append(("add", a, b))
            return {"sum": a + b}

        session.register(add, description="Adds two integers.")

        @session.tool(name="boom", concurrency_safe=True, timeout_ms=5000, output_cap=1000)
        def explode(what: str) -> str:
            raise ValueError(f"no {what}")

        @session.tool
        def nothing() -> None:
            """Returns nothing."""

        msg = assistant(
            tool_use("t1", "lookup", {"key": "alpha", "upper": True}),
            tool_use("t2", "bash", {"command": "echo built-in"}),
            tool_use("t3", "add", {"a": 2, "b": 3}),
            tool_use("t4", "write_file", {"path": "f.txt", "content": "file"}),
            tool_use("t5", "boom", {"what": "way"}),
            tool_use("t6", "lookup", {"key": 5}),  # invalid: never reaches the function
            tool_use("t7", "read_file", {"path": "f.txt"}),
            tool_use("t8", "nothing", {}),
            tool_use("t9", "add", {"a": 1}),  # invalid: b is required
        )
        answer = session.dispatch(msg)
        blocks = answer["content"]
        assert [b["tool_use_id"] for b in blocks] == [f"t{i}" for i in range(1, 10)]
        assert blocks[0]["content"] == "ONE" and "is_error" not in blocks[0]
        assert blocks[1]["content"] == "built-in"
        assert json.loads(blocks[2]["content"]) == {"sum": 5}
        assert blocks[4]["is_error"] is True
        assert "ValueError: no way" in blocks[4]["content"]
        assert blocks[4]["content"].startswith("Error [execution_error]")
        assert blocks[5]["is_error"] is True
        assert blocks[5]["content"].startswith("Error [invalid_arguments]")
        assert blocks[6]["content"] == "file"
        assert blocks[7]["content"] == "" and "is_error" not in blocks[7]
        assert blocks[8]["content"].startswith("Error [invalid_arguments]")
        assert sorted(seen) == [("add", 2, 3), ("lookup", "alpha")]

        catalog = {t["name"]: t for t in session.tools()}
        assert {"bash", "read_file", "lookup", "add", "boom", "nothing"} <= set(catalog)
        assert catalog["lookup"]["description"] == "Looks a key up in the platform's store."
        assert catalog["lookup"]["input_schema"]["required"] == ["key"]
        assert catalog["add"]["description"] == "Adds two integers."
        # The server's own catalog does not have them.
        assert "lookup" not in {t["name"] for t in client.tools()}

        with pytest.raises(RuntimeError, match="before the session is first used"):
            session.register(lambda x: x, name="late")


def test_tools_given_to_session_and_the_openai_loop_extends(server, token):
    def weather(city: str, unit: Literal["c", "f"] = "c") -> str:
        """The weather in a city."""
        return f"sunny in {city}, 20 {unit}"

    declared_only = {"type": "function", "function": {
        "name": "remote_only", "description": "Declared without a Python function.",
        "parameters": {"type": "object", "properties": {}}}}
    with Client(server.base_url, token=token) as client, \
            client.session(tools=[weather, declared_only]) as session:
        messages = [{"role": "user", "content": "weather?"}]
        reply = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": json.dumps({"city": "Oslo"})}},
            {"id": "c2", "type": "function",
             "function": {"name": "glob", "arguments": json.dumps({"pattern": "*"})}},
            {"id": "c3", "type": "function",
             "function": {"name": "remote_only", "arguments": "{}"}},
        ]}
        messages.append(reply)
        messages.extend(session.dispatch(reply))
        tool_messages = messages[2:]
        assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2", "c3"]
        assert all(m["role"] == "tool" for m in tool_messages)
        assert tool_messages[0]["content"] == "sunny in Oslo, 20 c"
        assert tool_messages[1]["content"] == "(no matches)"
        assert "has no Python function" in tool_messages[2]["content"]
        names = [t["function"]["name"] for t in session.tools(format="openai")]
        assert names[-2:] == ["weather", "remote_only"]


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


def test_schema_from_type_hints():
    def create(title: str, tags: List[str], priority: Priority = Priority.LOW,
               estimate: Optional[float] = None, done: bool = False) -> str:
        """Creates a ticket.

        Args:
            title: a one-line summary
            tags: labels for the ticket
        """
        return title

    spec = tool_spec(create)
    assert spec["name"] == "create" and spec["description"] == "Creates a ticket."
    schema = spec["input_schema"]
    assert schema["required"] == ["title", "tags"]
    assert schema["properties"]["title"] == {"type": "string", "description": "a one-line summary"}
    assert schema["properties"]["tags"]["items"] == {"type": "string"}
    assert schema["properties"]["priority"]["enum"] == ["low", "high"]
    assert schema["properties"]["estimate"]["type"] == ["number", "null"]
    assert schema["properties"]["done"] == {"type": "boolean", "default": False}
    assert schema["additionalProperties"] is False
    opts = tool_spec(create, concurrency_safe=True, access={"write": [{"name": "db:t"}]},
                     timeout_ms=10, output_cap=99)
    assert (opts["concurrency_safe"], opts["timeout_ms"], opts["output_cap"]) == (True, 10, 99)


def test_pydantic_models_and_enums_are_validated_into_the_function(server, token):
    pydantic = pytest.importorskip("pydantic")

    class Order(pydantic.BaseModel):
        item: str
        quantity: int = 1

    got = []
    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool
        def place(order: Order) -> dict:
            """Places an order."""
            got.append(order)
            return order.model_dump()

        @session.tool
        def prioritise(ticket: str, priority: Priority, extra: Optional[Order] = None) -> str:
            """Sets a ticket's priority."""
            got.append((priority, extra))
            return f"{ticket}:{priority.name}:{extra.item if extra else '-'}"

        answer = session.dispatch(assistant(
            tool_use("p", "place", {"item": "tea", "quantity": 2}),
            tool_use("bad", "place", {"quantity": 2}),  # item missing: invalid_arguments
            tool_use("q", "prioritise", {"ticket": "T-1", "priority": "high",
                                         "extra": {"item": "cup"}}),
            tool_use("bad2", "prioritise", {"ticket": "T-2", "priority": "urgent"}),
        ))
        c = contents(answer)
        assert json.loads(c[0]) == {"item": "tea", "quantity": 2}
        assert c[1].startswith("Error [invalid_arguments]")
        assert c[2] == "T-1:HIGH:cup"
        assert c[3].startswith("Error [invalid_arguments]")
        assert isinstance(got[0], Order)
        assert got[1][0] is Priority.HIGH and isinstance(got[1][1], Order)
        assert len(got) == 2


def test_sync_tools_run_concurrently_in_threads(server, token):
    barrier = threading.Barrier(3, timeout=20)
    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool(concurrency_safe=True)
        def meet(n: int) -> str:
            """Waits until three calls are running at once."""
            barrier.wait()
            return f"met {n}"

        answer = session.dispatch(assistant(*[tool_use(f"m{i}", "meet", {"n": i})
                                              for i in range(3)]))
        assert contents(answer) == ["met 0", "met 1", "met 2"]


def test_content_blocks_pass_through_and_stream_yields_client_results(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool
        def report() -> list:
            """A report of two text blocks."""
            return [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]

        @session.tool
        def numbers() -> list:
            """Plain data, not blocks."""
            return [1, 2, 3]

        stream = session.stream(assistant(tool_use("r", "report", {}),
                                          tool_use("n", "numbers", {})))
        seen = dict(stream)
        assert set(seen) == {0, 1}
        blocks = stream.answer["content"]
        text = json.dumps(blocks[0]["content"])
        assert "first" in text and "second" in text
        assert json.loads(blocks[1]["content"]) == [1, 2, 3]


def test_async_client_runs_async_and_sync_tools_and_async_with(server, token):
    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session() as session:
                events = []

                @session.tool(concurrency_safe=True)
                async def fetch(url: str) -> dict:
                    """Fetches a URL (pretend)."""
                    events.append("fetch-start")
                    await asyncio.sleep(0.05)
                    return {"url": url, "status": 200}

                @session.tool(concurrency_safe=True)
                def parse(text: str) -> str:
                    """Parses text in a worker thread."""
                    events.append(threading.current_thread().name)
                    return text.upper()

                @session.tool
                async def fail() -> str:
                    """Always fails."""
                    raise KeyError("missing")

                answer = await session.dispatch(assistant(
                    tool_use("a", "fetch", {"url": "https://example.test"}),
                    tool_use("b", "parse", {"text": "abc"}),
                    tool_use("c", "glob", {"pattern": "*"}),
                    tool_use("d", "fail", {}),
                    tool_use("e", "fetch", {}),  # invalid
                ))
                c = contents(answer)
                assert json.loads(c[0]) == {"url": "https://example.test", "status": 200}
                assert c[1] == "ABC" and c[2] == "(no matches)"
                assert c[3].startswith("Error [execution_error]") and "KeyError" in c[3]
                assert c[4].startswith("Error [invalid_arguments]")
                assert events.count("fetch-start") == 1
                assert any(e.startswith("switchboard-tool") for e in events)
                with pytest.raises(RuntimeError):
                    session.register(lambda: 1, name="late")
                info = await session.info()
                assert info["calls"] == 5
                sid = session.id
            # Exit deleted it.
            again = client.session()
            again._id, again._base = sid, f"/v1/sessions/{sid}"
            with pytest.raises(SwitchboardError) as e:
                await again.info()
            assert e.value.code == "unknown_session"

    asyncio.run(main())


def test_tool_error_is_the_error_text_as_it_is(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool
        def find(key: str) -> str:
            """Finds a key."""
            raise ToolError(f"no key {key!r}: try one of a, b")

        @session.tool
        def fail() -> str:
            """Fails with an ordinary exception."""
            raise LookupError("gone")

        answer = session.dispatch(assistant(tool_use("t1", "find", {"key": "z"}),
                                            tool_use("t2", "fail", {})))
        blocks = answer["content"]
        assert blocks[0]["is_error"] is True
        assert blocks[0]["content"] == "Error [execution_error]: no key 'z': try one of a, b"
        assert blocks[1]["content"] == "Error [execution_error]: LookupError: gone"


def test_tool_error_from_async_client_tools(server, token):
    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session() as session:
                @session.tool
                async def afind(key: str) -> str:
                    """Finds a key, asynchronously."""
                    raise ToolError(f"{key} is not there")

                @session.tool
                def find(key: str) -> str:
                    """Finds a key in a worker thread."""
                    raise ToolError(f"{key} is not here either")

                answer = await session.dispatch(assistant(tool_use("a", "afind", {"key": "k"}),
                                                          tool_use("b", "find", {"key": "k"})))
                assert [b.get("is_error") for b in answer["content"]] == [True, True]
                assert contents(answer) == ["Error [execution_error]: k is not there",
                                            "Error [execution_error]: k is not here either"]

    asyncio.run(main())


def test_session_is_created_lazily(server, token):
    with Client(server.base_url, token=token) as client:
        session = client.session()
        assert not session.created
        session.close()  # never created: nothing to delete
        with pytest.raises(SwitchboardError) as e:
            session.info()
        assert e.value.code == "unknown_session"
        with pytest.raises(ValueError, match="twice"):
            s2 = client.session()
            s2.register(lambda: 1, name="x")
            s2.register(lambda: 2, name="x")
        with pytest.raises(SwitchboardError) as e:
            client.session(tools=[{"name": "bash", "description": "clash",
                                   "input_schema": {"type": "object"}}]).info()
        assert e.value.code == "bad_request"
