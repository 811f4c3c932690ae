#!/usr/bin/env python3
"""Fault test of cluster mode: 3 `nats-server`s (JetStream, clustered, `sync_interval: always`)
and 3 `switchboard serve --cluster` nodes (a, b, c) sharing one workspace root, under a
side-effect load from clients that send each turn to a random node and re-send it (same turn id,
same ids, same arguments) to a random node until it is answered — while nodes and NATS servers
are killed and paused.

Every call is a side-effect tool (bash) that appends its own tool_use_id to `ledger.txt` in its
session's workspace and prints a random number (a second run would answer differently):
`echo ID >> ledger.txt`, some slow (`sleep 0.2` before or after the line). A turn holds 1 to 3
calls, which run one after the other (bash is exclusive), and names itself with
`Switchboard-Turn-Id`. All three nodes mount the same workspace root (as a shared file system
would), so a session's ledger is one file whichever node ran its calls. The phases:

  1. relay      quiet cluster: a one-call `noop` turn (`--with-load-tools`) sent to the session's
                owner and to a non-owner (relayed over NATS), alternately, CLUSTER_FAULT_RELAY_TURNS
                times each, on kept-alive connections: p50/p99 of each and the relay's overhead.
  2. faults     the load runs (one client thread per session; now and then a client moves to a
                new session made through a random node; 1 request in 10 is given up after
                0.2-1 s, so a copy of a running turn goes to another node) while node faults
                happen one at a time, in a random order:
                  kill     SIGKILL of a node (CLUSTER_FAULT_KILLS), restarted with the same
                           --node-id (a new process, once the old heartbeat has expired; any
                           refusal to start is tried again, as a supervisor would);
                  stop     SIGSTOP of a node, SIGCONT after 1-3 s, or after TTL + 1-3 s (past
                           its lease: another node takes its sessions, it must be fenced)
                           (CLUSTER_FAULT_STOPS, every other one long);
                  kill-mid-call, pause-mid-call (CLUSTER_FAULT_TARGETED each): sessions made on
                           node X run [line first, sleep 5; fast] and [sleep 4, then line; fast]
                           (sent through the other nodes); X is killed (or paused past its lease)
                           0.3 s after the first line. Their retries through other nodes: each
                           first call that had started outcome_unknown, each second call run —
                           it never started. A paused X also had a copy sent to it directly: once
                           continued it must answer that copy with the new owner's answer. A
                           session X no longer owned at the fault (a NATS fault let its lease go,
                           and another node took it and ran the call) is a finding, not judged.
                and, on a thread of their own, overlapping them, NATS faults one at a time
                (CLUSTER_FAULT_NATS): one server SIGKILLed and restarted after 1-3 s, or
                SIGSTOPped for 1-4 s; the next waits until all three answer /healthz 200 (JetStream
                current), so quorum is kept. While a killed server is down, sessions are made
                through one node X and run a turn; once it is back, turns for them go through
                every node at once, and half the time X is killed then (its sessions are taken
                over while the server that came back catches up).
                After each kill the test waits until every session in use that the killed node
                owned has been answered elsewhere: the failover time (kills overlapping a NATS
                fault are listed apart).
  3. resend     every turn of the run sent once more, to a random node: each must be answered with
                the content first received, byte for byte.

At the end, for every id:
  * its line appears at most once in the ledgers (no call ran twice);
  * it has exactly one final answer, the same content on every copy received;
  * an `ok` answer's line is on disk; a "not run" refusal's line is not;
  * `outcome_unknown` only for a call that had started: its line is on disk, or it could have
    started (the first call of its turn, or its predecessor in the turn ran or was settled);
    a call whose predecessor has no answer at all, answered outcome_unknown, is a violation.
A request is refused only with a retryable code (503 node_unreachable, session_moved, overloaded,
shutting_down, cluster_unavailable) or cut (a relayed answer broken off, a connection reset); any
other status is a violation, listed with the session's last requests and what each NATS server's
direct get says of its key and journal right then. Summary lines give the failover time p50/p99
(kill of an owner to the first successful answer for one of its sessions at another node; target
<= TTL + 1 s at p99) and the relay's overhead (target <= 0.3 ms at p50); missing a target is a
failure only with CLUSTER_FAULT_ENFORCE_TARGETS=1. Exit 1 on any violation, each one listed.

Bounded: the whole run at most CLUSTER_FAULT_TIME_LIMIT seconds (default 300): faults stop being
scheduled when too little time is left for the resend and the checks. Loopback only (every server
on 127.0.0.1, on free ports). Only the processes this test started are signalled, by their own
pid, and all are killed at exit (also on a failure, an exception or SIGTERM). Everything lives in
one temporary directory (kept, with the nodes' and NATS servers' logs, when the test fails).

Knobs: CLUSTER_FAULT_SEED, CLUSTER_FAULT_KILLS (10), CLUSTER_FAULT_STOPS (10), CLUSTER_FAULT_NATS
(6), CLUSTER_FAULT_TARGETED (2), CLUSTER_FAULT_SESSIONS (9), CLUSTER_FAULT_TTL (2s),
CLUSTER_FAULT_RELAY_TURNS (400), CLUSTER_FAULT_CLIENT_TIMEOUT (3 s), CLUSTER_FAULT_TIME_LIMIT (300).

Usage: cluster-fault-test.py PATH/TO/switchboard [PATH/TO/nats-server]   (else $NATS_SERVER_BIN)
"""

import collections
import http.client
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse

if len(sys.argv) < 2 or (len(sys.argv) < 3 and not os.environ.get("NATS_SERVER_BIN")):
    sys.exit("usage: cluster-fault-test.py PATH/TO/switchboard PATH/TO/nats-server "
             "(or NATS_SERVER_BIN)")
BINARY = os.path.abspath(sys.argv[1])
NATS_BIN = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.environ["NATS_SERVER_BIN"])


def env_int(name, default):
    return int(os.environ.get(name, str(default)))


def parse_duration(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text.strip())
    if not m:
        sys.exit(f"not a duration: {text!r} (e.g. 2s, 1500ms)")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


SEED = env_int("CLUSTER_FAULT_SEED", 20261206)
KILLS = env_int("CLUSTER_FAULT_KILLS", 10)
STOPS = env_int("CLUSTER_FAULT_STOPS", 10)
NATS_FAULTS = env_int("CLUSTER_FAULT_NATS", 6)
TARGETED = env_int("CLUSTER_FAULT_TARGETED", 2)
SESSIONS = env_int("CLUSTER_FAULT_SESSIONS", 9)
TTL_TEXT = os.environ.get("CLUSTER_FAULT_TTL", "2s")
TTL = parse_duration(TTL_TEXT)
RELAY_TURNS = env_int("CLUSTER_FAULT_RELAY_TURNS", 400)
CLIENT_TIMEOUT = float(os.environ.get("CLUSTER_FAULT_CLIENT_TIMEOUT", "3"))
TIME_LIMIT = env_int("CLUSTER_FAULT_TIME_LIMIT", 300)
ENFORCE_TARGETS = os.environ.get("CLUSTER_FAULT_ENFORCE_TARGETS") == "1"
TOKEN = "cluster-fault-" + "%016x" % random.Random(SEED).getrandbits(64)
NODE_NAMES = ["a", "b", "c"]
READY_BOUND = 30               # seconds for a NATS server or a node to be ready
TURN_BOUND = 45                # seconds a turn may take to be answered, re-sent all along
FAILOVER_BOUND = max(20.0, 4 * TTL + 10)   # wait for a killed node's sessions to move
RESEND_RESERVE = 45            # seconds kept for phase 3 and the checks
RETRYABLE = {"node_unreachable", "session_moved", "overloaded", "shutting_down",
             "cluster_unavailable"}
