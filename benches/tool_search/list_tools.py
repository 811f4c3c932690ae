#!/usr/bin/env python3
"""List the tools of the MCP servers in servers.json (standard library only).

    list_tools.py DEPS_DIR OUT.json [--only NAME,NAME] [--no-unshare]

For each server of servers.json: start it over stdio from DEPS_DIR, inside `unshare -rn` (a new
user + network namespace with no interface but a down loopback, so it cannot reach anything),
send `initialize`, `notifications/initialized`, then `tools/list` (following `nextCursor`), and
stop it. OUT.json gets the catalog entries of every server, in servers.json order, tools in the
order the server listed them. Exits non-zero if a server fails to start, answers with an error,
lists no tool, or leaks something of this machine (the deps or scratch directory, the home
directory, the host name) into its tools.
"""

import glob
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOCOL_VERSION = "2025-06-18"
TIMEOUT_S = 90


def reader(stream, q):
    for line in iter(stream.readline, b""):
        q.put(line)
    q.put(None)


class Server:
    def __init__(self, argv, env, cwd, log_path):
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            env=env, cwd=cwd, start_new_session=True)
        self.q = queue.Queue()
        threading.Thread(target=reader, args=(self.proc.stdout, self.q), daemon=True).start()
        self.next_id = 0

    def send(self, msg):
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method, params, deadline):
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no answer to {method} within {TIMEOUT_S} s")
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"server closed stdout before answering {method} "
                                   f"(exit code {self.proc.poll()})")
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # a log line on stdout: not protocol
            if not isinstance(msg, dict):
                continue
            if "method" in msg and "id" in msg:
                # A request from the server (roots/list, ping, ...): answer so it does not wait.
                if msg["method"] == "roots/list":
                    self.send({"jsonrpc": "2.0", "id": msg["id"], "result": {"roots": []}})
                elif msg["method"] == "ping":
                    self.send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
                else:
                    self.send({"jsonrpc": "2.0", "id": msg["id"],
                               "error": {"code": -32601, "message": "not supported"}})
                continue
            if msg.get("id") != rid:
                continue
            if "error" in msg:
                raise RuntimeError(f"{method} answered an error: {json.dumps(msg['error'])}")
            return msg.get("result", {})

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(timeout=3)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, 9)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self.log.close()


def fix_schema(schema):
    """The catalog wants an object schema: add a missing top-level type only."""
    if not isinstance(schema, dict):
        schema = {}
    schema = dict(schema)
    if "type" not in schema:
        schema["type"] = "object"
    return schema


def installed_source(spec, deps):
    """npm:PKG@VERSION or pypi:PKG==VERSION, read from what is installed in deps."""
    if "npm" in spec:
        with open(os.path.join(deps, "node_modules", spec["npm"], "package.json")) as f:
            return f"npm:{spec['npm']}@{json.load(f)['version']}"
    want = spec["pypi"].lower().replace("-", "_").replace(".", "_")
    for site in glob.glob(os.path.join(deps, "venv", "lib", "python*", "site-packages")):
        for d in os.listdir(site):
            if d.endswith(".dist-info"):
                name, _, version = d[: -len(".dist-info")].rpartition("-")
                if name.lower().replace("-", "_").replace(".", "_") == want:
                    return f"pypi:{spec['pypi']}=={version}"
    raise RuntimeError(f"PyPI package {spec['pypi']} is not installed in {deps}/venv")


