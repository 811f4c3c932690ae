#!/usr/bin/env python3
"""A small MCP server over stdio (standard library only) that misbehaves on demand.

Usage: misbehaving.py STATE_DIR [OPTIONS_JSON]

Tools (tools/list answers in two pages, to exercise pagination):
  echo          read-only; returns its arguments as JSON
  env           read-only; returns the names of its environment variables as a JSON list
  hang          never answers
  crash_once    exits with status 3 mid-call the first time (a marker file in STATE_DIR
                remembers it), answers "survived" afterwards
  garbage       prints non-JSON lines on stdout, then answers "after garbage"
  big           answers 10 MB of text
  change_tools  answers, then replaces echo by echo2 and sends notifications/tools/list_changed
  fail          answers an isError result
  crash_always  exits with status 4 mid-call, every time
  bad_schema    listed with an input schema that does not compile (never registered)

STATE_DIR/events.log gets one line per tools/call ("call <id> <tool>") and per
notifications/cancelled ("cancelled <id>").

OPTIONS_JSON, a JSON object, adds behaviour:
  "named": [raw names]  only these tools are listed (in two pages); each answers
                        "<label> <raw name>"
  "label": text         the label of those answers
  "page_forever": {"tools": N, "bytes": M}
                        tools/list never ends: every page has N new tools with an input schema of
                        about M bytes, and a next cursor
  "bad_tools": true     page 2 also lists deep_schema (an input schema nested 70 levels, 140
                        levels of JSON) and string_schema (an inputSchema that is a string)
  "bad_answers": true   page 2 also lists huge (answers a 17 MiB line), surrogate (a lone
                        surrogate escape in its text) and hologram (a text block, a block of an
                        unknown type "hologram", an image block)
  "grandchild": true    page 2 also lists spawn_grandchild: starts `setsid sleep 1000` (its own
                        session, out of the server's process group) and answers
                        {"server": its own pid, "grandchild": the sleep's pid}
  "linger": true        at the end of stdin, does not exit but sleeps (a server that does not
                        watch its stdin)
  "meta": true          page 2 also lists meta (answers the request's params._meta as JSON,
                        null when it has none)
  "greedy_patterns": N  page 2 also lists greedy (an input schema of N distinct patterns like
                        [^x]{3000}y: 11 bytes each, megabytes each once compiled without a
                        limit) and patterned (one ordinary pattern, ^[a-z]+$, on its `id`)
"""
import json
import os
import subprocess
import sys
import time

STATE = sys.argv[1]
OPTIONS = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
EVENTS = os.path.join(STATE, "events.log")
CRASHED = os.path.join(STATE, "crashed")
changed = False


def log(line):
    with open(EVENTS, "a") as f:
        f.write(line + "\n")


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def tool(name, read_only=False):
    t = {
        "name": name,
        "description": "test tool " + name,
        "inputSchema": {"type": "object"},
    }
    if read_only:
        t["annotations"] = {"readOnlyHint": True}
    return t


def deep_schema(levels):
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def tools():
    if "named" in OPTIONS:
        named = [tool(raw) for raw in OPTIONS["named"]]
        half = len(named) // 2
        return named[:half], named[half:]
    first = "echo2" if changed else "echo"
    page1 = [tool(first, True), tool("env", True), tool("hang"), tool("crash_once")]
    bad = tool("bad_schema")
    bad["inputSchema"] = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}
    page2 = [tool("garbage"), tool("big"), tool("change_tools"), tool("fail"), tool("crash_always"), bad]
    if OPTIONS.get("bad_tools"):
        deep = tool("deep_schema")
        deep["inputSchema"] = deep_schema(70)
        flat = tool("string_schema")
        flat["inputSchema"] = "string"
        page2 += [deep, flat]
    if OPTIONS.get("bad_answers"):
        page2 += [tool("huge"), tool("surrogate"), tool("hologram")]
    if OPTIONS.get("grandchild"):
        page2.append(tool("spawn_grandchild"))
    if OPTIONS.get("meta"):
        page2.append(tool("meta"))
    if OPTIONS.get("greedy_patterns"):
        greedy = tool("greedy")
        greedy["inputSchema"] = {"type": "object", "properties": {
            "p%d" % i: {"type": "string", "pattern": "[^x]{3000}y%d" % i}
            for i in range(OPTIONS["greedy_patterns"])}}
        patterned = tool("patterned", True)
        patterned["inputSchema"] = {"type": "object", "required": ["id"], "properties": {
            "id": {"type": "string", "pattern": "^[a-z]+$"}}}
        page2 += [greedy, patterned]
    return page1, page2