SHORT_TIMEOUT_CHANCE = 0.1     # a request given up after 0.2-1 s (its copy goes elsewhere)
NEW_SESSION_CHANCE = 0.01      # after each turn, a client moves to a new session

rng = random.Random(SEED)
started = time.monotonic()
deadline_all = started + TIME_LIMIT
tmp = tempfile.mkdtemp(prefix="switchboard-cluster-fault-")
root = os.path.join(tmp, "ws")

# -- what the run saw ------------------------------------------------------------------------------

lock = threading.Lock()
turns = []                     # every Turn made
calls = {}                     # tool_use_id -> (Turn, index in the turn)
answers = collections.defaultdict(list)    # tool_use_id -> [(node, block JSON)] every copy
successes = []                 # (sent, received, session id, node) of every 200 answer
sessions = []                  # every Session made
violations = []                # (phase, text, check)
findings = []                  # (phase, text)
stats = collections.Counter()  # counters for the summary
events = []                    # (time, text) of every fault, for the log
failover_kill = []             # seconds, one per kill: to the first of its sessions answered
failover_each = []             # seconds, one per (kill, session it owned)
failover_nats = []             # per kill, the first, when a NATS fault overlapped the failover
nats_busy = []                 # [start, end] of each NATS fault (end: all servers ready again)
relay_times = {"local": [], "relayed": []}
processes = []                 # every process started (ended at exit, by pid)
ids = itertools.count(1)
phase_now = ["setup"]


def violation(text, check=None, phase=None):
    phase = phase or phase_now[0]
    with lock:
        violations.append((phase, text, check or text))
    say(f"VIOLATION [{phase}] {text}")


def finding(text):
    with lock:
        findings.append((phase_now[0], text))
    say(f"FINDING [{phase_now[0]}] {text}")


def count(key, n=1):
    with lock:
        stats[key] += n


