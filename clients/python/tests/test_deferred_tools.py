"""Deferred client tools: ``defer`` on a client tool leaves it out of the model's context until
the engine's ``tool_search`` finds it; its calls still run the client's function. The
``tool_reference`` blocks of a search's answer reach the Anthropic API unchanged."""

import asyncio
import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from switchboard_client import AsyncClient, Client, tool_spec

from _helpers import JsonHandler, anthropic_message, anthropic_wire

SECRET_SCHEMA = {"type": "object", "properties": {"key": {"type": "string"}},
                 "required": ["key"], "additionalProperties": False}


def tool_use(id, name, input):
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def by_name(catalog):
    return {t["name"]: t for t in catalog}


def test_a_deferred_client_tool_is_found_by_tool_search_then_runs_here(server, token):
    ran = []
    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool(defer="always")
        def vault_lookup(key: str) -> str:
            """Reads a secret from the platform's vault."""
            ran.append(key)
            return f"secret-of-{key}"

        @session.tool
        def shout(text: str) -> str:
            """Upper-cases text."""
            return text.upper()

        assert session.client_tools[0]["defer"] == "always"
        assert "defer" not in session.client_tools[1]

        catalog = session.tools()
        assert catalog[0]["name"] == "tool_search"
        tools = by_name(catalog)
        assert tools["vault_lookup"]["defer_loading"] is True
        assert "defer_loading" not in tools["shout"]
        assert "defer_loading" not in tools["bash"]
        # OpenAI shape: not listed until the session has been shown it.
        openai_names = [t["function"]["name"] for t in session.tools(format="openai")]
        assert openai_names[0] == "tool_search"
        assert "shout" in openai_names and "vault_lookup" not in openai_names

        found = session.dispatch(assistant(
            tool_use("s1", "tool_search", {"query": "select:vault_lookup"})))
        [result] = found["content"]
        assert result["type"] == "tool_result" and result["tool_use_id"] == "s1"
        assert "is_error" not in result
        blocks = result["content"]
        assert blocks[0]["type"] == "text" and "vault_lookup" in blocks[0]["text"]
        assert blocks[1:] == [{"type": "tool_reference", "tool_name": "vault_lookup"}]
        assert ran == []  # a search runs nothing

        # The model calls it: the call comes over the stream and the function runs here.
        answer = session.dispatch(assistant(
            tool_use("c1", "vault_lookup", {"key": "db"}),
            tool_use("c2", "shout", {"text": "ok"})))
        assert [b["tool_use_id"] for b in answer["content"]] == ["c1", "c2"]
        assert answer["content"][0]["content"] == "secret-of-db"
        assert answer["content"][1]["content"] == "OK"
        assert ran == ["db"]
        # A deferred tool's calls are validated like any other's.
        bad = session.dispatch(assistant(tool_use("c3", "vault_lookup", {"key": 7})))
        assert bad["content"][0]["is_error"] is True
        assert bad["content"][0]["content"].startswith("Error [invalid_arguments]")
        assert ran == ["db"]

        # Shown now: the OpenAI catalog appends it, the Anthropic one is unchanged.
        assert session.tools(format="openai")[-1]["function"]["name"] == "vault_lookup"
        assert session.tools() == catalog


def test_an_invalid_defer_raises_before_any_request(token):
    def f(key: str) -> str:
        return key

    # Nothing listens on this address: any request would fail with connection_error.
    with Client("http://127.0.0.1:9", token=token) as client:
        session = client.session()
        for bad in ("sometimes", "ALWAYS", True, 1, ""):
            with pytest.raises(ValueError, match="'never', 'auto' or 'always'"):
                session.tool(defer=bad)
            with pytest.raises(ValueError, match="'never', 'auto' or 'always'"):
                session.register(f, defer=bad)
            with pytest.raises(ValueError, match="'never', 'auto' or 'always'"):
                tool_spec(f, defer=bad)
        with pytest.raises(ValueError, match="'never', 'auto' or 'always'"):
            @session.tool(defer="later")
            def g(key: str) -> str:
                return key
        assert session.client_tools == [] and not session.created


def test_a_ready_tool_dict_keeps_its_defer_loading(server, token):
    anthropic_shape = {"name": "archive", "description": "Archives a record.",
                       "input_schema": SECRET_SCHEMA, "defer_loading": True}
    openai_shape = {"type": "function", "defer_loading": False, "function": {
        "name": "ping", "description": "Answers pong.",
        "parameters": {"type": "object", "properties": {}}}}
    assert tool_spec(lambda key: key, schema=anthropic_shape) == anthropic_shape
    assert tool_spec(lambda key: key, schema=anthropic_shape, defer="always") == \
        dict(anthropic_shape, defer="always")
    with pytest.raises(ValueError, match="disagrees with its defer_loading"):
        tool_spec(lambda key: key, schema=anthropic_shape, defer="never")
    with pytest.raises(ValueError, match="disagrees with its defer_loading"):
        tool_spec(lambda: "pong", schema=openai_shape, defer="auto")

    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session(tools=[anthropic_shape]) as session:
                def ping() -> str:
                    return "pong"
                spec = session.register(ping, schema=openai_shape)
                assert spec == openai_shape
                assert session.client_tools == [anthropic_shape, openai_shape]
                catalog = await session.tools()
                assert catalog[0]["name"] == "tool_search"
                tools = by_name(catalog)
                assert tools["archive"]["defer_loading"] is True
                assert "defer_loading" not in tools["ping"]
                # A call by exact name shows a deferred tool to the session (and the dict has
                # no function here: its call is answered with an error naming why).
                answer = await session.dispatch(assistant(tool_use("a1", "archive",
                                                                   {"key": "k"})))
                assert "has no Python function" in answer["content"][0]["content"]
                names = [t["function"]["name"] for t in await session.tools(format="openai")]
                assert names[-1] == "archive"

    asyncio.run(main())


