#!/usr/bin/env python3
"""Fault test of the call journal: `switchboard serve --journal` under six kinds of fault, with a
side-effect load and clients that re-send every unanswered turn (same ids, same arguments) until
it is answered.

Every call is a side-effect tool (bash) that appends its own tool_use_id to `ledger.txt` in its
session's workspace and prints a random number (a second run would answer differently):
`echo ID >> ledger.txt`, some slow (`sleep 0.2` before or after the line). A turn holds 1 to 3
calls, which run one after the other (bash is exclusive). The phases:

  1. kill9      SIGKILL at random moments (FAULT_KILLS, default 30), restarted each time; then
                one kill at a known moment: first calls running, their successors not started.
  2. sigstop    SIGSTOP for 1-3 s, then SIGCONT (FAULT_STOPS, default 4): the clients' requests
                time out (1 s) and are re-sent while the first copy waits in the stopped server.
  3. fulldisk   the journal on a 4 MiB tmpfs, filled with a filler file: side-effect calls must be
                refused (error answers, nothing runs) and /healthz should say the journal fails
                (a FINDING if not); the filler deleted, calls must work again without a restart
                and the answers acknowledged before come back byte for byte. Needs `mount`
                (root); without it the phase prints SKIPPED (a failure when FAULT_REQUIRE_ALL=1).
  4. clockstep  the shortest --journal-retention accepted is found (0s must be refused, with a
                message naming the retention); calls interrupted by SIGKILL (their line on disk),
                then a restart under libfaketime 25 h ahead, once with the default retention and
                once with that floor: an interrupted call's retry must be outcome_unknown, an
                answered turn's its stored answer; nothing runs again.
  5. damage     with the server stopped, copies of the journal damaged five ways (0 bytes, first
                4 KiB zeroed, truncated to half, a bit flipped in a data page, a bit flipped in the
                primary commit slot in the first 512 bytes), and its log three or four (cut to
                half, 0 bytes; when the marker is only in the log — SIGKILL before a checkpoint —
                a bit flipped in its group, and the log removed), for a journal closed by SIGTERM
                and one left by SIGKILL: `serve` must exit non-zero naming the damaged file and
                `mv`, never start; the good copies put back answer as before.
  6. maxsessions 12 sessions journaled, a restart with --max-sessions 4, then with the default:
                no session is forgotten, each answers its stored answers byte for byte.

Phases 1, 2 and 5 share a journal; 3, 4 and 6 each have a fresh one. At the end, for every id:
  * its line appears at most once in the ledgers (no call ran twice);
  * it has exactly one final answer, the same content on every copy received;
  * an `ok` answer's line is on disk; a "not run" refusal's line is not;
  * `outcome_unknown` only for a call that had started: its line is on disk, or the server could
    have started it (the first call of its turn, or its predecessor in the turn ran). A later call
    whose predecessor never ran, answered outcome_unknown, is a violation.
A summary per phase (kills, stops, answers by kind, violations) is printed; the exit code is 1 when
there is any violation, each one listed.

Bounded: each phase has its own time bound (PHASE_BOUND), the whole run at most 6 minutes. Loopback
only (every server on 127.0.0.1 port 0, no token). Only the processes this test started are
signalled, by their own pid. FAULT_SEED seeds it; FAULT_PHASES (e.g. "1,5") runs some phases only.

Usage: fault-test.py PATH/TO/switchboard
"""

import collections
import glob
import http.client
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

BINARY = os.path.abspath(sys.argv[1])
SEED = int(os.environ.get("FAULT_SEED", "20261205"))
KILLS = int(os.environ.get("FAULT_KILLS", "30"))
STOPS = int(os.environ.get("FAULT_STOPS", "4"))
REQUIRE_ALL = os.environ.get("FAULT_REQUIRE_ALL") == "1"
PHASES = [p.strip() for p in os.environ.get("FAULT_PHASES", "1,2,3,4,5,6").split(",") if p.strip()]
TIME_LIMIT = 6 * 60            # the whole run
PHASE_BOUND = {"kill9": 60, "sigstop": 45, "fulldisk": 60, "clockstep": 75, "damage": 60,
               "maxsessions": 45}
STARTUP_BOUND = 20             # seconds for `serve` to listen, or to exit on a bad journal
LOAD_SESSIONS = 6
CLOCK_STEP = "+25h"
RETENTION_LADDER = ["0s", "1s", "1m", "10m", "1h", "6h", "24h"]

rng = random.Random(SEED)
started = time.monotonic()
deadline_all = started + TIME_LIMIT
tmp = tempfile.mkdtemp(prefix="switchboard-fault-")
root = os.path.join(tmp, "ws")

# -- what the run saw ------------------------------------------------------------------------------

lock = threading.Lock()
turns = []                     # every Turn made
calls = {}                     # tool_use_id -> (Turn, index in the turn)
answers = collections.defaultdict(list)    # tool_use_id -> [(phase, block JSON)] every copy
violations = []                # (phase, text, check)
findings = []                  # (phase, text): worth knowing, not a failure
notes = collections.defaultdict(list)      # phase -> lines for the summary
stats = collections.OrderedDict()          # phase -> dict of counters
processes = []                 # every process started (ended in the finally, by pid)
ids = itertools.count(1)


def violation(phase, text, check=None):
    """Records a failure; `check` names the rule for the summary's tally (default: the text)."""
    with lock:
        violations.append((phase, text, check or text))
    print(f"  VIOLATION [{phase}] {text}", flush=True)