def wall():
    """UTC time of day, as the nodes' logs show it."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}"


def say(text):
    print(f"[{time.monotonic() - started:6.1f} s {wall()}] {text}", flush=True)


def event(text):
    with lock:
        events.append((time.monotonic() - started, text))
    say(f"fault: {text}")


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


class Abort(Exception):
    """The run cannot go on (a server that does not start)."""


# -- processes -------------------------------------------------------------------------------------

def free_ports(n):
    """`n` distinct free loopback ports (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def signal_proc(proc, sig):
    """Sends `sig` to a process this test started, by its pid, if it still runs."""
    if proc is not None and proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def http_get(url, timeout=2.0):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("GET", u.path + (f"?{u.query}" if u.query else ""))
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


class NatsServer:
    def __init__(self, i, client, route, monitor, routes):
        self.i, self.client, self.route, self.monitor = i, client, route, monitor
        self.name = f"n{i}"
        self.proc = None
        self.stopped = False
        self.back_at = None
        self.config = os.path.join(tmp, f"{self.name}.conf")
        self.log = os.path.join(tmp, f"{self.name}.log")
        store = os.path.join(tmp, f"js-{i}")
        with open(self.config, "w") as f:
            f.write(f"server_name: {self.name}\n"
                    f"listen: 127.0.0.1:{client}\n"
                    f"http: 127.0.0.1:{monitor}\n"
                    f"jetstream {{\n  store_dir: {json.dumps(store)}\n  max_memory_store: 64MB\n"
                    f"  max_file_store: 1GB\n  sync_interval: always\n}}\n"
                    f"cluster {{\n  name: sb\n  listen: 127.0.0.1:{route}\n  routes: [\n"
                    + "".join(f"    nats-route://127.0.0.1:{p}\n" for p in routes)
                    + "  ]\n}\n")

    @property
    def url(self):
        return f"nats://127.0.0.1:{self.client}"

    def start(self):
        with open(self.log, "a") as log:
            log.write(f"---- cluster-fault-test: starting {self.name} ----\n")
            log.flush()
            self.proc = subprocess.Popen([NATS_BIN, "-c", self.config], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        processes.append(self.proc)
        self.stopped = False

    def kill(self):
        signal_proc(self.proc, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def ready(self):
        """None when it accepts clients, /healthz is 200 (JetStream current) and /jsz names a
        meta leader; else why not."""
        if self.proc is None or self.proc.poll() is not None:
            return f"{self.name} is not running"
        try:
            socket.create_connection(("127.0.0.1", self.client), timeout=0.5).close()
            status, body = http_get(f"http://127.0.0.1:{self.monitor}/healthz")
            if status != 200:
                return f"{self.name} /healthz {status}: {body.strip()[:200]}"
            status, body = http_get(f"http://127.0.0.1:{self.monitor}/jsz")
            if status != 200 or not json.loads(body).get("meta_cluster", {}).get("leader"):
                return f"{self.name} /jsz names no meta leader"
        except (OSError, http.client.HTTPException, ValueError) as e:
            return f"{self.name}: {e}"
        return None


def wait_nats_ready(servers, bound=READY_BOUND):
    until = time.monotonic() + bound
    why = "not polled"
    while time.monotonic() < until:
        why = next((w for w in (s.ready() for s in servers) if w), None)
        if why is None:
            return True
        time.sleep(0.1)
    violation(f"the NATS servers were not ready within {bound} s: {why}",
              "NATS servers not ready in time")
    return False


class Node:
    """One `serve --cluster` node; a restart is a new process with the same --node-id."""

    def __init__(self, name, nats_urls):
        self.name, self.nats_urls = name, nats_urls
        self.proc = None
        self.base = None
        self.stopped = False
        self.log = os.path.join(tmp, f"node-{name}.log")
        self.restarts = 0
        self.exit = None

    def launch(self):
        """One try: True once it listens; False when it exited (its last lines in `self.said`)."""
        logf = open(self.log, "a")
        logf.write(f"---- cluster-fault-test: starting node {self.name} ----\n")
        logf.flush()
        proc = subprocess.Popen(
            [BINARY, "serve", "--listen", "127.0.0.1:0", "--cluster", self.nats_urls,
             "--node-id", self.name, "--lease-ttl", TTL_TEXT, "--cluster-replicas", "3",
             "--grace", "2s", "--workspace-root", root, "--with-load-tools",
             "--log-format", "text"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=dict(os.environ, SWITCHBOARD_TOKEN=TOKEN))
        processes.append(proc)
        listening = threading.Event()
        said = []
        found = {}

        def read():
            for line in proc.stderr:
                logf.write(line)
                logf.flush()
                if not listening.is_set():
                    said.append(line.rstrip("\n"))
                    m = re.search(r"listening on (\S+)", line)
                    if m:
                        found["base"] = m.group(1).rstrip("/")
                        listening.set()
            listening.set()
            logf.close()

        threading.Thread(target=read, daemon=True).start()
        listening.wait(timeout=READY_BOUND)
        self.said = said
        if proc.poll() is None and "base" in found:
            self.proc, self.base, self.stopped = proc, found["base"], False
            return True
        signal_proc(proc, signal.SIGKILL)
        self.exit = proc.wait()
        if "base" not in found and self.exit == -signal.SIGKILL:
            said.append(f"(no ready line within {READY_BOUND} s)")
        return False

    def start(self, bound=READY_BOUND + 4 * TTL):
        """Starts it, trying again (as a supervisor would) while the old process's heartbeat
        still holds the id, or after any other refusal (each one other than the id in use is a
        finding)."""
        until = time.monotonic() + bound
        tries = 0
        while True:
            tries += 1
            if self.launch():
                count("node starts")
                return tries
            text = " | ".join(self.said[-3:])
            if "in use by a live node" not in text:
                finding(f"node {self.name} refused to start (exit {self.exit}), tried again: "
                        f"{text[:300]}")
            if time.monotonic() < until:
                time.sleep(0.25)
                continue
            raise Abort(f"node {self.name} did not start after {tries} tries: {text}")

    def kill(self):
        signal_proc(self.proc, signal.SIGCONT)
        signal_proc(self.proc, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


def cleanup():
    for proc in processes:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


nats = []
nodes = []
node_lock = threading.Lock()   # one node fault at a time (the NATS fault thread kills some too)


def node_named(name):
    return next(n for n in nodes if n.name == name)


# -- the client ------------------------------------------------------------------------------------

class Session:
    def __init__(self, sid, workspace, made_at):
        self.sid, self.workspace, self.made_at = sid, workspace, made_at
        self.last_used = 0.0
        self.trace = collections.deque(maxlen=12)   # the last requests: when, where, what came

    def history(self):
        return "; ".join(self.trace)

    @property
    def ledger(self):
        return os.path.join(self.workspace, "ledger.txt")


class Turn:
    """One assistant message of bash calls (or one noop call), re-sent with the same body and
    turn id until answered."""

    def __init__(self, phase, session, commands, noop=False):
        n = next(ids)
        self.phase, self.session = phase, session
        self.turn_id = f"{phase}-t{n}"
        self.blocks = None
        self.abandoned = None
        if noop:
            self.ids, self.commands = [f"{phase}-t{n}-noop"], []
            self.body = json.dumps({"role": "assistant", "content": [
                {"type": "tool_use", "id": self.ids[0], "name": "noop",
                 "input": {"n": 1, "text": "x"}}]})
            return                      # not in the ledger check
        self.ids = [f"{phase}-t{n}-c{k}" for k in range(len(commands))]
        self.commands = [c.replace("ID", i) for c, i in zip(commands, self.ids)]
        self.body = json.dumps({"role": "assistant", "content": [
            {"type": "tool_use", "id": i, "name": "bash", "input": {"command": c}}
            for i, c in zip(self.ids, self.commands)]})
        with lock:
            turns.append(self)
            for k, i in enumerate(self.ids):
                calls[i] = (self, k)


FAST = "echo ID >> ledger.txt; echo $RANDOM"
SLOW = "sleep 0.2; echo ID >> ledger.txt; echo $RANDOM"
LINE_FIRST = "echo ID >> ledger.txt; sleep 0.2; echo $RANDOM"
# The targeted faults' long calls also note in started.txt that they started.
LONG_LINE_FIRST = "echo ID >> started.txt; echo ID >> ledger.txt; sleep 5; echo $RANDOM"
LONG_SLOW = "echo ID >> started.txt; sleep 4; echo ID >> ledger.txt; echo $RANDOM"


def random_commands(r):
    return [r.choices([FAST, SLOW, LINE_FIRST], [5, 3, 2])[0]
            for _ in range(r.choice([1, 1, 2, 3]))]


def answer_code(block_json):
    block = json.loads(block_json)
    if not block.get("is_error"):
        return "ok"
    content = block.get("content")
    if isinstance(content, list):
        content = " ".join(c.get("text", "") for c in content if isinstance(c, dict))
    m = re.match(r"Error \[(\w+)\]", content or "")
    return m.group(1) if m else "error"


def request(base, method, path, body=None, turn_id=None, timeout=CLIENT_TIMEOUT, conn=None):
    """(status, text); raises OSError or HTTPException (refused, reset, timed out, cut)."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if turn_id:
        headers["Switchboard-Turn-Id"] = turn_id
    own = conn is None
    if own:
        u = urllib.parse.urlsplit(base)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request(method, path, body=body.encode() if body is not None else None,
                     headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        if own:
            conn.close()


def error_code(text):
    try:
        return json.loads(text)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def create_session(r, via=None, bound=TURN_BOUND):
    """A new session made through `via` (a node) or a random node, retried until made."""
    until = time.monotonic() + bound
    while time.monotonic() < until:
        node = via or r.choice(nodes)
        base = node.base
        try:
            status, text = request(base, "POST", "/v1/sessions", "{}")
        except (OSError, http.client.HTTPException):
            time.sleep(0.1)
            continue
        if status == 201:
            made = json.loads(text)
            s = Session(made["session_id"], made["workspace"], node.name)
            s.trace.append(f"made {time.monotonic() - started:.2f} s ({wall()}) through "
                           f"{node.name}, placed on {made.get('node')}")
            with lock:
                sessions.append(s)
            return s, made.get("node")
        if status == 503 and error_code(text) in RETRYABLE:
            time.sleep(0.1)
            continue
        violation(f"creating a session through {node.name}: HTTP {status}: {text[:300]}",
                  f"session creation answered HTTP {status} {error_code(text)}")
        time.sleep(0.2)
    raise Abort("no session could be made")


def send(turn, r, only=None, timeout=CLIENT_TIMEOUT, halt=None, bound=TURN_BOUND, quiet=False):
    """Sends `turn` to random nodes (of `only`, default all) until answered 200; its blocks, or
    None (abandoned after `bound`, a violation unless `quiet`: then it is re-sent later; or
    `halt` set)."""
    until = time.monotonic() + bound
    seen_bad = set()
    while True:
        if halt is not None and halt.is_set():
            return None
        if quiet and time.monotonic() > until:
            return None
        if time.monotonic() > until:
            turn.abandoned = f"unanswered after {TURN_BOUND} s"
            violation(f"turn {turn.turn_id} ({turn.ids[0]}…) of session {turn.session.sid} "
                      f"unanswered after {TURN_BOUND} s of re-sending", "a turn never answered")
            return None
        node = r.choice(only or nodes)
        base = node.base
        sent = time.monotonic()
        turn.session.last_used = sent
        # Now and then a short timeout: a copy of the turn then goes to another node while the
        # first still runs.
        wait = r.uniform(0.2, 1.0) if r.random() < SHORT_TIMEOUT_CHANCE else timeout
        try:
            status, text = request(base, "POST", f"/v1/sessions/{turn.session.sid}/dispatch",
                                   turn.body, turn.turn_id, wait)
        except (OSError, http.client.HTTPException) as e:
            kind = ("timed out" if isinstance(e, (socket.timeout, TimeoutError))
                    else "refused" if isinstance(e, ConnectionRefusedError)
                    else "cut" if isinstance(e, http.client.IncompleteRead) else "reset/other")
            count(f"re-sent after: connection {kind}")
            turn.session.trace.append(f"{turn.turn_id} {sent - started:.2f} s via {node.name}: "
                                      f"{kind}")
            time.sleep(0.05)
            continue
        if status == 200:
            try:
                blocks = [json.dumps(b) for b in json.loads(text)["content"]]
                got = [json.loads(b)["tool_use_id"] for b in blocks]
            except (ValueError, KeyError, TypeError):
                violation(f"turn {turn.turn_id}: a 200 that is not a tool_result message: "
                          f"{text[:300]}", "a 200 that is not a tool_result message")
                time.sleep(0.1)
                continue
            if got != turn.ids:
                violation(f"turn {turn.turn_id}: answered {got} for {turn.ids}",
                          "answered other ids than asked")
                return None
            received = time.monotonic()
            turn.session.trace.append(f"{turn.turn_id} {sent - started:.2f} s via {node.name}: "
                                      f"200 in {received - sent:.2f} s")
            with lock:
                for i, b in zip(turn.ids, blocks):
                    answers[i].append((node.name, b))
                if turn.blocks is None:
                    turn.blocks = blocks
                successes.append((sent, received, turn.session.sid, node.name))
            for b in blocks:
                count(f"answers {answer_code(b)}")
            return blocks
        code = error_code(text)
        turn.session.trace.append(f"{turn.turn_id} {sent - started:.2f} s via {node.name}: "
                                  f"{status} {code}")
        if status == 503 and code in RETRYABLE:
            count(f"re-sent after: {status} {code}")
            time.sleep(0.1)
            continue
        # Anything else is not a refusal a client should have to retry through: a violation
        # (once per turn and kind); re-sent anyway, to see whether it heals.
        if (status, code) not in seen_bad:
            seen_bad.add((status, code))
            violation(f"turn {turn.turn_id} ({turn.ids[0]}…) of session {turn.session.sid} "
                      f"through {node.name} at {sent - started:.2f} s: HTTP {status}: "
                      f"{text[:300]} — the session's last requests: "
                      f"{turn.session.history()}; {nats_state()}; direct gets right after: "
                      f"{diagnose_session(turn.session.sid)}",
                      f"a refusal that is not retryable: HTTP {status} {code}")
        count(f"re-sent after: {status} {code}")
        time.sleep(0.2)


class Load:
    """One client thread per session: turn after turn, each re-sent until answered."""

    def __init__(self, first_sessions):
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(k, s), daemon=True)
                        for k, s in enumerate(first_sessions)]

    def client(self, k, session):
        r = random.Random(SEED * 1000 + k)
        try:
            while not self.halt.is_set():
                with lock:
                    current[k] = session
                turn = Turn("load", session, random_commands(r))
                send(turn, r)          # finishes its turn even after the halt (bounded)
                if r.random() < NEW_SESSION_CHANCE and not self.halt.is_set():
                    session, _ = create_session(r)
                    count("sessions made under load")
        except Abort as e:
            violation(f"client {k}: {e}")
        except Exception:
            violation(f"client {k} crashed: {traceback.format_exc()}", "a client crashed")

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.halt.set()
        for t in self.threads:
            t.join(timeout=TURN_BOUND + 10)
        if any(t.is_alive() for t in self.threads):
            violation("a client never got its last turn answered")


# -- phase 1: the relay's overhead -----------------------------------------------------------------

def phase_relay():
    r = random.Random(SEED + 1)
    owner = nodes[0]
    s, placed = create_session(r, via=owner)
    status, text = request(owner.base, "GET", f"/v1/sessions/{s.sid}")
    if status != 200 or json.loads(text).get("node") != owner.name:
        finding(f"relay: the session made at {owner.name} is owned by "
                f"{json.loads(text).get('node') if status == 200 else status}; skipped")
        return
    conns = {}
    for n in nodes:
        u = urllib.parse.urlsplit(n.base)
        conns[n.name] = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    others = [n for n in nodes if n is not owner]
    try:
        for k in range(2 * (RELAY_TURNS + 20)):
            kind = "local" if k % 2 == 0 else "relayed"
            node = owner if kind == "local" else others[(k // 2) % len(others)]
            turn = Turn("relay", s, [], noop=True)
            t0 = time.perf_counter()
            status, text = request(node.base, "POST", f"/v1/sessions/{s.sid}/dispatch",
                                   turn.body, turn.turn_id, conn=conns[node.name])
            took = time.perf_counter() - t0
            if status != 200 or '"is_error":true' in text.replace(" ", ""):
                violation(f"relay: a noop turn through {node.name}: HTTP {status}: {text[:300]}",
                          "relay phase: a noop turn not answered ok")
                return
            if k >= 40:                 # 20 of each to warm up
                relay_times[kind].append(took * 1000)
    finally:
        for c in conns.values():
            c.close()


# -- phase 2: faults -------------------------------------------------------------------------------

def owners(bound=3.0):
    """session id -> owner node name, as a live node reports it (asked in parallel; what is not
    answered within `bound` seconds is left out)."""
    out = {}
    live = [n for n in nodes if n.alive() and not n.stopped]
    if not live:
        return out

    def ask(s, n):
        try:
            status, text = request(n.base, "GET", f"/v1/sessions/{s.sid}", timeout=bound)
            if status == 200:
                out[s.sid] = json.loads(text).get("node")
        except (OSError, http.client.HTTPException, ValueError):
            pass

    with lock:
        in_use = {s.sid: s for s in current.values()}
    threads = [threading.Thread(target=ask, args=(s, live[k % len(live)]), daemon=True)
               for k, s in enumerate(in_use.values())]
    for th in threads:
        th.start()
    until = time.monotonic() + bound
    for th in threads:
        th.join(timeout=max(0.0, until - time.monotonic()))
    return dict(out)


def wait_failover(victim, owned, t0, extra=()):
    """Waits until each session `victim` owned at `t0` that is still in use (a load client's
    current session, or one of `extra`) has a 200 answer to a request sent after t0; records the
    failover times: per kill the first such answer, and per session its first."""
    until = t0 + FAILOVER_BOUND
    pending = set(owned)
    first = {}
    while time.monotonic() < until:
        with lock:
            in_use = {s.sid for s in current.values()} | set(extra)
            for sent, received, sid, via in successes:
                if sid in pending and sent >= t0 and (sid not in first or received < first[sid]):
                    first[sid] = received
        pending -= set(first)
        pending &= in_use             # a client that moved on to a new session: not waited for
        if not pending:
            break
        time.sleep(0.05)
    for sid in pending:
        finding(f"failover: session {sid} of killed node {victim.name} not answered "
                f"elsewhere within {FAILOVER_BOUND:.0f} s of the kill")
    if first:
        times = sorted(first[sid] - t0 for sid in first)
        end = t0 + times[-1]
        with lock:
            overlap = any(b < end and (e is None or e > t0) for b, e in nats_busy)
        if overlap:
            failover_nats.append(times[0])     # a NATS server down or catching up meanwhile
        else:
            failover_kill.append(times[0])
            failover_each.extend(times)
        say(f"   failover after killing {victim.name}: {len(first)} of {len(owned)} sessions "
            f"answered elsewhere, the first after {times[0]:.2f} s, the last {times[-1]:.2f} s"
            + (" (a NATS fault overlapped)" if overlap else ""))


def kill_node(victim, targeted=""):
    owned = [sid for sid, o in owners().items() if o == victim.name]
    t0 = time.monotonic()
    victim.kill()
    count("node kills")
    event(f"kill -9 node {victim.name}{targeted} (owning {len(owned)} sessions)")
    tries = victim.start()
    victim.restarts += 1
    say(f"   node {victim.name} restarted after {time.monotonic() - t0:.1f} s ({tries} tries)")
    wait_failover(victim, owned, t0)


def stop_node(victim, seconds):
    victim.stopped = True
    signal_proc(victim.proc, signal.SIGSTOP)
    count("node stops")
    if seconds > TTL:
        count("node stops past the lease TTL")
    event(f"SIGSTOP node {victim.name} for {seconds:.1f} s")
    time.sleep(seconds)
    signal_proc(victim.proc, signal.SIGCONT)
    victim.stopped = False


def nats_state():
    now = time.monotonic()
    parts = []
    for n in nats:
        state = ("down" if n.proc is None or n.proc.poll() is not None
                 else "stopped" if n.stopped else "up")
        if state == "up" and n.back_at:
            state += f" (back {now - n.back_at:.1f} s ago)"
        parts.append(f"{n.name} {state}")
    return "NATS: " + ", ".join(parts)


def nats_request(server, subject, payload=b"", timeout=1.0):
    """One request over the NATS protocol (stdlib socket) to `server`: the reply's status line
    and body, or why there was none. For diagnosis only."""
    try:
        with socket.create_connection(("127.0.0.1", server.client), timeout=timeout) as sock:
            f = sock.makefile("rb")
            f.readline()                                        # INFO
            sock.sendall(b'CONNECT {"verbose":false,"headers":true,"no_responders":true,'
                         b'"protocol":1}\r\nSUB _INBOX.diag 1\r\n'
                         + f"PUB {subject} _INBOX.diag {len(payload)}\r\n".encode() + payload
                         + b"\r\n")
            while True:
                parts = f.readline().split()
                if not parts:
                    return "connection closed"
                if parts[0] == b"PING":
                    sock.sendall(b"PONG\r\n")
                elif parts[0] in (b"MSG", b"HMSG"):
                    data = f.read(int(parts[-1]) + 2)[:-2]
                    if parts[0] == b"HMSG":
                        head, data = data[:int(parts[-2])], data[int(parts[-2]):]
                        status = head.split(b"\r\n")[0].decode(errors="replace")
                        seq = re.search(rb"Nats-Sequence: (\d+)", head)
                        status += f" seq {seq.group(1).decode()}" if seq else ""
                    else:
                        status = "MSG"
                    return f"{status} {data.decode(errors='replace')[:160]}"
    except OSError as e:
        return f"no answer ({e})"


def diagnose_session(sid):
    """What each NATS server's direct get says of session `sid`'s key and last journal record
    (a direct get may be answered by any current replica, a lagging one included)."""
    out = []
    for n in nats:
        if n.proc is None or n.proc.poll() is not None or n.stopped:
            out.append(f"{n.name}: not running")
            continue
        key = nats_request(n, f"$JS.API.DIRECT.GET.KV_switchboard_sessions."
                              f"$KV.switchboard_sessions.{sid}")
        last = nats_request(n, "$JS.API.DIRECT.GET.SWITCHBOARD_JOURNAL",
                            json.dumps({"last_by_subj": f"sbj.{sid}"}).encode())
        out.append(f"{n.name}: key: {key} | journal's last: {last[:120]}")
    return " || ".join(out)


def nats_fault(r):
    """One NATS server killed (and restarted) or paused. While a killed one is down, sessions
    are made through one node X and each runs a turn (their keys and journals are written
    without that server); once it is back, turns for them go through every node at once, and
    half the time X is killed right then, so the other nodes take them over (reading their
    keys and journals) while the server that came back catches up."""
    server = r.choice(nats)
    begun = time.monotonic()
    with lock:
        nats_busy.append([begun, None])
    probes = []
    owner = r.choice(nodes)
    if r.random() < 0.6:
        server.kill()
        count("NATS kills")
        down = r.uniform(1.0, 3.0)
        event(f"kill -9 NATS server {server.name}, restarted after {down:.1f} s")
        until = time.monotonic() + down
        while time.monotonic() < until - 0.3 and len(probes) < 6:
            try:
                s, _ = create_session(r, via=owner, bound=max(1.0, until - time.monotonic()))
            except Abort:
                break
            probes.append(s)
            send(Turn("probe", s, [FAST]), random.Random(r.random()), [owner], timeout=1.0,
                 bound=max(1.0, until - time.monotonic()), quiet=True)
        time.sleep(max(0.0, until - time.monotonic()))
        server.start()
        server.back_at = time.monotonic()
    else:
        down = r.uniform(1.0, 4.0)
        count("NATS stops")
        event(f"SIGSTOP NATS server {server.name} for {down:.1f} s")
        server.stopped = True
        signal_proc(server.proc, signal.SIGSTOP)
        time.sleep(down)
        signal_proc(server.proc, signal.SIGCONT)
        server.stopped = False
        server.back_at = time.monotonic()
    if probes:
        # Turns for the sessions made while it was down, through every node, as it comes back.
        count("sessions made while a NATS server was down", len(probes))

        def turns_through(s, node, rr):
            for _ in range(3):
                send(Turn("probe", s, [FAST]), rr, [node])

        threads = [threading.Thread(target=turns_through, args=(s, node, random.Random(r.random())),
                                    daemon=True) for s in probes for node in nodes]
        for th in threads:
            th.start()
        if r.random() < 0.5 and node_lock.acquire(timeout=1.0):
            try:
                kill_node(owner, f" right after NATS server {server.name} came back")
            finally:
                node_lock.release()
        for th in threads:
            th.join(timeout=3 * TURN_BOUND)
    t0 = time.monotonic()
    ready = wait_nats_ready(nats)
    with lock:
        nats_busy[-1][1] = time.monotonic()
    if ready:
        say(f"   NATS servers all ready {time.monotonic() - t0:.1f} s after {server.name} came "
            f"back")


def nats_faults(r, n, halt):
    """`n` NATS faults, one at a time (each waits until all three servers are ready again),
    2-6 s apart, while the node faults go on."""
    for _ in range(n):
        if halt.wait(r.uniform(2.0, 6.0)):
            return
        nats_fault(r)


def owner_at(node, session):
    """The owner of `session` as `node` reports it (None without an answer within 1 s)."""
    try:
        status, text = request(node.base, "GET", f"/v1/sessions/{session.sid}", timeout=1.0)
        return json.loads(text).get("node") if status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None


def nats_overlap(since):
    """Whether a NATS fault was under way at some moment since `since`."""
    with lock:
        return any(e is None or e > since for _, e in nats_busy)


def mid_call(victim, pause, r):
    """Sessions made on `victim`, two turns started through other nodes, `victim` killed (or
    paused past its lease) while their first calls run; their retries checked."""
    what = "pause-mid-call" if pause else "kill-mid-call"
    others = [n for n in nodes if n is not victim]
    made = []
    for _ in range(2):
        s, placed = create_session(r, via=victim)
        if placed is not None and placed != victim.name:
            finding(f"{what}: a session made through {victim.name} was placed on {placed}")
        made.append(s)
    owned = ([] if pause else [sid for sid, o in owners().items() if o == victim.name]
             + [s.sid for s in made])
    shapes = [[LONG_LINE_FIRST, FAST], [LONG_SLOW, FAST]]
    pending = [Turn("target", s, shape) for s, shape in zip(made, shapes)]
    halt = threading.Event()
    for t in pending:
        threading.Thread(target=send, args=(t, random.Random(r.random()), others, 30, halt),
                         daemon=True).start()
    direct = {}
    if pause:
        # A copy sent to the victim itself: it waits in its socket while the victim is stopped.
        def direct_copy(t=pending[0]):
            try:
                direct[t.turn_id] = request(victim.base, "POST",
                                            f"/v1/sessions/{t.session.sid}/dispatch", t.body,
                                            t.turn_id, timeout=TURN_BOUND)
            except (OSError, http.client.HTTPException) as e:
                direct[t.turn_id] = (None, str(e))
        direct_thread = threading.Thread(target=direct_copy, daemon=True)
        direct_thread.start()
    waited = time.monotonic()
    until = waited + 10
    while time.monotonic() < until and not on_disk(pending[0].session, pending[0].ids[0]):
        time.sleep(0.05)
    seen = time.monotonic()
    if not on_disk(pending[0].session, pending[0].ids[0]):
        # A call starts once its intent is in JetStream: with a NATS server down or catching up
        # meanwhile that can take longer (as failovers then do, reported apart). What a call
        # must never do — run twice, or be answered two ways — the ledger checks either way.
        with lock:
            overlap = any(b < seen and (e is None or e > waited) for b, e in nats_busy)
        if overlap:
            finding(f"{what}: the first call did not start within 10 s while a NATS fault "
                    f"overlapped: not judged")
        else:
            violation(f"{what}: the first call did not start within 10 s", f"{what}: no start")
    time.sleep(0.3)
    halt.set()                          # the first copies are left to fail
    # Which first calls had started at the fault (a line in started.txt, written before any
    # sleep); each is still running (4-5 s) if the fault comes within 3 s of the first line.
    started_at_fault = {t.turn_id: started_mark(t.session, t.ids[0]) for t in pending}
    # The owner just before the fault: a node that cannot renew its lease (a NATS fault) lets
    # its sessions go, and another node may have taken one and be running its call — then the
    # fault does not interrupt it, and its retry is rightly answered from its own run.
    moved = set()
    for t in pending:
        owner = owner_at(victim, t.session)
        if owner != victim.name:
            moved.add(t.turn_id)
            if started_at_fault[t.turn_id]:
                during = ("a NATS fault overlapped" if nats_overlap(waited)
                          else "no NATS fault overlapped")
                finding(f"{what}: {t.session.sid} was owned by {owner or 'no node that said'}, "
                        f"not {victim.name}, at the fault ({during}): not judged")
            started_at_fault[t.turn_id] = False
    if pause:
        victim.stopped = True
        signal_proc(victim.proc, signal.SIGSTOP)
        count("node stops")
        count("node stops past the lease TTL")
        event(f"SIGSTOP node {victim.name} mid-call (targeted), until its sessions moved")
        t0 = time.monotonic()
    else:
        t0 = time.monotonic()
        victim.kill()
        count("node kills")
        event(f"kill -9 node {victim.name} mid-call (targeted, owning {len(owned)} sessions)")
    cut = {t.turn_id: not on_disk(t.session, t.ids[1]) and t.turn_id not in moved
           for t in pending}                                                  # c1 not started
    late = time.monotonic() - seen
    if late > 3.0:
        finding(f"{what}: the fault came {late:.1f} s after the first line (the first calls "
                f"may have finished): not judged")
        for t in pending:
            started_at_fault[t.turn_id] = cut[t.turn_id] = False
    # Each turn's second call never started (bash runs its calls one after the other; the first
    # was still running): a retry through the other nodes must run it.
    got = {}
    threads = [threading.Thread(target=lambda t=t: got.__setitem__(
        t.turn_id, send(t, random.Random(r.random()), others)), daemon=True) for t in pending]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=TURN_BOUND + 5)
    if pause:
        say(f"   {what}: sessions answered elsewhere {time.monotonic() - t0:.1f} s after the "
            f"stop; SIGCONT")
        signal_proc(victim.proc, signal.SIGCONT)
        victim.stopped = False
        direct_thread.join(timeout=TURN_BOUND + 5)
        status, text = direct.get(pending[0].turn_id, (None, "no answer"))
        if status != 200:
            violation(f"{what}: the copy sent to the paused {victim.name} was answered "
                      f"HTTP {status}: {str(text)[:300]}",
                      f"{what}: the paused node's copy not answered 200")
        else:
            blocks = [json.dumps(b) for b in json.loads(text)["content"]]
            with lock:
                for i, b in zip(pending[0].ids, blocks):
                    answers[i].append((victim.name, b))
            if blocks != pending[0].blocks:
                violation(f"{what}: the paused {victim.name}, continued, answered "
                          f"{pending[0].turn_id} otherwise than the new owner: {blocks} != "
                          f"{pending[0].blocks}", f"{what}: the fenced node's answer differs")
    else:
        tries = victim.start()
        victim.restarts += 1
        say(f"   node {victim.name} restarted after {time.monotonic() - t0:.1f} s ({tries} tries)")
        wait_failover(victim, owned, t0, [t.session.sid for t in pending])
    for t in pending:
        blocks = got.get(t.turn_id)
        if blocks is None:
            continue
        first, second = answer_code(blocks[0]), answer_code(blocks[1])
        if not started_at_fault[t.turn_id]:
            count("targeted: first call not started (or not judged) at the fault")
        elif first != "outcome_unknown":
            violation(f"{what}: {t.ids[0]} was running when {victim.name} "
                      f"{'stopped' if pause else 'died'}; its retry was answered {first}, not "
                      f"outcome_unknown: {json.loads(blocks[0])['content'][:200]} — the "
                      f"session's last requests: {t.session.history()}",
                      f"{what}: an interrupted call's retry not outcome_unknown")
        else:
            count("targeted: interrupted calls answered outcome_unknown")
        if second == "outcome_unknown" and cut[t.turn_id]:
            violation(f"{what}: {t.ids[1]} answered outcome_unknown, but it never started (the "
                      f"first call of its turn was still running at the fault, and no line of "
                      f"it is on disk)", f"{what}: outcome_unknown for a call that never started")
        elif second == "ok":
            count("targeted: never-started calls run on the retry")


def phase_faults():
    r = random.Random(SEED + 2)
    kinds = (["kill"] * KILLS + ["stop"] * STOPS
             + ["kill-mid-call", "pause-mid-call"] * TARGETED)
    r.shuffle(kinds)
    load = Load(list(sessions_for_load))
    load.start()
    time.sleep(2.0)
    done = 0
    long_stop = False
    halt_nats = threading.Event()
    nats_thread = threading.Thread(target=nats_faults,
                                   args=(random.Random(SEED + 4), NATS_FAULTS, halt_nats),
                                   daemon=True)
    nats_thread.start()
    try:
        for kind in kinds:
            if time.monotonic() > deadline_all - RESEND_RESERVE - 20:
                violation(f"only {done} of {len(kinds)} faults in time "
                          f"(CLUSTER_FAULT_TIME_LIMIT={TIME_LIMIT})", "faults not all done in time")
                break
            with node_lock:
                victim = r.choice(nodes)
                if kind == "kill":
                    kill_node(victim)
                elif kind == "stop":
                    long_stop = not long_stop
                    stop_node(victim, r.uniform(TTL + 1, TTL + 3) if long_stop
                              else r.uniform(1, 3))
                else:
                    mid_call(victim, kind == "pause-mid-call", r)
            done += 1
            time.sleep(r.uniform(0.5, 1.5))
        # The NATS faults left finish (bounded by the time left).
        nats_thread.join(timeout=max(0.0, deadline_all - RESEND_RESERVE - time.monotonic()))
        time.sleep(1.0)
    finally:
        halt_nats.set()
        nats_thread.join(timeout=READY_BOUND + 10)
        load.stop()
    nats_done = stats["NATS kills"] + stats["NATS stops"]
    if nats_done < NATS_FAULTS:
        violation(f"only {nats_done} of {NATS_FAULTS} NATS faults in time", "faults not all done "
                  "in time")
    say(f"faults done: {done} of {len(kinds)} node faults, {nats_done} NATS faults")


# -- phase 3: every turn once more -----------------------------------------------------------------

def phase_resend():
    # Every turn once more (one left unanswered on purpose — a probe's turn while its NATS
    # server was down — gets its first answer here).
    with lock:
        answered = [t for t in turns if not t.abandoned]
    by_session = collections.defaultdict(list)
    for t in answered:
        by_session[t.session.sid].append(t)
    until = deadline_all - 10
    left = [0]

    def one(k, ts):
        r = random.Random(SEED * 7 + k)
        for t in ts:
            if time.monotonic() > until:
                with lock:
                    left[0] += 1
                continue
            before = t.blocks
            got = send(t, r)
            if got is None:
                continue
            if before is None:
                count("final re-send: a turn's first answer")
            elif got != before:
                violation(f"{t.turn_id} ({t.ids[0]}…) re-sent at the end: answered otherwise "
                          f"than first: {got} != {before}", "the final re-send differs")
            else:
                count("final re-send: the first answer, byte for byte")

    threads = [threading.Thread(target=one, args=(k, ts), daemon=True)
               for k, ts in enumerate(by_session.values())]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=max(1.0, until - time.monotonic()) + TURN_BOUND)
    if left[0]:
        finding(f"the final re-send ran out of time: {left[0]} of {len(answered)} turns not "
                f"re-sent")


# -- the checks ------------------------------------------------------------------------------------

def started_mark(session, tool_use_id):
    try:
        with open(os.path.join(session.workspace, "started.txt")) as f:
            return any(line.strip() == tool_use_id for line in f)
    except FileNotFoundError:
        return False


def on_disk(session, tool_use_id):
    try:
        with open(session.ledger) as f:
            return sum(1 for line in f if line.strip() == tool_use_id)
    except FileNotFoundError:
        return 0


def ledger_check():
    phase_now[0] = "ledger"
    on_disk_count = collections.Counter()
    for ws in {s.workspace for s in sessions}:
        path = os.path.join(ws, "ledger.txt")
        if os.path.exists(path):
            for line in open(path):
                if line.strip():
                    on_disk_count[line.strip()] += 1
    unknown = collections.Counter()
    final = {}
    for i, (turn, k) in calls.items():
        got = answers.get(i, [])
        if on_disk_count[i] > 1:
            violation(f"{i} ran {on_disk_count[i]} times (its line is {on_disk_count[i]} times "
                      f"in the ledger)", "ran more than once")
        if not got:
            if turn.abandoned:
                continue                # reported when it was abandoned
            violation(f"{i} was never answered{' (but ran)' if on_disk_count[i] else ''}",
                      "never answered")
            continue
        contents = collections.OrderedDict()
        for via, b in got:
            contents.setdefault(b, []).append(via)
        if len(contents) > 1:
            shown = "; ".join(f"via {','.join(v)}: {b}" for b, v in contents.items())
            violation(f"{i} answered with different content: {shown[:600]}",
                      "answered with different content")
        final[i] = answer_code(got[0][1])
        content = json.loads(got[0][1]).get("content", "")
        if final[i] == "ok" and on_disk_count[i] == 0:
            violation(f"{i} answered ok but its line is not on disk", "ok without its line on disk")
        if final[i] != "ok" and "not run" in str(content) and on_disk_count[i]:
            violation(f"{i} answered 'not run' but its line is on disk: {str(content)[:200]}",
                      "'not run' with its line on disk")
        if final[i] not in ("ok", "outcome_unknown"):
            count(f"final answers other than ok/outcome_unknown: {final[i]}")
    for i, (turn, k) in calls.items():
        if final.get(i) != "outcome_unknown":
            continue
        if on_disk_count[i]:
            unknown["line on disk"] += 1
        elif k == 0:
            unknown["first of its turn (could have started)"] += 1
        else:
            before = turn.ids[k - 1]
            if on_disk_count[before] > 0 or final.get(before) not in (None, "outcome_unknown"):
                unknown["its predecessor ran (could have started)"] += 1
            elif final.get(before) == "outcome_unknown":
                unknown["its predecessor was decided outcome_unknown (a later copy could start "
                        "it)"] += 1
            else:
                unknown["never started"] += 1
                violation(f"{i} answered outcome_unknown but never started: its predecessor "
                          f"{before} in the same serial turn has no answer",
                          "outcome_unknown for a call that never started")
    for i in on_disk_count:
        if i not in calls:
            violation(f"a ledger line no call wrote: {i}", "a ledger line no call wrote")
    return on_disk_count, final, unknown


def node_log_findings():
    for n in nodes:
        try:
            text = open(n.log, errors="replace").read()
        except OSError:
            continue
        panics = [line for line in text.splitlines() if "panicked at" in line]
        if panics:
            finding(f"node {n.name}'s log has {len(panics)} panics, first: {panics[0][:300]}")


# -- the run ---------------------------------------------------------------------------------------

sessions_for_load = []
current = {}                   # load client -> the session it uses now


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    took = {}
    crashed = False
    try:
        for path in (BINARY, NATS_BIN):
            if not os.access(path, os.X_OK):
                raise Abort(f"not an executable: {path}")
        ports = free_ports(9)
        for i in range(3):
            nats.append(NatsServer(i, ports[3 * i], ports[3 * i + 1], ports[3 * i + 2],
                                   [ports[3 * j + 1] for j in range(3) if j != i]))
        for s in nats:
            s.start()
        if not wait_nats_ready(nats):
            raise Abort("the NATS cluster did not start")
        urls = ",".join(s.url for s in nats)
        say(f"NATS cluster ready: {urls} (sync_interval: always)")
        for name in NODE_NAMES:
            nodes.append(Node(name, urls))
            nodes[-1].start()
        say("nodes " + ", ".join(f"{n.name} at {n.base}" for n in nodes)
            + f" (lease TTL {TTL_TEXT}, one workspace root {root})")

        for number, name, func in [("1", "relay", phase_relay), ("2", "faults", phase_faults),
                                   ("3", "resend", phase_resend)]:
            if name == "faults":
                r = random.Random(SEED + 3)
                for k in range(SESSIONS):
                    s, _ = create_session(r, via=nodes[k % len(nodes)])
                    sessions_for_load.append(s)
            phase_now[0] = name
            begun = time.monotonic()
            say(f"== phase {number}: {name}")
            func()
            took[name] = time.monotonic() - begun
            say(f"   {name}: {took[name]:.1f} s")
    except Abort as e:
        violation(f"aborted: {e}", "aborted")
        crashed = True
    except Exception:
        violation("crashed: " + traceback.format_exc(), "the test crashed")
        crashed = True
    finally:
        cleanup()

    node_log_findings()
    on_disk_count, final, unknown = ledger_check() if not crashed or calls else ({}, {}, {})
    print()
    n_turns = len(turns)
    print(f"== summary (seed {SEED}, {time.monotonic() - started:.0f} s, lease TTL {TTL_TEXT}, "
          f"{len(sessions)} sessions, {n_turns} turns, {len(calls)} calls, "
          f"{sum(on_disk_count.values())} ledger lines)")
    print("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()))
    print(f"faults: node kills {stats['node kills']}, node stops {stats['node stops']} "
          f"({stats['node stops past the lease TTL']} past the TTL), NATS kills "
          f"{stats['NATS kills']}, NATS stops {stats['NATS stops']}; node restarts "
          f"{sum(n.restarts for n in nodes)}")
    kinds = collections.Counter(final.values())
    print(f"final answers by kind: {dict(kinds)}")
    print("answers received (every copy): "
          + str({k[8:]: v for k, v in stats.items() if k.startswith("answers ")}))
    print("re-sent after: " + str({k[15:]: v for k, v in sorted(stats.items())
                                   if k.startswith("re-sent after: ")}))
    if unknown:
        print(f"outcome_unknown: {dict(unknown)}")
    others = {k: v for k, v in stats.items()
              if not k.startswith(("answers ", "re-sent after: ", "node ", "NATS "))}
    if others:
        print(f"counts: {others}")
    target_f = TTL + 1.0
    p50, p99 = percentile(failover_kill, 0.5), percentile(failover_kill, 0.99)
    met_f = bool(failover_kill) and p99 <= target_f
    print(f"failover (kill -9 of an owner -> first answer for one of its sessions at another "
          f"node), n={len(failover_kill)}: p50 {p50:.2f} s, p99 {p99:.2f} s; per session "
          f"(n={len(failover_each)}): p50 {percentile(failover_each, 0.5):.2f} s, p99 "
          f"{percentile(failover_each, 0.99):.2f} s; target p99 <= TTL + 1 s = {target_f:.1f} s: "
          f"{'met' if met_f else 'MISSED' if failover_kill else 'no sample'}"
          + (f" (kills during a NATS fault, not counted, n={len(failover_nats)}: "
             + ", ".join(f"{x:.2f} s" for x in sorted(failover_nats)) + ")"
             if failover_nats else ""))
    loc, rel = relay_times["local"], relay_times["relayed"]
    if loc and rel:
        over50 = percentile(rel, 0.5) - percentile(loc, 0.5)
        over99 = percentile(rel, 0.99) - percentile(loc, 0.99)
        met_r = over50 <= 0.3
        print(f"relay overhead (quiet, a one-call noop turn, n={len(loc)}+{len(rel)}): local p50 "
              f"{percentile(loc, 0.5):.3f} ms p99 {percentile(loc, 0.99):.3f} ms; relayed p50 "
              f"{percentile(rel, 0.5):.3f} ms p99 {percentile(rel, 0.99):.3f} ms; overhead p50 "
              f"{over50:+.3f} ms p99 {over99:+.3f} ms; target p50 <= 0.3 ms: "
              f"{'met' if met_r else 'MISSED'}")
    else:
        met_r = False
        print("relay overhead: no sample")
    if ENFORCE_TARGETS:
        if not met_f:
            violation(f"failover p99 {p99:.2f} s over TTL + 1 s = {target_f:.1f} s",
                      "failover target missed", "targets")
        if not met_r:
            violation("relay overhead over 0.3 ms at p50", "relay target missed", "targets")
    for phase, text in findings:
        print(f"FINDING [{phase}] {text}")
    if violations:
        print(f"FAIL: {len(violations)} violations; by check:")
        tally = collections.Counter((phase, check) for phase, _, check in violations)
        for (phase, check), n in tally.items():
            print(f"  {n:4}  [{phase}] {check}")
        for phase, text, _ in violations:
            print(f"FAIL [{phase}] {text}")
        print(f"(left for inspection, with the node and NATS logs: {tmp})")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("cluster fault test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
