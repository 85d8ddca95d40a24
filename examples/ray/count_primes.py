"""A Ray program of one's own, as a RayJob's entrypoint runs it (the driver, on the Ray head):
Ray tasks spread over the cluster's worker nodes count the primes below ``--limit`` in
``--chunks`` ranges, and the driver checks the total and writes it to ``--output``.

    python examples/ray/count_primes.py --limit 200000 --chunks 8 --output /tmp/out/primes.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import ray


# SPREAD: over the nodes as they are, not packed onto the first node whose worker is ready
# (tiny tasks on a busy machine could all finish there before the other node's worker started).
@ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
def count(lo: int, hi: int) -> tuple[int, str]:
    """Primes in [lo, hi) by trial division, and which node counted them."""
    found = 0
    for n in range(max(lo, 2), hi):
        if all(n % d for d in range(2, int(n**0.5) + 1)):
            found += 1
    return found, ray.get_runtime_context().get_node_id()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=100_000)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    ray.init()  # the cluster of RAY_ADDRESS (KubeRay's, or the local backend's)
    step = -(-args.limit // args.chunks)
    results = ray.get(
        [count.remote(i, min(i + step, args.limit)) for i in range(0, args.limit, step)]
    )
    total = sum(n for n, _ in results)
    nodes = sorted({node for _, node in results})
    print(
        f"[primes] {total} primes below {args.limit}, counted on {len(nodes)} Ray node(s)",
        flush=True,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "limit": args.limit,
                "primes": total,
                "nodes": len(nodes),
                "driver": socket.gethostname(),
                "pid": os.getpid(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