# "outcome_unknown only for calls that had started" holds since each intent is written right
# before its own call starts (an engine that writes a turn's intents up front answers a serial
# call that never started outcome_unknown). FAULT_PRECISE_INTENTS=1 (set by .ci/run) makes it a
# failure; without it, a finding (for running this test against an older binary).
PRECISE_INTENTS = os.environ.get("FAULT_PRECISE_INTENTS") == "1"


def never_started(phase, text, check):
    """A call answered outcome_unknown that never started (see PRECISE_INTENTS)."""
    if PRECISE_INTENTS:
        violation(phase, text, check)
    else:
        finding(phase, f"known open (precise intents): {text}")


def finding(phase, text):
    with lock:
        findings.append((phase, text))
    print(f"  FINDING [{phase}] {text}", flush=True)


def note(phase, text):
    with lock:
        notes[phase].append(text)


def count(phase, key, n=1):
    with lock:
        stats.setdefault(phase, collections.Counter())[key] += n


def say(text):
    print(f"[{time.monotonic() - started:6.1f} s] {text}", flush=True)


class Session:
    def __init__(self, sid, workspace, tag):
        self.sid, self.workspace, self.tag = sid, workspace, tag

    @property
    def ledger(self):
        return os.path.join(self.workspace, "ledger.txt")


class Turn:
    """One assistant message of bash calls; re-sent with the same body until answered."""

    def __init__(self, phase, session, commands, read=None):
        n = next(ids)
        self.phase, self.session = phase, session
        self.blocks = None     # the first answer received (block JSON per call)
        if read is not None:   # one read_file call (not in the ledger check)
            self.ids, self.commands = [read[0]], []
            self.body = json.dumps({"role": "assistant", "content": [
                {"type": "tool_use", "id": read[0], "name": "read_file",
                 "input": {"path": read[1]}}]})
            with lock:
                turns.append(self)
            return
        self.ids = [f"{phase}-{session.tag}-t{n}-c{k}" for k in range(len(commands))]
        self.commands = [c.replace("ID", i) for c, i in zip(commands, self.ids)]
        self.body = json.dumps({"role": "assistant", "content": [
            {"type": "tool_use", "id": i, "name": "bash", "input": {"command": c}}
            for i, c in zip(self.ids, self.commands)]})
        with lock:
            turns.append(self)
            for k, i in enumerate(self.ids):
                calls[i] = (self, k)


# Each prints a random number after its line: a second run would also answer differently.
FAST = "echo ID >> ledger.txt; echo $RANDOM"
SLOW = "sleep 0.2; echo ID >> ledger.txt; echo $RANDOM"
LINE_FIRST = "echo ID >> ledger.txt; sleep 0.2; echo $RANDOM"


def random_commands():
    return [rng.choices([FAST, SLOW, LINE_FIRST], [5, 3, 2])[0]
            for _ in range(rng.choice([1, 1, 2, 3]))]


def answer_code(block_json):
    block = json.loads(block_json)
    if not block.get("is_error"):
        return "ok"
    m = re.match(r"Error \[(\w+)\]", block.get("content") if isinstance(block.get("content"), str)
                 else "")
    return m.group(1) if m else "error"


# -- the server ------------------------------------------------------------------------------------

def libfaketime():
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


class Server:
    """One `serve --journal` process at a time; `up` is set while it serves."""

    def __init__(self, journal):
        self.journal = journal
        self.proc = None
        self.base = None
        self.lines = []
        self.up = threading.Event()

    @property
    def file(self):
        return os.path.join(self.journal, "journal.redb")

    @property
    def log(self):
        """The journal's write-ahead log (a flush's records are there until a checkpoint)."""
        return os.path.join(self.journal, "journal.log")

    def launch(self, extra=(), fake=None):
        """Starts serve; True once it listens, False if it exited (or never listened) within
        STARTUP_BOUND — then `self.lines` holds what it said and `self.proc.returncode` its exit."""
        env = dict(os.environ)
        if fake:
            # The library of the `faketime` package, preloaded into the server itself (the
            # `faketime` wrapper would fork, and the pid this test signals would not be the
            # server's). The monotonic clock is left alone, as a real clock step leaves it.
            env.update(LD_PRELOAD=libfaketime(), FAKETIME=fake, FAKETIME_DONT_FAKE_MONOTONIC="1")
        proc = subprocess.Popen(
            [BINARY, "serve", "--workspace-root", root, "--journal", self.journal,
             "--listen", "127.0.0.1:0", "--no-auth", "--log-format", "text", "--grace", "2s",
             *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=env)
        processes.append(proc)
        self.proc, self.lines, self.base = proc, [], None
        listening = threading.Event()
        lines = self.lines

        def read():
            for line in proc.stderr:
                lines.append(line.rstrip("\n"))
                m = re.search(r"listening on (\S+)", line)
                if m and not listening.is_set():
                    self.base = m.group(1).rstrip("/")
                    listening.set()
            listening.set()

        threading.Thread(target=read, daemon=True).start()
        listening.wait(timeout=STARTUP_BOUND)
        if proc.poll() is None and self.base and any("listening on" in x for x in lines):
            self.up.set()
            return True
        if proc.poll() is None:
            self.signal(signal.SIGKILL)
            proc.wait()
        else:
            proc.wait()
        return False

    def start(self, phase, extra=(), fake=None):
        if not self.launch(extra, fake):
            raise PhaseAbort(f"the server did not start (exit {self.proc.returncode}): "
                             + " | ".join(self.lines[-5:]))

    def signal(self, sig):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self):
        self.up.clear()
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, phase):
        """SIGTERM, and SIGKILL if it has not exited within 20 s."""
        self.up.clear()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            finding(phase, "the server did not exit within 20 s of SIGTERM; killed")
            self.kill()


