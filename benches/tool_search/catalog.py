#!/usr/bin/env python3
"""Put together, check and validate the tool-search dataset (standard library only).

    catalog.py merge MCP.json PAD.json CATALOG.json   write CATALOG = MCP part + padding part
    catalog.py check MCP.json CATALOG.json            the freshly listed MCP tools must equal the
                                                      catalog's MCP part (entries with a server)
    catalog.py validate CATALOG.json QUERIES.jsonl    the dataset's rules (sizes, ids, schemas,
                                                      every expected id exists)
"""

import json
import re
import sys

NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
SERVER_OK = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
FIELDS = ["id", "server", "tool", "description", "input_schema", "source"]


def load(path):
    with open(path) as f:
        return json.load(f)


def merge(mcp_path, pad_path, out_path):
    mcp, pad = load(mcp_path), load(pad_path)
    catalog = [{k: e[k] for k in FIELDS} for e in mcp + pad]
    errors = validate_catalog(catalog)
    if errors:
        sys.exit("catalog not written:\n  " + "\n  ".join(errors[:20]))
    with open(out_path, "w") as f:
        json.dump(catalog, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"  {out_path}: {len(catalog)} entries ({len(mcp)} MCP tools, {len(pad)} padding)")


def first_difference(old, new):
    """A sentence naming the first server/tool where the two MCP parts differ, or None."""
    def by_server(entries):
        servers = {}
        for e in entries:
            servers.setdefault(e["server"], []).append(e)
        return servers

    old_s, new_s = by_server(old), by_server(new)
    ol, nl = list(old_s), list(new_s)
    for i in range(max(len(ol), len(nl))):
        a = ol[i] if i < len(ol) else "(none)"
        b = nl[i] if i < len(nl) else "(none)"
        if a != b:
            return f"server #{i + 1}: the catalog has {a}, the fresh listing has {b}"
    for server in old_s:
        o, n = old_s[server], new_s[server]
        if o[0]["source"] != n[0]["source"]:
            return f"{server}: source {o[0]['source']} in the catalog, {n[0]['source']} installed"
        on, nn = [e["tool"] for e in o], [e["tool"] for e in n]
        if on != nn:
            missing = [t for t in on if t not in nn]
            extra = [t for t in nn if t not in on]
            if missing:
                return f"{server}/{missing[0]}: in the catalog, no longer listed by the server"
            if extra:
                return f"{server}/{extra[0]}: listed by the server, not in the catalog"
            for a, b in zip(on, nn):
                if a != b:
                    return f"{server}/{a}: listed in another order ({b} is now at its place)"
        for a, b in zip(o, n):
            for field in FIELDS:
                if a.get(field) != b.get(field):
                    return (f"{a['id']}: its {field} differs\n    catalog: "
                            f"{json.dumps(a.get(field))[:300]}\n    fresh:   "
                            f"{json.dumps(b.get(field))[:300]}")
    return None


def check(mcp_path, catalog_path):
    fresh = load(mcp_path)
    committed = [e for e in load(catalog_path) if e.get("server") is not None]
    diff = first_difference(committed, fresh)
    if diff:
        print(f"MISMATCH: the MCP servers' tools differ from {catalog_path}: {diff}",
              file=sys.stderr)
        print("  (run benches/tool_search/collect.sh without --check to regenerate the catalog, "
              "then review queries.jsonl)", file=sys.stderr)
        sys.exit(1)
    print(f"  OK: {len(fresh)} MCP tools from {len(set(e['server'] for e in fresh))} servers "
          f"match {catalog_path}")


