"""``python -m trainer.mpirun -m trainer.train [FLAGS]``: a program on every slot of the MPI
hostfile, through OpenMPI's ``mpirun``, with what its ranks need to meet as a torch job.

The launcher of a Kubeflow Trainer MPI runtime (``mlPolicy.mpi``, e.g. ``deepspeed-distributed``)
runs this: the Trainer mounts the hostfile (``/etc/mpi/hostfile``, one ``host slots=N`` line per
node) and names it in ``OMPI_MCA_orte_default_hostfile``; only the launcher has it. So the
address of rank 0 (the hostfile's first host: mpirun places ranks by slot) is read here and
handed to every rank with ``-x MASTER_ADDR``, with ``MASTER_PORT`` and the container's own
environment (S3 endpoint and keys, NCCL settings), which mpirun does not pass to other machines
by itself. Each rank then reads its identity from ``OMPI_COMM_WORLD_*`` (``trainer.distributed``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from trainer.distributed import HOSTFILE_ENV, MPI_PORT, read_hostfile
from trainer.errors import EXIT_CONFIG, ConfigError

NOT_FORWARDED = ("HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM")
"""Variables of this machine alone, never passed to the ranks elsewhere."""
NOT_FORWARDED_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "KUBERNETES_")
"""OpenMPI's own (it sets them per rank) and the Service variables of this pod."""


def mpirun_command(
    program: list[str], environ: Mapping[str, str], *, root: bool = False
) -> list[str]:
    """The ``mpirun`` command line that runs ``program`` (e.g. ``-m trainer.train FLAGS``) with
    this interpreter on every slot of the hostfile."""
    hosts = read_hostfile(environ.get(HOSTFILE_ENV))
    command = ["mpirun", "-np", str(sum(slots for _, slots in hosts)), "--bind-to", "none"]
    if root:
        command.append("--allow-run-as-root")
    meet = {
        "MASTER_ADDR": environ.get("MASTER_ADDR") or hosts[0][0],
        "MASTER_PORT": environ.get("MASTER_PORT") or str(MPI_PORT),
        "PYTHONUNBUFFERED": "1",
    }
    for name, value in meet.items():
        command += ["-x", f"{name}={value}"]
    for name in sorted(environ):
        if name in meet or name in NOT_FORWARDED or name.startswith(NOT_FORWARDED_PREFIXES):
            continue
        command += ["-x", name]
    return [*command, sys.executable, *program]


def main(argv: list[str] | None = None) -> int:
    program = list(sys.argv[1:] if argv is None else argv)
    if not program:
        print("usage: python -m trainer.mpirun -m MODULE [ARGS] | SCRIPT [ARGS]", file=sys.stderr)
        return EXIT_CONFIG
    try:
        command = mpirun_command(program, os.environ, root=os.geteuid() == 0)
    except ConfigError as err:
        print(f"trainer.mpirun: {err}", file=sys.stderr)
        return EXIT_CONFIG
    print("[mpirun] " + " ".join(command), flush=True)
    os.execvp(command[0], command)
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main())