class PhaseAbort(Exception):
    """The phase cannot go on (a server that does not start, a time bound)."""


def in_time(deadline):
    if time.monotonic() > deadline:
        raise PhaseAbort("out of time (its bound passed)")


def request(base, method, path, body=None, timeout=10.0):
    req = urllib.request.Request(base + path, method=method,
                                 data=body.encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def new_sessions(server, phase, n):
    out = []
    for k in range(n):
        status, text = request(server.base, "POST", "/v1/sessions", "{}")
        if status != 201:
            raise PhaseAbort(f"creating a session: HTTP {status}: {text}")
        s = json.loads(text)
        out.append(Session(s["session_id"], s["workspace"], f"s{k}"))
    return out


def send(server, turn, phase, deadline, timeout=10.0, halt=None):
    """Sends `turn` until it is answered; returns its blocks (JSON text each), the code of a
    refusal that names the session ("unknown_session", "too_many_sessions"), or None (another
    refusal, recorded as a violation; the deadline; `halt` set)."""
    while True:
        if time.monotonic() > deadline or (halt is not None and halt.is_set()):
            return None
        if not server.up.wait(timeout=0.5):
            continue
        base = server.base
        try:
            status, text = request(base, "POST", f"/v1/sessions/{turn.session.sid}/dispatch",
                                turn.body, timeout)
        except (OSError, http.client.HTTPException) as e:
            if "timed out" in str(e):
                count(phase, "request timeouts (re-sent)")
            time.sleep(0.02)
            continue
        if status == 503:                       # overloaded, shutting down: later
            time.sleep(0.1)
            continue
        if status == 404 and '"unknown_session"' in text:
            return "unknown_session"
        if status == 429 and '"too_many_sessions"' in text:
            return "too_many_sessions"
        if status != 200:
            violation(phase, f"turn {turn.ids[0]}…: HTTP {status}: {text[:300]}")
            return None
        blocks = [json.dumps(b) for b in json.loads(text)["content"]]
        got = [json.loads(b)["tool_use_id"] for b in blocks]
        if got != turn.ids:
            violation(phase, f"answered {got} for {turn.ids}")
            return None
        with lock:
            for i, b in zip(turn.ids, blocks):
                answers[i].append((phase, b))
            if turn.blocks is None:
                turn.blocks = blocks
        for b in blocks:
            count(phase, f"answers {answer_code(b)}")
        return blocks


def send_or_flag(server, turn, phase, deadline, timeout=10.0):
    got = send(server, turn, phase, deadline, timeout)
    if isinstance(got, str):
        violation(phase, f"session {turn.session.sid}: {got} when {turn.ids[0]} was sent")
        return None
    return got


def resend_stored(server, phase, old_turns, deadline, what):
    """Re-sends answered turns; each must be answered with its stored bytes."""
    for t in old_turns:
        got = send_or_flag(server, t, phase, deadline)
        if got is None:
            continue
        if got != t.blocks:
            violation(phase, f"{what}: {t.ids[0]}… answered differently from its stored answer: "
                             f"{got} != {t.blocks}", f"{what}: not the stored answer")
        else:
            count(phase, f"{what}: stored answers matched")


class Load:
    """One client thread per session: turn after turn, each re-sent until answered."""

    def __init__(self, phase, server, sessions, deadline, timeout=10.0):
        self.phase, self.server, self.sessions = phase, server, sessions
        self.deadline, self.timeout = deadline, timeout
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(s,), daemon=True)
                        for s in sessions]

    def client(self, session):
        while not self.halt.is_set() and time.monotonic() < self.deadline:
            turn = Turn(self.phase, session, random_commands())
            got = send_or_flag(self.server, turn, self.phase, self.deadline, self.timeout)
            if got is None:
                return

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.halt.set()
        for t in self.threads:
            t.join(timeout=max(1.0, self.deadline - time.monotonic()) + 5)
        if any(t.is_alive() for t in self.threads):
            violation(self.phase, "a client never got its last turn answered")


# -- the phases ------------------------------------------------------------------------------------

journal_a = os.path.join(tmp, "journal-a")      # phases 1, 2, 5
server_a = Server(journal_a)
sessions_a = []


def phase_kill9(deadline):
    """SIGKILL at random moments under load, restarted each time."""
    server_a.start("kill9")
    sessions_a.extend(new_sessions(server_a, "kill9", LOAD_SESSIONS))
    with Load("kill9", server_a, sessions_a, deadline):
        for _ in range(KILLS):
            if time.monotonic() > deadline - 10:
                violation("kill9", f"only {stats['kill9']['kills']} of {KILLS} kills in time")
                break
            time.sleep(rng.uniform(0.1, 0.6))
            server_a.kill()
            count("kill9", "kills")
            server_a.start("kill9")
        time.sleep(1.0)
    # One kill more at a known moment: calls running, their successors in the turn not started.
    pending = interrupt(server_a, "kill9", sessions_a[:4])
    server_a.start("kill9")
    retry_interrupted(server_a, "kill9", pending, deadline, "a kill at a known moment")


