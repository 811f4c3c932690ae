#!/usr/bin/env python3
"""The padding part of catalog.json: real function definitions from the Berkeley Function Calling
Leaderboard data that PyPI's `bfcl-eval` wheel ships (Apache-2.0). Standard library only.

    pad.py BFCL_EVAL_WHEEL OUT.json

Reads the wheel as a zip (nothing is installed or imported from it) and takes, in this order:

  bfcl_eval/data/multi_turn_func_doc/*.json   the multi-turn API suites (file system, messages,
                                              tickets, trading, travel, vehicle, math, posting, ...)
  bfcl_eval/data/BFCL_v4_simple_python.json   one function per test case
  bfcl_eval/data/BFCL_v4_multiple.json        2-4 candidate functions per test case
  bfcl_eval/data/BFCL_v4_live_simple.json     user-contributed functions

Names are sanitized to ^[a-zA-Z0-9_-]{1,64}$ (every other character becomes '_'); the first
definition of a sanitized name wins, later ones are dropped. Parameter types are converted to JSON
Schema with BFCL's own table (bfcl_eval/constants/type_mappings.py GORILLA_TO_OPENAPI: dict ->
object, float -> number, tuple -> array, any -> string, ...), as BFCL does when it sends them to an
OpenAI-style model; descriptions are verbatim.
"""

import json
import re
import sys
import zipfile

WHEEL_VERSION = "2026.3.23"
SOURCES = [
    "bfcl_eval/data/multi_turn_func_doc/",
    "bfcl_eval/data/BFCL_v4_simple_python.json",
    "bfcl_eval/data/BFCL_v4_multiple.json",
    "bfcl_eval/data/BFCL_v4_live_simple.json",
]
# bfcl_eval/constants/type_mappings.py, GORILLA_TO_OPENAPI (bfcl-eval 2026.3.23).
GORILLA_TO_OPENAPI = {
    "integer": "integer", "number": "number", "float": "number", "string": "string",
    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "dict": "object",
    "object": "object", "tuple": "array", "any": "string", "byte": "integer", "short": "integer",
    "long": "integer", "double": "number", "char": "string", "ArrayList": "array",
    "Array": "array", "HashMap": "object", "Hashtable": "object", "Queue": "array",
    "Stack": "array", "Any": "string", "String": "string", "Bigint": "integer",
}
NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def convert(schema):
    """Map BFCL type names to JSON Schema ones, recursively (properties, items)."""
    if isinstance(schema, list):
        return [convert(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "type" and isinstance(v, str):
            out[k] = GORILLA_TO_OPENAPI.get(v, v)
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: convert(p) for name, p in v.items()}
        elif k in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            out[k] = convert(v)
        else:
            out[k] = v
    return out


def functions(zf, member):
    """The function definitions of one BFCL file (JSON lines)."""
    for line in zf.read(member).decode("utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if "function" in rec:  # a test case: {"id", "question", "function": [...]}
            yield from rec["function"]
        else:  # a multi_turn_func_doc line is one function
            yield rec


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wheel, out = sys.argv[1], sys.argv[2]
    if f"bfcl_eval-{WHEEL_VERSION}-" not in wheel:
        sys.exit(f"expected the bfcl-eval {WHEEL_VERSION} wheel, got {wheel}")
    entries, seen = [], set()
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        for src in SOURCES:
            members = sorted(n for n in names if n.startswith(src) and n.endswith(".json")) \
                if src.endswith("/") else [src]
            for member in members:
                for fn in functions(zf, member):
                    tool = re.sub(r"[^a-zA-Z0-9_-]", "_", fn["name"])[:64]
                    assert NAME_OK.match(tool), tool
                    if tool in seen:
                        continue
                    seen.add(tool)
                    schema = convert(fn.get("parameters") or {})
                    schema["type"] = "object"  # BFCL writes "dict" at the top level
                    schema.setdefault("properties", {})
                    entries.append({
                        "id": f"bfcl/{tool}",
                        "server": None,
                        "tool": tool,
                        "description": fn.get("description", ""),
                        "input_schema": schema,
                        "source": f"pypi:bfcl-eval=={WHEEL_VERSION} {member}",
                    })
    with open(out, "w") as f:
        json.dump(entries, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"  {len(entries)} padding tools from bfcl-eval {WHEEL_VERSION} -> {out}")


if __name__ == "__main__":
    main()
