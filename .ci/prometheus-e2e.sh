#!/usr/bin/env bash
# End to end with a real Prometheus: the exposition passes `promtool check metrics`, a real
# Prometheus scrapes `switchboard demo --metrics-addr`, and every query of the Grafana dashboard
# returns data.
#
#   bash .ci/prometheus-e2e.sh ./target/release/switchboard
#
# Installs Debian's `prometheus` package if prometheus/promtool are missing (the package's own
# service is kept from starting; this script runs its own Prometheus). Everything it starts listens
# on 127.0.0.1 only and is stopped on exit; temporary files are removed.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:?usage: bash .ci/prometheus-e2e.sh PATH/TO/switchboard}
dashboard=dashboards/switchboard-dispatch.json
demo_seconds=40        # upper bound of the scraped demo run; it is stopped as soon as we are done
rate_window=30s        # stands in for Grafana's $__rate_interval: holds many 1 s scrapes
want_scrapes=10        # scrapes to wait for before querying

if [[ ! -x $bin ]]; then
  echo "prometheus-e2e: $bin is not an executable" >&2
  exit 1
fi
started=$(date +%s)

echo "== prometheus and promtool"
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  # Keep the package's init script from starting a Prometheus of its own (standard Debian
  # policy-rc.d mechanism), unless the system already has a policy.
  made_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus
  if [[ -n $made_policy ]]; then
    rm -f /usr/sbin/policy-rc.d
  fi
fi
prometheus --version 2>&1 | head -n 1
promtool --version 2>&1 | head -n 1