def phase_sigstop(deadline):
    """SIGSTOP for 1-3 s, then SIGCONT; the clients time out after 1 s and re-send."""
    if server_a.proc is None or server_a.proc.poll() is not None:
        server_a.start("sigstop")
    if not sessions_a:
        sessions_a.extend(new_sessions(server_a, "sigstop", LOAD_SESSIONS))
    with Load("sigstop", server_a, sessions_a, deadline, timeout=1.0):
        for _ in range(STOPS):
            time.sleep(rng.uniform(0.3, 1.0))
            server_a.signal(signal.SIGSTOP)
            count("sigstop", "stops")
            time.sleep(rng.uniform(1.0, 3.0))
            server_a.signal(signal.SIGCONT)
        time.sleep(1.0)
    if not stats["sigstop"]["request timeouts (re-sent)"]:
        violation("sigstop", "no request timed out: the phase did not test re-sent requests")
    server_a.stop("sigstop")


def healthz_failing(base):
    """(failing?, what it said): failing if the status is not 200, its `status` is not ok, or a
    `journal` member says other than ok."""
    try:
        status, text = request(base, "GET", "/healthz", timeout=5)
    except (OSError, http.client.HTTPException) as e:
        return True, f"no answer: {e}"
    try:
        body = json.loads(text)
    except ValueError:
        return True, f"HTTP {status}: {text[:200]}"
    journal = body.get("journal")
    if isinstance(journal, dict):
        journal_failing = (journal.get("status", journal.get("state", "ok")) != "ok"
                           or journal.get("ok") is False or journal.get("healthy") is False
                           or bool(journal.get("error")))
    else:
        journal_failing = journal is not None and journal != "ok"
    failing = status != 200 or body.get("status") != "ok" or journal_failing
    shown = {k: v for k, v in body.items() if k != "sandbox"}
    return failing, f"HTTP {status} {json.dumps(shown)}"


def mounted_tmpfs(path):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if left.split()[4] == path and right.split()[0] == "tmpfs":
                return True
    return False


def fill(directory):
    """Writes a filler file until the file system is full; returns its path and size."""
    path = os.path.join(directory, "filler")
    size = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1 << 9):
            try:
                while True:
                    size += f.write(b"\0" * chunk)
            except OSError:
                pass
    return path, size