def list_server(spec, deps, work, logs_dir, use_unshare):
    subst = {"{deps}": deps, "{work}": work}

    def expand(s):
        for k, v in subst.items():
            s = s.replace(k, v)
        return s

    if "npm" in spec:
        pkg_dir = os.path.join(deps, "node_modules", spec["npm"])
        with open(os.path.join(pkg_dir, "package.json")) as f:
            bins = json.load(f).get("bin")
        rel = bins if isinstance(bins, str) else bins[spec["bin"]]
        program = [shutil.which("node") or "node", os.path.normpath(os.path.join(pkg_dir, rel))]
    else:
        program = [os.path.join(deps, "venv", "bin", spec["bin"])]
    if not os.path.exists(program[-1]):
        raise RuntimeError(f"{program[-1]} is not installed")
    argv = program + [expand(a) for a in spec.get("args", [])]
    if use_unshare:
        argv = ["unshare", "-rn"] + argv
    home = os.path.join(work, "home")
    os.makedirs(home, exist_ok=True)
    env = {
        "PATH": os.path.dirname(shutil.which("node") or "/usr/bin") + ":/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": work,
        "LANG": "C.UTF-8",
        "NODE_ENV": "production",
        "NO_UPDATE_NOTIFIER": "1",
        "DO_NOT_TRACK": "1",
        "TZ": "UTC",
        "PYTHONHASHSEED": "0",  # some Python servers build descriptions from sets
    }
    env.update({k: expand(v) for k, v in spec.get("env", {}).items()})
    server = Server(argv, env, work, os.path.join(logs_dir, spec["name"] + ".stderr"))
    try:
        deadline = time.monotonic() + TIMEOUT_S
        init = server.request("initialize", {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "switchboard-tool-search-collect", "version": "1"},
        }, deadline)
        server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools, cursor, pages = [], None, 0
        while True:
            params = {"cursor": cursor} if cursor else {}
            page = server.request("tools/list", params, deadline)
            tools.extend(page.get("tools", []))
            pages += 1
            cursor = page.get("nextCursor")
            if not cursor:
                break
            if pages > 100:
                raise RuntimeError("more than 100 pages of tools/list")
    finally:
        server.stop()
    info = init.get("serverInfo", {})
    return tools, pages, info


def main():
    args = sys.argv[1:]
    use_unshare = True
    only = None
    if "--no-unshare" in args:
        args.remove("--no-unshare")
        use_unshare = False
    if "--only" in args:
        i = args.index("--only")
        only = set(args[i + 1].split(","))
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    deps, out = os.path.abspath(args[0]), args[1]
    with open(os.path.join(HERE, "servers.json")) as f:
        manifest = json.load(f)
    logs_dir = os.path.join(deps, "logs")
    os.makedirs(logs_dir, exist_ok=True)
    entries, failures = [], []
    for spec in manifest["servers"]:
        if only and spec["name"] not in only:
            continue
        work = tempfile.mkdtemp(prefix="tool-search-")
        started = time.monotonic()
        try:
            source = installed_source(spec, deps)
            tools, pages, info = list_server(spec, deps, work, logs_dir, use_unshare)
            if not tools:
                raise RuntimeError("listed no tools")
            text = json.dumps(tools)
            leaks = [deps, work, os.path.realpath(work), os.path.expanduser("~")]
            if len(os.uname().nodename) >= 4:
                leaks.append(os.uname().nodename)
            for leak in leaks:
                if leak in text:
                    raise RuntimeError(f"its tools mention {leak!r}, which is specific to this machine")
            seen = set()
            for t in tools:
                if t["name"] in seen:
                    raise RuntimeError(f"lists tool {t['name']} twice")
                seen.add(t["name"])
                entries.append({
                    "id": f"{spec['name']}/{t['name']}",
                    "server": spec["name"],
                    "tool": t["name"],
                    "description": t.get("description", "") or "",
                    "input_schema": fix_schema(t.get("inputSchema")),
                    "source": source,
                })
            print(f"  {spec['name']:<22} {len(tools):>4} tools  {pages} page(s)  "
                  f"{time.monotonic() - started:5.1f} s  ({source}; serverInfo "
                  f"{info.get('name')} {info.get('version')})", flush=True)
        except Exception as e:  # noqa: BLE001 - report every server, then fail
            failures.append(spec["name"])
            print(f"  {spec['name']:<22} FAILED: {e} (stderr: {logs_dir}/{spec['name']}.stderr)",
                  flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    with open(out, "w") as f:
        json.dump(entries, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"  {len(entries)} tools from {len(set(e['server'] for e in entries))} servers -> {out}")
    if failures:
        sys.exit(f"failed servers: {', '.join(failures)}")


if __name__ == "__main__":
    main()
