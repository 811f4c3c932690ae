"""Effect classes of client tools: ``effect`` says what running a call twice would do
(``read_only``, ``idempotent``, ``side_effect``). It is sent in the tool's declaration, checked
here before any request and by the server when the session is made; a call re-sent with its
``tool_use_id`` is answered from the session's answers, whatever its class."""

import asyncio

import pytest

from switchboard_client import AsyncClient, Client, SwitchboardError, tool_spec
from switchboard_client import _bridge

VALUES = "'read_only', 'idempotent' or 'side_effect'"
KEY_SCHEMA = {"type": "object", "properties": {"key": {"type": "string"}},
              "required": ["key"], "additionalProperties": False}


def tool_use(id, name, input):
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def test_each_effect_is_sent_and_its_tool_runs_here(server, token):
    ran = []
    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool(effect="read_only")
        def lookup(key: str) -> str:
            """Reads a value."""
            ran.append(("lookup", key))
            return f"value-of-{key}"

        @session.tool(effect="idempotent")
        def put(key: str) -> str:
            """Stores a value (the same value twice is one store)."""
            ran.append(("put", key))
            return f"stored {key}"

        @session.tool(effect="side_effect")
        def pay(key: str) -> str:
            """Pays an invoice."""
            ran.append(("pay", key))
            return f"paid {key}"

        @session.tool
        def note(key: str) -> str:
            """Keeps a note."""
            ran.append(("note", key))
            return f"noted {key}"

        effects = {t["name"]: t.get("effect") for t in session.client_tools}
        assert effects == {"lookup": "read_only", "put": "idempotent", "pay": "side_effect",
                           "note": None}   # not given: not sent, the server's side_effect

        turn = assistant(tool_use("e1", "lookup", {"key": "a"}),
                         tool_use("e2", "put", {"key": "b"}),
                         tool_use("e3", "pay", {"key": "c"}),
                         tool_use("e4", "note", {"key": "d"}))
        answer = session.dispatch(turn)   # the server made the session: it took every class
        assert [(b["tool_use_id"], b["content"]) for b in answer["content"]] == [
            ("e1", "value-of-a"), ("e2", "stored b"), ("e3", "paid c"), ("e4", "noted d")]
        assert not any(b.get("is_error") for b in answer["content"])
        assert sorted(ran) == [("lookup", "a"), ("note", "d"), ("pay", "c"), ("put", "b")]

        # The same turn again (a harness retrying after a lost response): every call is
        # answered from the session's answers and nothing runs twice, whatever its class.
        again = session.dispatch(turn)
        assert again["content"] == answer["content"]
        assert len(ran) == 4
        # The catalog is what the model sees: the definitions, without the engine's options.
        catalog = {t["name"]: t for t in session.tools()}
        assert "effect" not in catalog["pay"]


def test_an_invalid_effect_raises_before_any_request(token):
    def f(key: str) -> str:
        return key

    # Nothing listens on this address: any request would fail with connection_error.
    with Client("http://127.0.0.1:9", token=token) as client:
        session = client.session()
        for bad in ("readonly", "READ_ONLY", "side-effect", "", True, 1, ["read_only"]):
            with pytest.raises(ValueError, match=VALUES):
                session.tool(effect=bad)
            with pytest.raises(ValueError, match=VALUES):
                session.register(f, effect=bad)
            with pytest.raises(ValueError, match=VALUES):
                tool_spec(f, effect=bad)
            with pytest.raises(ValueError, match=VALUES):
                tool_spec(f, schema={"name": "f", "input_schema": KEY_SCHEMA}, effect=bad)
        with pytest.raises(ValueError, match=rf"{VALUES}.*not 'pure'"):
            @session.tool(effect="pure")
            def g(key: str) -> str:
                return key
        assert session.client_tools == [] and not session.created


def test_the_adapters_check_effect_in_tool_options():
    _bridge.check_options("lookup", {"effect": "read_only", "defer": "never"})
    with pytest.raises(ValueError, match=f"'lookup'.*{VALUES}"):
        _bridge.check_options("lookup", {"effect": "idempotently"})


def test_a_ready_tool_dict_keeps_its_effect_and_annotations(server, token):
    """A tool dict is sent as it is: its own ``effect``, or MCP ``annotations`` the server reads
    for one; ``effect=`` adds (or replaces) the explicit class, which wins on the server."""
    anthropic_shape = {"name": "archive", "description": "Archives a record.",
                       "input_schema": KEY_SCHEMA, "effect": "idempotent"}
    mcp_hinted = {"type": "function", "annotations": {"readOnlyHint": True, "title": "Ping"},
                  "function": {"name": "ping", "description": "Answers pong.",
                               "parameters": {"type": "object", "properties": {}}}}
    assert tool_spec(lambda key: key, schema=anthropic_shape) == anthropic_shape
    assert tool_spec(lambda key: key, schema=anthropic_shape, effect="side_effect") == \
        dict(anthropic_shape, effect="side_effect")
    assert anthropic_shape["effect"] == "idempotent"   # the caller's dict is not changed
    assert tool_spec(lambda: "pong", schema=mcp_hinted, effect="idempotent") == \
        dict(mcp_hinted, effect="idempotent")

    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session(tools=[anthropic_shape]) as session:
                def ping() -> str:
                    return "pong"
                assert session.register(ping, schema=mcp_hinted) == mcp_hinted
                assert session.client_tools == [anthropic_shape, mcp_hinted]
                answer = await session.dispatch(assistant(tool_use("p1", "ping", {})))
                assert answer["content"] == [
                    {"type": "tool_result", "tool_use_id": "p1", "content": "pong"}]

    asyncio.run(main())


@pytest.mark.parametrize("tool, says", [
    ({"name": "refund", "input_schema": KEY_SCHEMA, "effect": "sometimes"},
     'client tool `refund`: `effect` must be "read_only", "idempotent" or "side_effect"'),
    ({"name": "refund", "input_schema": KEY_SCHEMA, "effect": False},
     'client tool `refund`: `effect` must be "read_only", "idempotent" or "side_effect"'),
    ({"type": "function", "effect": "readOnly",
      "function": {"name": "refund", "parameters": KEY_SCHEMA}},
     'client tool `refund`: `effect` must be "read_only", "idempotent" or "side_effect"'),
    ({"name": "refund", "input_schema": KEY_SCHEMA, "annotations": {"readOnlyHint": "yes"}},
     "client tool `refund`: `annotations`: `readOnlyHint` must be true or false"),
    ({"name": "refund", "input_schema": KEY_SCHEMA, "annotations": {"readonlyhint": True}},
     "client tool `refund`: `annotations`: unknown key `readonlyhint`"),
])
def test_the_server_refuses_a_bad_class_in_a_tool_dict(server, token, tool, says):
    """A dict is the server's to check: the session is refused 400 ``bad_request`` naming the
    tool and what it accepts, and no session is made."""
    with Client(server.base_url, token=token) as client:
        session = client.session(tools=[tool])
        with pytest.raises(SwitchboardError) as e:
            session.info()
        assert (e.value.code, e.value.status) == ("bad_request", 400)
        assert says in e.value.message
        assert not session.created
