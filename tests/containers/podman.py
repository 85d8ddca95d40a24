"""podman for the tests: the tool with the project's settings, a private network, a socket.

* :func:`missing` — why container tests cannot run here (root, and the Debian packages that
  ``.ci/run`` installs when it runs as root), or None;
* :class:`Podman` — ``podman`` with ``image/containers.conf`` (runc, cgroupfs) plus a network
  folder of this session's own and the containers' :data:`CONTAINER_ENV`;
* :class:`PrivateNetwork` — a CNI bridge of its own (``10.86.N.0/24``; podman's default
  10.88/16 is never used): no masquerading and no firewall plugin, so nothing in the host's
  iptables changes and containers on it reach the host's bridge address (where a test's S3
  server listens) and each other, and nothing outside this machine;
* :class:`DockerSocket` — ``podman system service`` on a unix socket: Docker's API, for
  ``kfp.local``'s ``DockerRunner`` (the Docker SDK reads ``DOCKER_HOST``).

Everything lives under a folder of the test session; :meth:`PrivateNetwork.remove` deletes the
bridge, and containers are removed by name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "image" / "containers.conf"
DEBIAN_PACKAGES = {
    "podman": "podman",
    "runc": "runc",
    "mmdebstrap": "mmdebstrap",
    "newuidmap": "uidmap",
    "skopeo": "skopeo",
}
"""The programs the container tests need, and the Debian package of each (.ci/run installs them)."""
CNI_PLUGINS = Path("/usr/lib/cni")
CONTAINER_ENV = ("OMP_WAIT_POLICY=PASSIVE",)
"""Set in every container this session's podman starts (containers.conf's ``env``), as
tests/conftest.py sets it for the processes the tests start: the suite keeps more threads busy
than this machine has cores, and OpenMP threads that spin while they wait take the cores the
other tests' processes wait for. Measured on the host: two 2-thread trainings side by side on 2
cores, 30 CPU-s each with libgomp's default, 8.6 with passive waiting. The node's pods (the
launcher's manifests) are left as a user's cluster would run them."""


def missing() -> str | None:
    """Why the container tests must skip here, or None when they can run."""
    if os.geteuid() != 0:
        return "container tests need root (podman's rootful storage and a bridge of their own)"
    absent = [pkg for tool, pkg in DEBIAN_PACKAGES.items() if shutil.which(tool) is None]
    if not (CNI_PLUGINS / "bridge").exists():
        absent.append("containernetworking-plugins")
    if absent:
        return (
            "container tests need the Debian packages "
            + ", ".join(sorted(set(absent)))
            + " (.ci/run installs them when it runs as root: apt-get install "
            + " ".join(sorted(set(absent)))
            + ")"
        )
    return None


class Podman:
    """``podman`` with the project's containers.conf and this session's network folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.networks = folder / "networks"
        self.networks.mkdir(parents=True, exist_ok=True)
        self.conf = folder / "containers.conf"
        base = CONTAINERS_CONF.read_text()
        if "\n[containers]\n" not in base:
            raise AssertionError(f"{CONTAINERS_CONF} has no [containers] table to add env to")
        env = f"env = {json.dumps(list(CONTAINER_ENV))}\n"
        base = base.replace("\n[containers]\n", f"\n[containers]\n{env}", 1)
        self.conf.write_text(
            base + f'\n[network]\nnetwork_config_dir = "{self.networks}"\n'
            f'cni_plugin_dirs = ["{CNI_PLUGINS}"]\n'
        )
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 300, check: bool = True, **kwargs):
        result = subprocess.run(
            ["podman", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args[:6])} ... exited {result.returncode}:\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def build_script(self, target: str, *, python: str, timeout: float) -> str:
        """``image/build.sh TARGET`` (local, local-mpi) with this podman's settings: the name of
        the image it built or found up to date (its last line)."""
        result = subprocess.run(
            [str(REPO / "image" / "build.sh"), target],
            cwd=REPO,
            env={**self.env, "PYTHON": python},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"image/build.sh {target} failed ({result.returncode}):\n"
                f"{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
            )
        return result.stdout.strip().splitlines()[-1]

    def popen(self, *args: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["podman", *args], env=self.env, **kwargs)

    def remove_containers(self, *names: str) -> None:
        if names:
            self.run("rm", "--force", "--ignore", "--time", "2", *names, check=False)

    def image_label(self, image: str, label: str) -> str:
        result = self.run(
            "image",
            "inspect",
            "--format",
            f'{{{{index .Config.Labels "{label}"}}}}',
            image,
            check=False,
        )
        return result.stdout.strip() if result.returncode == 0 else ""


@dataclass
class PrivateNetwork:
    """A bridge network of its own: ``name``, bridge device ``bridge``, ``gateway`` on the host."""

    name: str
    bridge: str
    subnet_index: int
    podman: Podman

    @property
    def gateway(self) -> str:
        return f"10.86.{self.subnet_index}.1"

    def address(self, host: int) -> str:
        """A fixed address for a container (``--ip``), 10 <= host < 250."""
        return f"10.86.{self.subnet_index}.{host}"

    def create(self) -> PrivateNetwork:
        self.remove()  # a bridge left by an interrupted run
        # The bridge and its address exist before any container: a server can bind it now.
        for command in (
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            subprocess.run(command, check=True, capture_output=True, timeout=30)
        conflist = {
            "cniVersion": "0.4.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [
                            [{"subnet": f"10.86.{self.subnet_index}.0/24", "gateway": self.gateway}]
                        ],
                        "dataDir": str(self.podman.folder / "cni-ipam"),
                    },
                }
            ],
        }
        (self.podman.networks / f"{self.name}.conflist").write_text(json.dumps(conflist, indent=2))
        return self

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)


class DockerSocket:
    """``podman system service`` on a unix socket under ``folder``: ``DOCKER_HOST`` for it."""

    def __init__(self, podman: Podman):
        self.podman = podman
        self.path = podman.folder / "podman.sock"
        self.process: subprocess.Popen | None = None

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    def start(self) -> DockerSocket:
        log = open(self.podman.folder / "podman-service.log", "wb")  # noqa: SIM115 - kept open
        self.process = self.podman.popen(
            "system", "service", "--time", "0", self.docker_host, stdout=log, stderr=log
        )
        deadline = time.monotonic() + 30
        while not self.path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "podman system service did not start: "
                    + (self.podman.folder / "podman-service.log").read_text()[-2000:]
                )
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
