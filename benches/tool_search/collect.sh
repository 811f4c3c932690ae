#!/usr/bin/env bash
# Builds (or, with --check, checks) the MCP part of benches/tool_search/catalog.json.
#
#   benches/tool_search/collect.sh [--check] [DIR]
#
# DIR (default: target/tool-search-deps under the repo root) receives the pinned MCP servers:
# npm packages from package.json + package-lock.json (`npm ci --prefix DIR`) and PyPI packages from
# requirements.txt (a venv in DIR/venv). Each server of servers.json is then started over stdio
# inside `unshare -rn` (its own user + network namespace: no network at all), asked `initialize`
# and `tools/list` (every page), and stopped (list_tools.py). Servers that want a credential get a
# dummy one (servers.json); none is ever given a real one.
#
# Without --check: also fetches the bfcl-eval wheel (pinned by hash in requirements-pad.txt),
# extracts the padding tools (pad.py) and writes catalog.json = MCP tools + padding.
# With --check: writes nothing in the repo; fails if the freshly listed tools differ from the
# catalog's MCP part, naming the first differing server/tool.
# Installs are skipped when DIR already holds exactly the pinned set (a stamp of the lock files).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
check=0
dir=""
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "collect.sh: unknown option $arg" >&2; exit 2 ;;
    *) [ -z "$dir" ] || { echo "collect.sh: one DIR only" >&2; exit 2; }; dir="$arg" ;;
  esac
done
dir="${dir:-$root/target/tool-search-deps}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started )) s"; }

echo "== tool_search collect$([ $check = 1 ] && echo ' --check'): servers in $dir"
for cmd in node npm python3 unshare; do
  command -v "$cmd" >/dev/null || { echo "collect.sh: $cmd is needed and not on PATH" >&2; exit 1; }
done
if ! unshare -rn true 2>/dev/null; then
  echo "collect.sh: 'unshare -rn' does not work here (user + network namespaces are needed to run the servers offline)" >&2
  exit 1
fi
echo "   node $(node --version), npm $(npm --version), $(python3 --version)"

# npm: exactly the lock file's tree. --ignore-scripts: no install script runs (none is needed to
# list tools, and some would download browsers).
npm_stamp="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)"
if [ "$(cat "$dir/.npm-stamp" 2>/dev/null)" = "$npm_stamp" ] && [ -d "$dir/node_modules" ]; then
  echo "== npm packages: already installed (stamp $npm_stamp)"
else
  echo "== npm ci --prefix $dir ($(grep -c '": "[0-9]' "$here/package.json") servers pinned in package.json, tree in package-lock.json)"
  cp "$here/package.json" "$here/package-lock.json" "$dir/"
  PUPPETEER_SKIP_DOWNLOAD=1 PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 \
    npm ci --prefix "$dir" --ignore-scripts --no-audit --no-fund --loglevel=error
  echo "$npm_stamp" > "$dir/.npm-stamp"
  echo "   ($(elapsed))"
fi

# PyPI: a venv with requirements.txt (every package pinned, dependencies included).
pip_stamp="$(cat "$here/requirements.txt" | sha256sum | cut -c1-16)"
if [ "$(cat "$dir/.pip-stamp" 2>/dev/null)" = "$pip_stamp" ] && [ -x "$dir/venv/bin/python" ]; then
  echo "== PyPI packages: already installed (stamp $pip_stamp)"
else
  echo "== python3 -m venv $dir/venv; pip install -r requirements.txt"
  if ! python3 -m venv --clear "$dir/venv"; then
    echo "collect.sh: python3 -m venv failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check --no-compile -r "$here/requirements.txt"
  echo "$pip_stamp" > "$dir/.pip-stamp"
  echo "   ($(elapsed))"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "== listing tools (initialize + tools/list over stdio, each server inside unshare -rn)"
python3 "$here/list_tools.py" "$dir" "$tmp/mcp.json"
echo "   ($(elapsed))"

if [ "$check" = 1 ]; then
  echo "== comparing with $here/catalog.json"
  python3 "$here/catalog.py" check "$tmp/mcp.json" "$here/catalog.json"
  echo "== collect.sh --check passed in $(elapsed)"
  exit 0
fi

echo "== padding: bfcl-eval wheel (requirements-pad.txt, hash-checked) -> pad.py"
mkdir -p "$dir/pad"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
  -r "$here/requirements-pad.txt" -d "$dir/pad"
python3 "$here/pad.py" "$dir"/pad/bfcl_eval-*.whl "$tmp/pad.json"
python3 "$here/catalog.py" merge "$tmp/mcp.json" "$tmp/pad.json" "$here/catalog.json"
if [ -f "$here/queries.jsonl" ]; then
  python3 "$here/catalog.py" validate "$here/catalog.json" "$here/queries.jsonl"
fi
echo "== collect.sh done in $(elapsed)"
