"""``python -m trainer.mpirun [--first-on-each-node CMD] -m trainer.train [FLAGS]``: a program on
every slot of the MPI hostfile, through OpenMPI's ``mpirun``, with what its ranks need to meet as
a torch job.

The launcher of a Kubeflow Trainer MPI runtime (``mlPolicy.mpi``, e.g. ``deepspeed-distributed``)
runs this: the Trainer mounts the hostfile (``/etc/mpi/hostfile``, one ``host slots=N`` line per
node) and names it in ``OMPI_MCA_orte_default_hostfile``; only the launcher has it. So the
address of rank 0 is worked out here (mpirun places ranks by slot, starting with its own
machine when the hostfile lists it, as the launcher of a runtime with ``runLauncherAsNode``,
else with the hostfile's first host) and handed to every rank with ``-x MASTER_ADDR``, with
``MASTER_PORT`` and the container's own environment (S3 endpoint and keys, NCCL settings), which
mpirun does not pass to other machines by itself. Each rank then reads its identity from
``OMPI_COMM_WORLD_*`` (``trainer.distributed``).

``--first-on-each-node CMD`` (a shell-quoted command line) runs ``CMD`` once on every host of the
hostfile first, all at once (``mpirun --map-by ppr:1:node``), with the same environment: the
launcher stages the data set on every node pod this way, since the Trainer starts the node pods
with sshd alone. The program starts only when it succeeded on every host.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping

from kfp_ddp.console import whole_lines
from trainer.cpu_request import CPU_REQUEST_ENV, NODE_CPU_REQUEST_ENV
from trainer.distributed import HOSTFILE_ENV, MPI_PORT, read_hostfile
from trainer.errors import EXIT_CONFIG, ConfigError

NOT_FORWARDED = (
    *("HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM"),
    *(CPU_REQUEST_ENV, NODE_CPU_REQUEST_ENV),
)
"""Variables of this machine alone, never passed to the ranks elsewhere as they are (the CPU
request is the launcher pod's own: the ranks get the node pods', ``NODE_CPU_REQUEST_ENV``)."""
NOT_FORWARDED_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "KUBERNETES_")
"""OpenMPI's own (it sets them per rank) and the Service variables of this pod."""


FIRST_ON_EACH_NODE = "--first-on-each-node"


def _addresses(name: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    except OSError:
        return set()


def is_this_machine(host: str) -> bool:
    """Whether a hostfile's ``host`` names the machine this runs on (its short name, or an
    address of it), as mpirun finds its own node in the hostfile."""
    if host in ("localhost", "127.0.0.1", "::1"):
        return True
    own = socket.gethostname()
    if host.split(".")[0] == own.split(".")[0]:
        return True
    return bool(_addresses(host) & _addresses(own))


def rank_zero_host(hosts: list[tuple[str, int]]) -> str:
    """The host mpirun puts rank 0 on: its own machine when the hostfile lists it, else the
    hostfile's first host."""
    return next((host for host, _ in hosts if is_this_machine(host)), hosts[0][0])


def mpirun_command(
    program: list[str],
    environ: Mapping[str, str],
    *,
    root: bool = False,
    once_per_host: bool = False,
) -> list[str]:
    """The ``mpirun`` command line that runs ``program`` (e.g. ``-m trainer.train FLAGS``) with
    this interpreter on every slot of the hostfile; ``once_per_host``: ``program`` (a whole
    command line) once on each host instead."""
    hosts = read_hostfile(environ.get(HOSTFILE_ENV))
    if once_per_host:
        command = ["mpirun", "-np", str(len(hosts)), "--map-by", "ppr:1:node"]
    else:
        command = ["mpirun", "-np", str(sum(slots for _, slots in hosts))]
    command += ["--bind-to", "none"]
    if root:
        command.append("--allow-run-as-root")
    meet = {
        "MASTER_ADDR": environ.get("MASTER_ADDR") or rank_zero_host(hosts),
        "MASTER_PORT": environ.get("MASTER_PORT") or str(MPI_PORT),
        "PYTHONUNBUFFERED": "1",
    }
    # A rank started over SSH sees none of its pod's environment, so not its CPU request either:
    # without it, it would take every core of its node for its threads.
    if environ.get(NODE_CPU_REQUEST_ENV):
        meet[CPU_REQUEST_ENV] = environ[NODE_CPU_REQUEST_ENV]
    for name, value in meet.items():
        command += ["-x", f"{name}={value}"]
    for name in sorted(environ):
        if name in meet or name in NOT_FORWARDED or name.startswith(NOT_FORWARDED_PREFIXES):
            continue
        command += ["-x", name]
    if not once_per_host:
        return [*command, sys.executable, *program]
    if program[:1] in (["python"], ["python3"]):  # this interpreter, whatever PATH says there
        program = [sys.executable, *program[1:]]
    return [*command, *program]


USAGE = (
    "usage: python -m trainer.mpirun [--first-on-each-node CMD] -m MODULE [ARGS] | SCRIPT [ARGS]"
)


def main(argv: list[str] | None = None) -> int:
    program = list(sys.argv[1:] if argv is None else argv)
    first: list[str] = []
    if program[:1] == [FIRST_ON_EACH_NODE]:
        if len(program) < 2:
            print(f"{USAGE}\n{FIRST_ON_EACH_NODE} needs a command line", file=sys.stderr)
            return EXIT_CONFIG
        first, program = shlex.split(program[1]), program[2:]
    if not program:
        print(USAGE, file=sys.stderr)
        return EXIT_CONFIG
    root = os.geteuid() == 0
    try:
        command = mpirun_command(program, os.environ, root=root)
        before = mpirun_command(first, os.environ, root=root, once_per_host=True) if first else []
    except ConfigError as err:
        print(f"trainer.mpirun: {err}", file=sys.stderr)
        return EXIT_CONFIG
    if before:
        print("[mpirun] " + shlex.join(before), flush=True)
        code = subprocess.run(before, check=False).returncode
        if code != 0:
            print(f"[mpirun] {FIRST_ON_EACH_NODE} failed (exit {code}): not training", flush=True)
            return code
    print("[mpirun] " + " ".join(command), flush=True)
    os.execvp(command[0], command)
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":
    whole_lines()  # a line of this process is never torn by another's in the one log
    sys.exit(main())