tmp=$(mktemp -d)
demo_pid=""
prom_pid=""
cleanup() {
  local status=$?
  for pid in "$prom_pid" "$demo_pid"; do
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  if [[ $status -ne 0 ]]; then
    for log in demo.err prometheus.log; do
      if [[ -s $tmp/$log ]]; then
        echo "--- last lines of $log" >&2
        tail -n 20 "$tmp/$log" >&2
      fi
    done
  fi
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT

echo "== promtool check metrics on --metrics-file"
"$bin" demo --sessions 4 --duration 2s --metrics-file "$tmp/metrics.txt" >/dev/null
if ! lint=$(promtool check metrics <"$tmp/metrics.txt" 2>&1); then
  echo "$lint" >&2
  echo "prometheus-e2e: promtool check metrics failed" >&2
  exit 1
fi
if [[ -n $lint ]]; then
  echo "$lint" >&2
  echo "prometheus-e2e: promtool check metrics reported problems" >&2
  exit 1
fi
echo "clean ($(grep -c '^switchboard_' "$tmp/metrics.txt") samples)"

echo "== scrape a running demo"
read -r demo_port prom_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
')
if [[ -z ${demo_port:-} || -z ${prom_port:-} ]]; then
  echo "prometheus-e2e: could not pick free loopback ports" >&2
  exit 1
fi
target="127.0.0.1:$demo_port"
# One MCP server (the standard-library test server) so the MCP row's series exist: the demo's
# scripted sessions make no MCP calls, so its request panels show a rate of 0 and no latency.
mkdir -p "$tmp/mcp-state"
cat >"$tmp/mcp.json" <<EOF
{"mcpServers": {"probe": {"command": "python3",
  "args": ["$PWD/tests/mcp_servers/misbehaving.py", "$tmp/mcp-state"]}}}
EOF
# A policy (allow by default, one deny rule) and an audit log so the permissions row's series exist.
# --defer-auto-above 0 defers the MCP server's tools, so every model request's catalog is shaped by
# deferral and the tool-search row's series exist (the scripted sessions never search: rates of 0).
# --journal records every call, so the journal row's series exist (no retries: dedup rates of 0).
echo '{"permissions": {"deny": ["read_file(**/.env)"], "default": "allow"}}' >"$tmp/policy.json"
"$bin" demo --sessions 8 --duration "${demo_seconds}s" --metrics-addr "$target" \
  --mcp-config "$tmp/mcp.json" --defer-auto-above 0 --journal "$tmp/journal" --policy "$tmp/policy.json" --audit-log "$tmp/audit.jsonl" \
  >"$tmp/demo.out" 2>"$tmp/demo.err" &
demo_pid=$!

cat >"$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: switchboard
    static_configs:
      - targets: ["$target"]
EOF
promtool check config "$tmp/prometheus.yml" >/dev/null
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
prom_pid=$!

DEMO_PID=$demo_pid PROM_PID=$prom_pid python3 - "$prom_port" "$target" "$dashboard" \
  "$rate_window" "$want_scrapes" <<'PY'
"""Waits for enough scrapes, then runs every target expr of the dashboard as an instant query."""
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

prom_port, target, dashboard_path, window, want_scrapes = sys.argv[1:6]
want_scrapes = int(want_scrapes)
base = f"http://127.0.0.1:{int(prom_port)}"
pids = {"switchboard demo": int(os.environ["DEMO_PID"]), "prometheus": int(os.environ["PROM_PID"])}


def alive():
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit(f"prometheus-e2e: {name} (pid {pid}) exited early")


def get(path, **params):
    url = f"{base}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r) if path.startswith("/api/") else r.read()


def query(expr):
    body = get("/api/v1/query", query=expr)
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {body}")
    return body["data"]["result"]


def wait(what, check, seconds):
    deadline = time.monotonic() + seconds
    while True:
        alive()
        try:
            if check():
                return
        except (urllib.error.URLError, ConnectionError, RuntimeError, OSError):
            pass
        if time.monotonic() > deadline:
            sys.exit(f"prometheus-e2e: timed out waiting for {what}")
        time.sleep(0.5)


t0 = time.monotonic()
wait("Prometheus to be ready", lambda: get("/-/ready") is not None, 30)
wait(f"a successful scrape of {target}",
     lambda: any(s["value"][1] == "1" for s in query(f'up{{job="switchboard",instance="{target}"}}')),
     30)
# More samples than any window below needs at 1 s scrapes.
wait(f"{want_scrapes} scrapes",
     lambda: any(float(s["value"][1]) >= want_scrapes
                 for s in query(f'count_over_time(up{{job="switchboard",instance="{target}"}}[1m])')),
     want_scrapes + 20)
print(f"{want_scrapes} scrapes of {target} after {time.monotonic() - t0:.1f} s")

# The `instance` variable of the dashboard: label_values(switchboard_build_info, instance).
instances = get("/api/v1/label/instance/values", **{"match[]": "switchboard_build_info"})["data"]
if target not in instances:
    sys.exit(f"prometheus-e2e: label_values(switchboard_build_info, instance) = {instances}, "
             f"expected {target}")


def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


with open(dashboard_path) as f:
    dashboard = json.load(f)

checked, empty = 0, []
for panel in panels(dashboard["panels"]):
    for t in panel.get("targets", []):
        expr = t["expr"]
        promql = (expr.replace("$__rate_interval", window)
                  .replace("$__interval", window)
                  .replace("$__range", window)
                  .replace("$instance", target))
        if "$" in promql:
            sys.exit(f"prometheus-e2e: unsubstituted variable in {panel['title']!r}: {promql}")
        result = query(promql)
        checked += 1
        label = f"{panel['title']} [{t['refId']}]"
        if not result and "switchboard_cluster_" in promql:
            # Cluster series exist only on `serve --cluster` nodes; the cluster tests read them
            # from real nodes' /metrics, and the dashboards test checks these queries' names.
            print(f"  n/a    {label} (cluster mode only)")
            continue
        if not result:
            empty.append(f"{label}: {promql}")
            print(f"  EMPTY  {label}")
            continue
        sample = ", ".join(
            f"{{{','.join(f'{k}={v}' for k, v in s['metric'].items())}}} {s['value'][1]}"
            for s in result[:3])
        more = f" (+{len(result) - 3} more)" if len(result) > 3 else ""
        print(f"  ok     {label}: {len(result)} series; {sample}{more}")

if checked == 0:
    sys.exit("prometheus-e2e: the dashboard has no queries")
if empty:
    print(f"prometheus-e2e: {len(empty)} of {checked} dashboard queries returned no data:",
          file=sys.stderr)
    for line in empty:
        print(f"  {line}", file=sys.stderr)
    sys.exit(1)
print(f"all {checked} dashboard queries returned data")
PY

echo "prometheus e2e passed in $(($(date +%s) - started)) s"