def phase_fulldisk(deadline):
    """The journal on a small tmpfs filled up: calls refused, then healed without a restart."""
    phase = "fulldisk"
    mnt = os.path.join(tmp, "fulldisk")
    os.makedirs(mnt)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt],
                           capture_output=True, text=True, timeout=20)
        reason = None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")
    except (OSError, subprocess.TimeoutExpired) as e:
        reason = str(e)
    if reason is None and not mounted_tmpfs(mnt):
        reason = "mount succeeded but /proc/self/mountinfo shows no tmpfs there"
        subprocess.run(["umount", mnt], capture_output=True)
    if reason is not None:
        print(f"SKIPPED fulldisk: cannot mount a tmpfs at {mnt}: {reason}", flush=True)
        count(phase, "skipped")
        if REQUIRE_ALL:
            violation(phase, f"skipped (FAULT_REQUIRE_ALL=1): cannot mount a tmpfs: {reason}")
        return
    server = Server(os.path.join(mnt, "journal"))
    try:
        server.start(phase)
        sessions = new_sessions(server, phase, 3)
        before = []
        for s in sessions:
            for _ in range(2):
                t = Turn(phase, s, random_commands())
                if send_or_flag(server, t, phase, deadline) is not None:
                    before.append(t)
        filler, size = fill(mnt)
        say(f"fulldisk: {len(before)} turns acknowledged; filler of {size >> 10} KiB written, "
            f"journal file {os.path.getsize(server.file) >> 10} KiB")

        # With the disk full, a side-effect call is refused (nothing runs) once a journal write
        # fails. Send one-call turns until the first refusal (bounded).
        refused = None
        ok_while_full = 0
        full_turns = []
        give_up = min(deadline - 25, time.monotonic() + 20)
        k = 0
        while refused is None and time.monotonic() < give_up:
            t = Turn(phase, sessions[k % 3], [FAST])
            full_turns.append(t)
            k += 1
            got = send_or_flag(server, t, phase, give_up)
            if got is None:
                break
            if answer_code(got[0]) == "ok":
                ok_while_full += 1
            else:
                refused = got[0]
        if refused is None:
            violation(phase, f"the journal's writes never failed with the disk full "
                             f"({ok_while_full} calls answered ok)")
            return
        say(f"fulldisk: refused after {ok_while_full} ok calls: {json.loads(refused)['content']}")
        count(phase, "ok while full", ok_while_full)
        failing, said = healthz_failing(server.base)
        if not failing:
            finding(phase, f"/healthz does not report the journal failing while its writes "
                           f"fail: {said}")
        else:
            say(f"fulldisk: /healthz while failing: {said}")
        # 3 more turns while full: refusals expected; an ok one is counted (the ledger check
        # still wants its line on disk, as for every ok).
        for j in range(3):
            t = Turn(phase, sessions[j], [FAST, FAST])
            full_turns.append(t)
            got = send_or_flag(server, t, phase, deadline)
            if got is not None and any(answer_code(b) == "ok" for b in got):
                count(phase, "ok while full (after the first refusal)")
        # A refusal: an error answer and nothing ran (no line).
        refusals = [i for t in full_turns if t.blocks for i, b in zip(t.ids, t.blocks)
                    if answer_code(b) != "ok" and not on_disk_count(t.session, i)]
        count(phase, "refused while full, nothing run", len(refusals))
        if not refusals:
            violation(phase, "no side-effect call was refused (an error answer, nothing run) "
                             "while the journal could not write")

        os.remove(filler)
        # Room again: calls must work again, without a restart (bounded: 15 s).
        healed = False
        last = None
        until = min(deadline - 8, time.monotonic() + 15)
        while time.monotonic() < until:
            t = Turn(phase, sessions[0], [FAST, FAST])
            got = send_or_flag(server, t, phase, until)
            if got is None:
                break
            if all(answer_code(b) == "ok" for b in got):
                healed = True
                break
            last = got[0]
            time.sleep(0.5)
        if healed:
            say("fulldisk: healed: calls are answered ok again")
            again_failing, said = healthz_failing(server.base)
            if again_failing and failing:
                violation(phase, f"/healthz still reports the journal failing after it healed: "
                                 f"{said}")
        else:
            violation(phase, "the journal did not heal: calls are still refused 15 s after the "
                             "filler was deleted (no restart): "
                             + (json.loads(last)["content"] if last else "no answer"))
        resend_stored(server, phase, before, deadline, "acknowledged before the disk filled")
    finally:
        server.kill()
        r = subprocess.run(["umount", mnt], capture_output=True, text=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", mnt], capture_output=True, text=True)


def probe_retention(phase, deadline):
    """Starts serve with each RETENTION_LADDER value on an empty journal until one is accepted;
    returns it (None if none)."""
    for value in RETENTION_LADDER:
        in_time(deadline)
        probe = Server(os.path.join(tmp, f"retention-probe-{value}"))
        if probe.launch(["--journal-retention", value]):
            probe.stop(phase)
            say(f"clockstep: --journal-retention {value} is accepted")
            note(phase, f"--journal-retention floor: {value} (the first accepted of "
                        f"{' '.join(RETENTION_LADDER)})")
            return value
        said = " | ".join(x for x in probe.lines if x.strip())[:400]
        say(f"clockstep: --journal-retention {value} refused (exit {probe.proc.returncode}): "
            f"{said}")
        note(phase, f"--journal-retention {value} refused: {said[:200]}")
        if probe.proc.returncode == 0:
            violation(phase, f"--journal-retention {value}: serve exited 0 without serving")
        elif "retention" not in said:
            violation(phase, f"--journal-retention {value} is refused without naming the "
                             f"retention: {said}")
    return None


LONG_LINE_FIRST = "echo ID >> ledger.txt; sleep 5; echo $RANDOM"
LONG_SLOW = "sleep 4; echo ID >> ledger.txt; echo $RANDOM"


def interrupt(server, phase, sessions):
    """Turns left running, then SIGKILL once the first line of every line-first call is on disk
    (and a moment more). Per session, in turn: [line first, 5 s], [line first, 5 s; fast],
    [4 s then line; fast], [line first, 5 s; fast; fast]. A first call that wrote its line had
    started and was interrupted; the later calls never started (bash calls run one after the
    other), unless a line of theirs (or the 4 s call's) was on disk at the kill: `t.cut` says
    which. Returns the turns."""
    shapes = [[LONG_LINE_FIRST], [LONG_LINE_FIRST, FAST], [LONG_SLOW, FAST],
              [LONG_LINE_FIRST, FAST, FAST]]
    pending = [Turn(phase, s, shapes[k % len(shapes)]) for k, s in enumerate(sessions)]
    halt = threading.Event()
    for t in pending:
        threading.Thread(target=send, args=(server, t, phase, time.monotonic() + 30, 30, halt),
                         daemon=True).start()
    until = time.monotonic() + 10
    while time.monotonic() < until:
        if all(on_disk_count(t.session, t.ids[0]) for t in pending
               if "sleep 5" in t.commands[0]):
            break
        time.sleep(0.05)
    else:
        violation(phase, "the interrupted calls did not start within 10 s")
    time.sleep(0.3)
    halt.set()
    server.kill()
    count(phase, "kills")
    for t in pending:
        t.cut = not any(on_disk_count(t.session, i) for i in t.ids[1:]) and (
            "sleep 5" in t.commands[0] or not on_disk_count(t.session, t.ids[0]))
    return pending


def retry_interrupted(server, phase, pending, deadline, what):
    """Re-sends the interrupted turns (in parallel: a call run again sleeps). A first call whose
    line was on disk at the kill must be answered outcome_unknown."""
    got = {}
    threads = [threading.Thread(target=lambda t=t: got.__setitem__(
        t, send_or_flag(server, t, phase, deadline)), daemon=True) for t in pending]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=max(1.0, deadline - time.monotonic()))
    for t in pending:
        blocks = got.get(t)
        if blocks is None:
            continue
        # The first call was still in its sleep at the kill (or had not started): the later
        # ones never started.
        for i, b in list(zip(t.ids, blocks))[1:] if t.cut else []:
            if answer_code(b) == "outcome_unknown":
                never_started(phase, f"{what}: {i} answered outcome_unknown, but it never started "
                                 f"(the first call of its turn was still running, or not yet "
                                 f"started, at the kill)", f"{what}: outcome_unknown for a "
                                 f"call after the interrupted one (never started)")
        if "sleep 5" not in t.commands[0]:
            continue
        first = answer_code(blocks[0])
        if first != "outcome_unknown":
            violation(phase, f"{what}: {t.ids[0]} was running at the kill (its line on disk); "
                             f"its retry was answered {first}, not outcome_unknown: "
                             f"{json.loads(blocks[0])['content'][:200]}",
                      f"{what}: an interrupted call's retry not outcome_unknown")
        else:
            count(phase, "interrupted calls answered outcome_unknown")


