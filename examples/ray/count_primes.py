"""A Ray program of one's own, as a RayJob's entrypoint runs it (the driver, on the Ray head):
Ray tasks spread over the cluster's worker nodes count the primes below ``--limit`` in
``--chunks`` ranges, and the driver checks the total and writes it to ``--output``.

The tasks go to a placement group of one CPU on each node that has CPUs (``STRICT_SPREAD``):
Ray's ``SPREAD`` strategy is a preference, and tiny tasks on a busy machine all ran on the
first node whose worker was ready.

    python examples/ray/count_primes.py --limit 200000 --chunks 8 --output /tmp/out/primes.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PLACEMENT_TIMEOUT_S = 120


@ray.remote(num_cpus=1)
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
    with_cpus = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
    group = placement_group([{"CPU": 1}] * len(with_cpus), strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    step = -(-args.limit // args.chunks)
    results = ray.get(
        [
            count.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=chunk % len(with_cpus)
                )
            ).remote(lo, min(lo + step, args.limit))
            for chunk, lo in enumerate(range(0, args.limit, step))
        ]
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
