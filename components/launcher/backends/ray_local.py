"""A RayJob's replicas on loopback (the local backend): a Ray cluster as KubeRay makes one.

``head-0`` runs ``ray start --head`` (no CPUs: it trains nothing, as our RayJob's head),
``worker-N`` runs ``ray start --address`` with ``nproc_per_node`` CPUs (our worker group's
``num-cpus``), every node on 127.0.0.1 with a small object store (one machine holds them all);
``submitter`` waits until every node has joined, then runs the entrypoint as the Ray job's
driver (``python -m components.launcher.backends.ray_local``), as KubeRay's submitter does once
the cluster's pods are ready. The nodes join one at a time (``worker-N`` waits for the head
and the workers before it): Ray gives a starting node 30 s to register, which several nodes
starting at once on a busy 2-core machine can miss. The Ray processes of a node stay in its
replica's process tree (``--block``), so stopping the replica stops them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

OBJECT_STORE_BYTES = 100 * 1024 * 1024
"""Each local node's object store: Ray's default (30% of the machine's memory) per node would
ask for more shared memory than one machine has for three nodes."""
JOIN_TIMEOUT_S = 180.0


def ray_cli(python: str) -> list[str]:
    """The ``ray`` command of ``python``'s environment."""
    return [python, "-m", "ray.scripts.scripts"]


def node_command(
    python: str, replica: str, *, gcs_port: int, cpus: int, temp_dir: str
) -> list[str]:
    """``ray start`` for ``head-0`` (the GCS on ``gcs_port``) or a ``worker-N``."""
    common = [
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--disable-usage-stats",
    ]
    if replica == "head-0":
        return [
            *ray_cli(python),
            "start",
            "--head",
            f"--port={gcs_port}",
            "--num-cpus=0",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
            *common,
        ]
    index = int(replica.rsplit("-", 1)[1])
    start = [*ray_cli(python), "start", f"--address=127.0.0.1:{gcs_port}", f"--num-cpus={cpus}"]
    # A folder of the node's own, as each pod has: a node's log monitor sends the driver the
    # output of the worker processes in its folder, and in one shared folder every node's
    # monitor sent every line (each line of the job's log came once per node).
    own = f"--temp-dir={temp_dir}/w{index}"
    return after_nodes(python, 1 + index, [*start, own, *common])


def after_nodes(python: str, nodes: int, command: list[str]) -> list[str]:
    """``command`` once ``nodes`` Ray nodes are alive (the driver: all of them)."""
    module = "components.launcher.backends.ray_local"
    return [python, "-m", module, "--nodes", str(nodes), "--", *command]


def alive_nodes(address: str) -> int:
    """How many nodes of the Ray cluster at ``address`` are alive (its GCS's node table: a
    client of the GCS alone, lighter than a driver)."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    table = GcsClient(address=address).get_all_node_info(timeout=5)
    return sum(1 for info in table.values() if info.state == 0)  # GcsNodeInfo ALIVE


def wait_for_nodes(address: str, nodes: int, timeout_s: float) -> None:
    """Until ``nodes`` nodes of the Ray cluster at ``address`` are alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if alive_nodes(address) >= nodes:
                return
        except Exception:  # noqa: BLE001 - the GCS is not up yet: whatever its client raises
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {nodes} Ray nodes were up within {timeout_s:g} s")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.launcher.backends.ray_local")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("entrypoint", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    entrypoint = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    if not entrypoint:
        parser.error("no entrypoint after --")
    address = os.environ["RAY_ADDRESS"]
    try:
        wait_for_nodes(address, args.nodes, JOIN_TIMEOUT_S)
    except TimeoutError as err:
        print(f"[ray] the local Ray cluster at {address}: {err}", flush=True)
        return 1
    print(f"[ray] {args.nodes} Ray nodes up at {address}; running {entrypoint[0]}", flush=True)
    os.execvp(entrypoint[0], entrypoint)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
