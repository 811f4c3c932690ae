"""p50/p99 of a sandboxed `bash true` turn through `switchboard serve`, for each binary given,
alternating, N calls per run."""
import json, os, socket, subprocess, sys, tempfile, time, statistics, urllib.request

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def run(binary, n, mode):
    port, token = free_port(), "t" * 24
    root = tempfile.mkdtemp()
    env = dict(os.environ, SWITCHBOARD_TOKEN=token)
    p = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--workspace-root", root, "--sandbox", mode],
                         env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    def post(path, body):
        r = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Authorization": f"Bearer {token}"})
        return json.loads(urllib.request.urlopen(r).read())
    for _ in range(100):
        try: sid = post("/v1/sessions", {})["session_id"]; break
        except Exception: time.sleep(0.1)
    # A new tool_use id per turn: a turn repeated exactly would be answered from the session's
    # memory of answers, running nothing.
    def turn(i):
        return {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "bash", "input": {"command": "true"}}]}
    times = []
    for i in range(n + 10):
        t = time.perf_counter(); a = post(f"/v1/sessions/{sid}/dispatch", turn(i)); d = time.perf_counter() - t
        assert "Error" not in a["content"][0]["content"], a
        if i >= 10: times.append(d * 1000)
    p.terminate(); p.wait()
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]

n = int(sys.argv[1]); binaries = sys.argv[2:]
for rnd in range(2):
    for mode in ("workspace-write", "off"):
        for b in binaries:
            p50, p99 = run(b, n, mode)
            print(f"round {rnd+1} {mode:16s} {os.path.getsize(b)/1e6:6.1f} MB  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  {b}", flush=True)