def on_disk_count(session, tool_use_id):
    try:
        with open(session.ledger) as f:
            return sum(1 for line in f if line.strip() == tool_use_id)
    except FileNotFoundError:
        return 0


def phase_clockstep(deadline):
    """Interrupted side-effect calls, then a restart 25 h ahead (default retention, then the
    shortest accepted one): retries are outcome_unknown or stored, never a second run."""
    phase = "clockstep"
    if not libfaketime():
        print("SKIPPED clockstep: libfaketime not installed (apt-get install faketime)")
        count(phase, "skipped")
        if REQUIRE_ALL:
            violation(phase, "skipped (FAULT_REQUIRE_ALL=1): libfaketime not installed")
        return
    floor = probe_retention(phase, deadline)
    if floor == "0s":
        violation(phase, "--journal-retention 0s is accepted: a retention too short to cover a "
                         "retry must be refused with a clear message")
    server = Server(os.path.join(tmp, "journal-d"))
    server.start(phase)
    sessions = new_sessions(server, phase, 4)
    rounds = [("default retention", [])]
    if floor is not None:
        short = floor if floor != "0s" else "1s"
        rounds.append((f"--journal-retention {short}", ["--journal-retention", short]))
    answered = []
    for what, extra in rounds:
        in_time(deadline)
        if server.proc is None or server.proc.poll() is not None:
            server.start(phase)                 # the real clock again
        for s in sessions:
            t = Turn(phase, s, random_commands())
            if send_or_flag(server, t, phase, deadline) is not None:
                answered.append(t)
        pending = interrupt(server, phase, sessions)
        server.start(phase, extra=extra, fake=CLOCK_STEP)
        say(f"clockstep: restarted {CLOCK_STEP} with {what}; re-sending "
            f"{len(pending)} interrupted and {len(answered)} answered turns")
        retry_interrupted(server, phase, pending, deadline, what)
        resend_stored(server, phase, answered, deadline, f"answered before the step ({what})")
        server.stop(phase)


def flip_bit(path, offset, bit=0):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def primary_slot(path):
    """Offset of redb's primary commit slot (byte 9 is the god byte; its bit 0 picks slot 0 at
    64 or slot 1 at 192, 128 bytes each, checksummed)."""
    with open(path, "rb") as f:
        header = f.read(512)
    return 192 if header[9] & 1 else 64