class ScriptedMessages(JsonHandler):
    """A Messages API on loopback: records each request and answers with its script."""

    requests = []
    script = []

    def do_POST(self):
        body = self.read_json()
        ScriptedMessages.requests.append(body)
        content, stop = ScriptedMessages.script[len(ScriptedMessages.requests) - 1]
        self.send_json(anthropic_wire(f"msg_{len(ScriptedMessages.requests)}", body["model"],
                                      content, stop))


def test_tool_reference_blocks_reach_the_anthropic_api_unchanged(server, token, monkeypatch):
    """The anthropic SDK's loop: the catalog as ``tools=``, the SDK's own ``Message`` handed to
    dispatch, and the answers appended as they are — the API receives ``defer_loading`` and
    the ``tool_reference`` blocks exactly as the server wrote them."""
    anthropic = pytest.importorskip("anthropic")
    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                  "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    ScriptedMessages.requests = []
    ScriptedMessages.script = [
        ([tool_use("toolu_s", "tool_search", {"query": "vault secret", "max_results": 3})],
         "tool_use"),
        ([tool_use("toolu_v", "vault_lookup", {"key": "api"})], "tool_use"),
        ([{"type": "text", "text": "The secret is secret-of-api."}], "end_turn"),
    ]
    model = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedMessages)
    threading.Thread(target=model.serve_forever, daemon=True).start()
    try:
        api = anthropic.Anthropic(base_url=f"http://127.0.0.1:{model.server_port}",
                                  api_key="test-key", max_retries=0)
        with Client(server.base_url, token=token) as client, client.session() as session:
            @session.tool(defer="always")
            def vault_lookup(key: str) -> str:
                """Reads a secret from the platform's vault."""
                return f"secret-of-{key}"

            messages = [{"role": "user", "content": "What is the api secret?"}]
            texts = []
            for _ in range(len(ScriptedMessages.script)):
                response = api.messages.create(model="scripted", max_tokens=100,
                                               tools=session.tools(), messages=messages)
                messages.append({"role": "assistant", "content": response.content})
                results = session.dispatch(response)
                if results is None:
                    texts = [b.text for b in response.content if b.type == "text"]
                    break
                messages.append(results)
            assert texts == ["The secret is secret-of-api."]

        first, second, third = ScriptedMessages.requests
        assert first["tools"][0]["name"] == "tool_search"
        assert by_name(first["tools"])["vault_lookup"]["defer_loading"] is True
        assert second["tools"] == first["tools"]  # the Anthropic catalog never changes
        search_result = second["messages"][-1]
        assert search_result["role"] == "user"
        [block] = search_result["content"]
        assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_s"
        assert block["content"][0]["type"] == "text"
        assert block["content"][1:] == [{"type": "tool_reference", "tool_name": "vault_lookup"}]
        # The history is sent again, unchanged, with the deferred tool's answer after it.
        assert third["messages"][:3] == second["messages"]
        assert third["messages"][-1]["content"] == [
            {"type": "tool_result", "tool_use_id": "toolu_v", "content": "secret-of-api"}]
    finally:
        model.shutdown()


def test_the_sdk_message_of_a_search_dispatches(server, token):
    """The ``anthropic`` SDK's ``Message`` with a ``tool_search`` call (no client tool called:
    the dispatch needs no stream) answers with the reference block."""
    anthropic = pytest.importorskip("anthropic")
    message = anthropic_message(anthropic, "msg_s", [
        tool_use("toolu_r", "tool_search", {"query": "regex:^vault_"})], "tool_use")
    with Client(server.base_url, token=token) as client, \
            client.session(tools=[tool_spec(lambda key: key, name="vault_lookup",
                                            schema=SECRET_SCHEMA, defer="always")]) as session:
        answer = session.dispatch(message)
        content = answer["content"][0]["content"]
        assert content[-1] == {"type": "tool_reference", "tool_name": "vault_lookup"}
        json.dumps(answer)  # plain JSON, ready to append


def test_auto_is_the_servers_choice_by_the_size_of_the_catalog(server, token):
    """Without ``defer`` the tool is ``auto``: kept in a small catalog, deferred past the
    server's ``--defer-auto-above`` (``local(defer_auto_above=...)``); ``never`` keeps it."""
    from conftest import binary
    from switchboard_client import local

    def declare(session):
        @session.tool
        def note(text: str) -> str:
            """Keeps a note."""
            return text

        @session.tool(defer="never")
        def keep(text: str) -> str:
            """Keeps a text in context."""
            return text
        assert "defer" not in session.client_tools[0]
        assert session.client_tools[1]["defer"] == "never"

    with Client(server.base_url, token=token) as client, client.session() as session:
        declare(session)
        catalog = session.tools()
        assert "tool_search" not in by_name(catalog)
        assert not any("defer_loading" in t for t in catalog)

    with local(binary=binary(), defer_auto_above=1) as client, client.session() as session:
        declare(session)
        catalog = session.tools()
        assert catalog[0]["name"] == "tool_search"
        tools = by_name(catalog)
        assert tools["note"]["defer_loading"] is True
        assert "defer_loading" not in tools["keep"]
        assert session.dispatch(assistant(tool_use("n1", "note", {"text": "hi"})))[
            "content"][0]["content"] == "hi"