def validate_catalog(catalog):
    errors = []
    if not isinstance(catalog, list):
        return ["catalog is not a JSON array"]
    ids, null_tools = set(), set()
    for i, e in enumerate(catalog):
        where = f"entry {i} ({e.get('id')})"
        if set(e) != set(FIELDS):
            errors.append(f"{where}: fields {sorted(e)}, want {FIELDS}")
            continue
        if e["id"] in ids:
            errors.append(f"{where}: duplicate id")
        ids.add(e["id"])
        if not isinstance(e["tool"], str) or not e["tool"]:
            errors.append(f"{where}: no tool name")
        if e["server"] is None:
            if not NAME_OK.match(e["tool"]):
                errors.append(f"{where}: padding tool name {e['tool']!r} is not ^[a-zA-Z0-9_-]{{1,64}}$")
            if e["tool"] in null_tools:
                errors.append(f"{where}: padding tool name {e['tool']} is not unique")
            null_tools.add(e["tool"])
        else:
            if not SERVER_OK.match(e["server"]) or "__" in e["server"]:
                errors.append(f"{where}: bad server name {e['server']!r}")
            if e["id"] != f"{e['server']}/{e['tool']}":
                errors.append(f"{where}: id is not server/tool")
        if not isinstance(e["description"], str):
            errors.append(f"{where}: description is not a string")
        s = e["input_schema"]
        if not isinstance(s, dict) or s.get("type") != "object":
            errors.append(f"{where}: input_schema is not an object schema")
        if not isinstance(e["source"], str) or not e["source"]:
            errors.append(f"{where}: no source")
    return errors


def validate(catalog_path, queries_path):
    catalog = load(catalog_path)
    errors = validate_catalog(catalog)
    mcp = [e for e in catalog if e.get("server") is not None]
    by_id = {e["id"]: e for e in catalog}
    if len(catalog) < 1000:
        errors.append(f"catalog has {len(catalog)} entries, want >= 1000")
    if len(mcp) < 200:
        errors.append(f"catalog has {len(mcp)} MCP tools, want >= 200")
    queries, seen_q = [], set()
    with open(queries_path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                errors.append(f"{queries_path}:{n}: empty line")
                continue
            q = json.loads(line)
            queries.append(q)
            extra = set(q) - {"query", "expected", "note"}
            if extra:
                errors.append(f"{queries_path}:{n}: unknown fields {sorted(extra)}")
            if not isinstance(q.get("query"), str) or not q["query"].strip():
                errors.append(f"{queries_path}:{n}: no query")
            elif q["query"].lower() in seen_q:
                errors.append(f"{queries_path}:{n}: duplicate query {q['query']!r}")
            else:
                seen_q.add(q["query"].lower())
            exp = q.get("expected")
            if not isinstance(exp, list) or not exp or len(set(exp)) != len(exp):
                errors.append(f"{queries_path}:{n}: expected must be a non-empty list of distinct ids")
                continue
            for i in exp:
                if i not in by_id:
                    errors.append(f"{queries_path}:{n}: expected id {i} is not in the catalog")
    if len(queries) < 200:
        errors.append(f"{len(queries)} queries, want >= 200")
    mcp_q = [q for q in queries if any(by_id.get(i, {}).get("server") for i in q.get("expected", []))]
    pad_q = [q for q in queries if q not in mcp_q]
    servers_hit = {by_id[i]["server"] for q in mcp_q for i in q["expected"]
                   if i in by_id and by_id[i]["server"]}
    all_servers = {e["server"] for e in mcp}
    if len(mcp_q) < 150:
        errors.append(f"{len(mcp_q)} queries target MCP tools, want >= 150")
    if all_servers - servers_hit:
        errors.append(f"no query targets servers {sorted(all_servers - servers_hit)}")
    print(f"  catalog: {len(catalog)} entries, {len(mcp)} MCP tools from {len(all_servers)} "
          f"servers, {len(catalog) - len(mcp)} padding")
    print(f"  queries: {len(queries)} ({len(mcp_q)} target MCP tools on {len(servers_hit)} servers, "
          f"{len(pad_q)} target padding; {sum(len(q['expected']) > 1 for q in queries)} with more "
          f"than one expected id)")
    if errors:
        print("INVALID:\n  " + "\n  ".join(errors[:50]), file=sys.stderr)
        sys.exit(1)
    print("  valid")


def main():
    a = sys.argv[1:]
    if len(a) == 4 and a[0] == "merge":
        merge(*a[1:])
    elif len(a) == 3 and a[0] == "check":
        check(*a[1:])
    elif len(a) == 3 and a[0] == "validate":
        validate(*a[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