def damage_ways(good):
    """(what, how) for each way of damaging a copy of `good`; a marker's offsets are looked up
    by the caller."""
    size = os.path.getsize(good)
    slot = primary_slot(good)

    def zero_first_4k(p):
        with open(p, "r+b") as f:
            f.write(b"\0" * 4096)

    return [
        ("0-byte file", lambda p: os.truncate(p, 0)),
        ("first 4 KiB zeroed", zero_first_4k),
        ("truncated to half", lambda p: os.truncate(p, size // 2)),
        (f"a bit flipped in the first 512 bytes (primary commit slot, byte {slot + 16})",
         lambda p: flip_bit(p, slot + 16, 5)),
    ]


def what_opened(marker, phase, deadline):
    """What a server that started on a damaged journal holds: its sessions, the marker call."""
    known = 0
    for session in sessions_a:
        status, _ = request(server_a.base, "GET", f"/v1/sessions/{session.sid}")
        known += status == 200
    got = send(server_a, marker, phase, min(deadline, time.monotonic() + 5))
    if isinstance(got, str):
        held = f"the marker's session: {got}"
    elif got is None:
        held = "the marker call was not answered"
    elif got == marker.blocks:
        held = "the marker call (the last commit) answered as stored"
    else:
        held = "the marker call RAN AGAIN: the last commit was silently rolled back"
    return f"it opened with {known} of {len(sessions_a)} sessions; {held}"


def phase_damage(deadline):
    """A stopped server's journal damaged five ways: serve refuses each; the good copy answers.
    Twice: a journal closed by SIGTERM (its last commit two-phase) and one left by SIGKILL."""
    phase = "damage"
    if server_a.proc is None or server_a.proc.poll() is not None:
        server_a.start(phase)
    if not sessions_a:
        sessions_a.extend(new_sessions(server_a, phase, 3))
        for s in sessions_a:
            send_or_flag(server_a, Turn(phase, s, random_commands()), phase, deadline)
    answered = [t for t in turns if t.session in sessions_a and t.blocks is not None]
    sample = rng.sample(answered, min(30, len(answered)))
    markers = []
    for state, stop in [("closed by SIGTERM", lambda: server_a.stop(phase)),
                        ("left by SIGKILL", server_a.kill)]:
        if server_a.proc is None or server_a.proc.poll() is not None:
            server_a.start(phase)
        # A marker call: a read_file answer, written once, the last record before the stop; the
        # page holding it is a live data page of the last commit.
        s = sessions_a[0]
        token = f"damage-marker-{rng.getrandbits(48):012x}"
        with open(os.path.join(s.workspace, "marker.txt"), "w") as f:
            f.write(token)
        marker = Turn(phase, s, [], read=(token, "marker.txt"))
        if send_or_flag(server_a, marker, phase, deadline) is None:
            raise PhaseAbort("the marker call was not answered")
        markers.append(marker)
        stop()
        # A second run of the marker call (its record lost) would now answer differently.
        with open(os.path.join(s.workspace, "marker.txt"), "w") as f:
            f.write("changed after the call")
        good = os.path.join(tmp, "journal-a.good")
        good_log = os.path.join(tmp, "journal-a.log.good")
        shutil.copyfile(server_a.file, good)
        shutil.copyfile(server_a.log, good_log)
        data = open(good, "rb").read()
        where = [m.start() for m in re.finditer(re.escape(token.encode()), data)]
        in_log = [m.start() for m in re.finditer(re.escape(token.encode()),
                                                 open(good_log, "rb").read())]
        say(f"damage: journal {state}: {len(data) >> 10} KiB; the marker is at {where}, "
            f"in the log at {in_log}")
        # (what, which file, how): the file's ways, then the log's.
        ways = [(what, server_a.file, how) for what, how in damage_ways(good)]
        if where:
            # The last copy of the marker: in the last commit's leaf.
            ways.insert(3, (f"a bit flipped in a data page (byte {where[-1] + 3})", server_a.file,
                            lambda p: flip_bit(p, where[-1] + 3, 2)))
        if in_log and not where:
            # Acknowledged, and only in the log (SIGKILL before a checkpoint): its group
            # damaged must be refused too, never dropped as a torn flush. (Once a checkpoint
            # put it into the file, what is left in the log is an old copy nothing reads.)
            ways.append((f"a bit flipped in the log's group holding the marker "
                         f"(byte {in_log[-1] + 3})", server_a.log,
                         lambda p: flip_bit(p, in_log[-1] + 3, 2)))
        log_size = os.path.getsize(good_log)
        ways += [("the log cut to half", server_a.log, lambda p: os.truncate(p, log_size // 2)),
                 ("the log 0 bytes", server_a.log, lambda p: os.truncate(p, 0))]
        if in_log:
            ways.append(("the log removed", server_a.log, os.remove))
        if not where and not in_log:
            violation(phase, f"{state}: the marker is in neither the journal file nor its log")
        for what, target, damage in ways:
            in_time(deadline)
            what = f"{state}, {what}"
            shutil.copyfile(good, server_a.file)
            shutil.copyfile(good_log, server_a.log)
            damage(target)
            count(phase, "damaged starts")
            if server_a.launch():
                violation(phase, f"{what}: serve started on the damaged journal (it must exit "
                                 f"non-zero naming the file and `mv`); "
                                 f"{what_opened(marker, phase, deadline)}",
                          f"serve started on a damaged journal ({what})")
                server_a.kill()
                continue
            said = "\n".join(server_a.lines)
            code = server_a.proc.returncode
            if code == 0:
                violation(phase, f"{what}: serve exited 0")
            if target not in said or "mv " not in said:
                violation(phase, f"{what}: the message does not name {target} and `mv`: "
                                 f"{said[-400:]}")
            else:
                count(phase, "refused, naming the file and mv")
            last = said.strip().splitlines()[-1] if said.strip() else ""
            say(f"damage: {what}: exit {code}: {last[:160]}")
        shutil.copyfile(good, server_a.file)
        shutil.copyfile(good_log, server_a.log)
        server_a.start(phase)
        resend_stored(server_a, phase, markers + sample, deadline, "the good copy put back")
    server_a.stop(phase)


def phase_maxsessions(deadline):
    """12 journaled sessions, a restart with --max-sessions 4, then with the default: none
    forgotten."""
    phase = "maxsessions"
    server = Server(os.path.join(tmp, "journal-e"))
    server.start(phase)
    sessions = new_sessions(server, phase, 12)
    mine = []
    for s in sessions:
        t = Turn(phase, s, [FAST, FAST])
        if send_or_flag(server, t, phase, deadline) is not None:
            mine.append(t)
    server.stop(phase)
    if server.launch(["--max-sessions", "4"]):
        kinds = collections.Counter()
        for t in mine:
            got = send(server, t, phase, min(deadline, time.monotonic() + 5))
            kinds[got if isinstance(got, str) else "no answer" if got is None else
                  "stored" if got == t.blocks else "different"] += 1
            if isinstance(got, list) and got != t.blocks:
                violation(phase, f"--max-sessions 4: {t.ids[0]} answered differently")
        note(phase, f"with --max-sessions 4, the 12 sessions' turns: {dict(kinds)}")
        server.stop(phase)
    else:
        finding(phase, f"serve refused to start with --max-sessions 4 and 12 journaled sessions "
                       f"(exit {server.proc.returncode}): {' | '.join(server.lines[-2:])}")
    server.start(phase)
    forgotten = 0
    for t in mine:
        got = send(server, t, phase, deadline)
        if got == "unknown_session":
            forgotten += 1
        elif isinstance(got, str):
            violation(phase, f"{t.ids[0]}: {got} after the limit was raised again")
        elif got is not None and got != t.blocks:
            violation(phase, f"{t.ids[0]} answered differently from its stored answer")
        elif got is not None:
            count(phase, "stored answers matched")
    if forgotten:
        violation(phase, f"{forgotten} of {len(mine)} sessions forgotten after a restart with "
                         f"--max-sessions 4 (unknown_session once the limit was raised again)")
    server.stop(phase)


# -- the checks ------------------------------------------------------------------------------------

def ledger_check():
    on_disk = collections.Counter()
    for ws in {t.session.workspace for t in turns}:
        path = os.path.join(ws, "ledger.txt")
        if os.path.exists(path):
            for line in open(path):
                if line.strip():
                    on_disk[line.strip()] += 1
    unknown_counts = collections.Counter()
    final = {}
    for i, (turn, k) in calls.items():
        got = answers.get(i, [])
        phase = turn.phase
        if on_disk[i] > 1:
            violation(phase, f"{i} ran {on_disk[i]} times (its line is {on_disk[i]} times in "
                             f"the ledger)", "ran more than once")
        if not got:
            if on_disk[i]:
                violation(phase, f"{i} ran but was never answered", "never answered")
            else:
                violation(phase, f"{i} was never answered", "never answered")
            continue
        contents = {b for _, b in got}
        if len(contents) > 1:
            violation(phase, f"{i} answered with different content: {sorted(contents)[:3]}",
                      "answered with different content")
        final[i] = answer_code(got[-1][1])
        content = json.loads(got[-1][1]).get("content", "")
        if final[i] == "ok" and on_disk[i] == 0:
            violation(phase, f"{i} answered ok but its line is not on disk",
                      "ok without its line on disk")
        if final[i] != "ok" and "not run" in str(content) and on_disk[i]:
            violation(phase, f"{i} answered 'not run' but its line is on disk: {content[:200]}",
                      "'not run' with its line on disk")
    for i, (turn, k) in calls.items():
        if final.get(i) != "outcome_unknown":
            continue
        phase = turn.phase
        if on_disk[i]:
            unknown_counts[(phase, "line on disk")] += 1
            continue
        if k == 0:
            unknown_counts[(phase, "first of its turn (could have started)")] += 1
            continue
        before = turn.ids[k - 1]
        # A later copy of the turn runs this call once its predecessor is settled — answered,
        # or decided outcome_unknown — so from final answers alone every such call could have
        # started; whether it did is checked where the test knows it: at the timed kills
        # (`retry_interrupted`).
        if on_disk[before] > 0 or final.get(before) not in (None, "outcome_unknown"):
            unknown_counts[(phase, "its predecessor ran (could have started)")] += 1
        elif final.get(before) == "outcome_unknown":
            unknown_counts[(phase, "its predecessor was decided outcome_unknown (a later copy "
                                   "could start it)")] += 1
        else:
            unknown_counts[(phase, "never started")] += 1
            never_started(phase, f"{i} answered outcome_unknown but never started: its predecessor "
                             f"{before} in the same serial turn has no answer",
                      "outcome_unknown for a call that never started")
    for i in on_disk:
        if i not in calls and not i.startswith("damage-marker"):
            violation("ledger", f"a ledger line no call wrote: {i}", "a ledger line no call wrote")
    return on_disk, final, unknown_counts


# -- the run ---------------------------------------------------------------------------------------

PHASE_FUNCS = [("1", "kill9", phase_kill9), ("2", "sigstop", phase_sigstop),
               ("3", "fulldisk", phase_fulldisk), ("4", "clockstep", phase_clockstep),
               ("5", "damage", phase_damage), ("6", "maxsessions", phase_maxsessions)]


def main():
    # A CI timeout's SIGTERM ends the run through the finally blocks (servers killed, unmount).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    took = {}
    try:
        for number, name, func in PHASE_FUNCS:
            if number not in PHASES and name not in PHASES:
                continue
            stats.setdefault(name, collections.Counter())
            begun = time.monotonic()
            deadline = min(begun + PHASE_BOUND[name], deadline_all)
            if deadline - begun < 10:
                violation(name, f"not run: the whole run's bound ({TIME_LIMIT} s) is spent")
                continue
            say(f"== phase {number}: {name} (bound {deadline - begun:.0f} s)")
            try:
                func(deadline)
            except PhaseAbort as e:
                violation(name, f"aborted: {e}")
            except Exception:              # a fault of this test: reported, the next phase runs
                violation(name, "crashed: " + traceback.format_exc())
            if time.monotonic() > deadline:
                violation(name, f"took {time.monotonic() - begun:.0f} s, over its bound")
            took[name] = time.monotonic() - begun
            say(f"   {name}: {time.monotonic() - begun:.1f} s")
    finally:
        for proc in processes:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()

    on_disk, final, unknown_counts = ledger_check()
    print()
    print(f"== summary (seed {SEED}, {time.monotonic() - started:.0f} s, {len(calls)} calls, "
          f"{sum(on_disk.values())} ledger lines)")
    for name, counters in stats.items():
        kinds = collections.Counter(final[i] for i, (t, _) in calls.items()
                                    if t.phase == name and i in final)
        n_viol = sum(1 for p, _, _ in violations if p == name)
        print(f"{name:12} {took.get(name, 0):5.1f} s  kills: {counters['kills']}, "
              f"stops: {counters['stops']}, violations: {n_viol}")
        print(f"{'':12} final answers by kind: {dict(kinds)}")
        shown = {k: v for k, v in counters.items()
                 if not k.startswith("answers ") and k not in ("kills", "stops")}
        if shown:
            print(f"{'':12} {dict(shown)}")
        received = {k[8:]: v for k, v in counters.items() if k.startswith("answers ")}
        if received:
            print(f"{'':12} answers received (every copy): {received}")
        unknown = {k[1]: v for k, v in unknown_counts.items() if k[0] == name}
        if unknown:
            print(f"{'':12} outcome_unknown: {unknown}")
        for line in notes.get(name, []):
            print(f"{'':12} {line}")
    for phase, text in findings:
        print(f"FINDING [{phase}] {text}")
    if violations:
        print(f"FAIL: {len(violations)} violations; by check:")
        tally = collections.Counter((phase, check) for phase, _, check in violations)
        for (phase, check), n in tally.items():
            print(f"  {n:4}  [{phase}] {check}")
        for phase, text, _ in violations:
            print(f"FAIL [{phase}] {text}")
        print(f"(left for inspection: {tmp})")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("fault test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
