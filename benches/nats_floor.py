#!/usr/bin/env python3
"""The floor under a relayed turn and a failover in cluster mode, with nothing of Switchboard's.

A fresh 3-server NATS cluster (JetStream, `sync_interval: always`), as the cluster fault test
runs it, all on 127.0.0.1 with free ports; then `nats_floor/` (a small Rust program on the crate's
own async-nats, not part of the crate) against two of its servers: a bare request-reply round
trip from a client on the responder's server and from one across a route, and how late a key of
a bucket with a 2 s age limit goes (a dead node's heartbeat is such a key). Compare the first
with the relay overhead the cluster fault test prints, the second with its failover times.

Usage: nats_floor.py NATS_SERVER [ROUND_TRIPS]   (default 2,000 round trips per client)

Bounded: ROUND_TRIPS × 2 requests and eight keys, at most 5 minutes; nothing but local
processes and a temporary directory. Builds `nats_floor/` with cargo first (into
target/nats-floor of the repository).
"""

import os
import subprocess
import sys
import tempfile

from cluster_shards import end, nats_cluster  # the same directory

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    nats_bin = sys.argv[1]
    trips = sys.argv[2] if len(sys.argv) > 2 else "2000"
    manifest = os.path.join(HERE, "nats_floor", "Cargo.toml")
    target = os.path.join(HERE, "..", "target", "nats-floor")
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path", manifest,
                    "--target-dir", target], check=True, timeout=600)
    program = os.path.join(target, "release", "nats-floor")
    tmp = tempfile.mkdtemp(prefix="nats-floor-")
    procs = []
    try:
        urls = nats_cluster(nats_bin, tmp, procs)
        out = subprocess.run([program, urls[0], urls[1], trips], capture_output=True, text=True,
                             timeout=240)
        sys.stdout.write(out.stdout)
        if out.returncode != 0:
            raise SystemExit(f"nats-floor failed: {out.stderr[-2000:]}")
    finally:
        end(procs, tmp)


if __name__ == "__main__":
    main()