def endless_page(n):
    """Page n of a tools/list that never ends."""
    spec = OPTIONS["page_forever"]
    filler = {"type": "string", "description": "x" * spec["bytes"]}
    page = [{"name": "t%d_%d" % (n, i), "inputSchema": {"type": "object", "properties": {"f": filler}}}
            for i in range(spec["tools"])]
    return {"tools": page, "nextCursor": "page%d" % (n + 1)}


def text(t, is_error=False):
    return {"content": [{"type": "text", "text": t}], "isError": is_error}


def call(mid, name, args, meta=None):
    global changed
    log("call %s %s" % (json.dumps(mid), name))
    if "named" in OPTIONS:
        return text("%s %s" % (OPTIONS.get("label", ""), name))
    if name in ("echo", "echo2", "patterned"):
        return text(json.dumps(args, sort_keys=True))
    if name == "env":
        return text(json.dumps(sorted(os.environ.keys())))
    if name == "hang":
        return None
    if name == "crash_once":
        if not os.path.exists(CRASHED):
            open(CRASHED, "w").close()
            os._exit(3)
        return text("survived")
    if name == "garbage":
        sys.stdout.write("this is not JSON\n{\"half\": \n\x00\x01 binary junk\n")
        sys.stdout.flush()
        return text("after garbage")
    if name == "big":
        return text("x" * (10 * 1024 * 1024))
    if name == "change_tools":
        changed = True
        send({"jsonrpc": "2.0", "id": mid, "result": text("changing")})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return None
    if name == "crash_always":
        os._exit(4)
    if name == "fail":
        return text("it went wrong", is_error=True)
    if name == "huge":
        send({"jsonrpc": "2.0", "id": mid, "result": text("h" * (17 * 1024 * 1024))})
        return None
    if name == "surrogate":
        # json.dumps would escape it as \ud800 too; written by hand to be explicit.
        sys.stdout.write('{"jsonrpc": "2.0", "id": %s, "result": {"content": '
                         '[{"type": "text", "text": "a\\ud800b"}]}}\n' % json.dumps(mid))
        sys.stdout.flush()
        return None
    if name == "hologram":
        return {"content": [{"type": "text", "text": "before"},
                            {"type": "hologram", "data": "3d"},
                            {"type": "text", "text": "after"}]}
    if name == "meta":
        return text(json.dumps(meta, sort_keys=True))
    if name == "spawn_grandchild":
        child = subprocess.Popen(["setsid", "sleep", "1000"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return text(json.dumps({"server": os.getpid(), "grandchild": child.pid}))
    return {"__error__": "unknown tool " + name}


for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method = msg.get("method")
    mid = msg.get("id")
    params = msg.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "misbehaving", "version": "1"},
        }})
    elif method == "notifications/cancelled":
        log("cancelled %s" % json.dumps(params.get("requestId")))
    elif method == "tools/list" and "page_forever" in OPTIONS:
        cursor = params.get("cursor") or "page0"
        send({"jsonrpc": "2.0", "id": mid, "result": endless_page(int(cursor[4:]))})
    elif method == "tools/list":
        page1, page2 = tools()
        if params.get("cursor") == "page2":
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": page2}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": page1, "nextCursor": "page2"}})
    elif method == "tools/call":
        result = call(mid, params.get("name"), params.get("arguments") or {}, params.get("_meta"))
        if result is None:
            continue
        if "__error__" in result:
            send({"jsonrpc": "2.0", "id": mid,
                  "error": {"code": -32602, "message": result["__error__"]}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "result": result})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid,
              "error": {"code": -32601, "message": "method not found: %s" % method}})

if OPTIONS.get("linger"):
    time.sleep(1000)
