"""A real node for a test control plane: containerd + runc + the kubelet, kube-scheduler, CoreDNS.

The recipe is ``../shared/envtest/node/`` (what each setting is for is written there); here it is
started on ports and folders of the test session's own:

* a bridge ``kfpnode0`` with the node's address (``10.85.0.1/16``) and a MAC address of its own
  (:data:`BRIDGE_MAC`): pods get addresses on it from CNI's bridge + host-local plugins, without
  masquerading or firewall rules (the host's iptables stay as they are, and pods reach nothing
  outside this machine); servers the pods need (the test S3 server, CoreDNS) listen on the
  node's address;
* containerd (state, runc state, CNI configuration under the session's folder; its image store
  kept between sessions, :mod:`tests.cluster.image_store`) pulling from the tests' loopback
  registry over http, the pause image included;
* the kubelet, registered as ``node_name`` with the plane's node token, authenticating the API
  server's client certificate (``pods/log``, ``exec``); both inside one private mount namespace
  where the three sysctls the kubelet would rewrite are bind-mounted with its values, so the
  host's never change;
* the kube-scheduler (controllers' pods are placed, as on a cluster) and CoreDNS (``cluster.local``
  on the node's address: headless Services' pods resolve by name).

:meth:`RealNode.stop` leaves nothing behind: pods deleted, containers killed, processes stopped,
the bridge, the ``kubepods`` cgroups and containerd's ``/run/containerd/s`` removed (the mounts
die with the mount namespace); of the image store only the images the session pulled are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kfp_ddp.free_ports import free_ports
from tests.cluster.control_plane import ENVTEST_CONFIG, ControlPlane
from tests.cluster.image_store import ImageStore
from tests.cluster.processes import Component, StartupError, log_tail

BRIDGE = "kfpnode0"
GATEWAY = "10.85.0.1"
"""The node's address, on its bridge (podman's 10.88/16 and the image tests' 10.86/16 differ)."""
SUBNET = "10.85.0.0/16"
BRIDGE_MAC = "02:6b:66:70:00:01"
"""The bridge's own address, set when it is made (a locally administered one). A bridge whose
address the kernel picks takes its lowest port's, so it changed whenever a pod's veth came or
went; the pods kept the old one for their gateway (the kernel announces no change), and their
packets to the node's address (CoreDNS, the S3 server) went nowhere until their ARP entry
expired: 20-50 s of failed lookups after a pod was replaced (the deleted-pod test took 38-84 s)."""
NODE_BINARIES = ("kubelet", "kube-scheduler", "coredns")
PROGRAMS = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "unshare": "util-linux",
    "ip": "iproute2",
    "gcc": "gcc",
}
"""The programs a node needs, and their Debian packages (.ci/run installs them)."""
CNI = Path("/usr/lib/cni")
DISABLED_SNAPSHOTTERS = ", ".join(
    f'"io.containerd.snapshotter.v1.{name}"' for name in ("btrfs", "zfs", "aufs", "devmapper")
)
SYSCTLS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
"""What the kubelet sets at start: masked in its mount namespace, the host's values stay."""
CONTAINER_LOGS = Path("/var/log/containers")
"""The kubelet's hard-coded link folder: a private folder is bound over it in its namespace."""
PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction term = {.sa_handler = stop};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &term, NULL);
  sigaction(SIGTERM, &term, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
}
"""
"""Every pod's sandbox: sleeps until SIGTERM, reaps its children (what Kubernetes' pause does)."""


def missing() -> str | None:
    """Why a real node cannot start here (None: it can)."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, the kubelet, a bridge, cgroups)"
    absent = sorted({pkg for tool, pkg in PROGRAMS.items() if shutil.which(tool) is None})
    if not (CNI / "bridge").exists() or not (CNI / "host-local").exists():
        absent.append("containernetworking-plugins")
    if absent:
        return (
            "a real node needs the Debian packages " + ", ".join(absent) + " (.ci/run installs "
            "them when it runs as root: apt-get install " + " ".join(absent) + ")"
        )
    return None


def build_pause(folder: Path) -> Path:
    """A static pause binary, compiled here with gcc (no registry has to serve it)."""
    source, binary = folder / "pause.c", folder / "pause"
    source.write_text(PAUSE_C)
    subprocess.run(
        ["gcc", "-static", "-Os", "-s", "-o", str(binary), str(source)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return binary


@dataclass
class RealNode:
    """One kubelet node of ``plane`` (whose ``node_name`` it registers as)."""

    plane: ControlPlane
    folder: Path
    kubelet: Path
    scheduler: Path
    coredns: Path
    registry: str
    """``127.0.0.1:PORT`` of a plain-http registry containerd pulls from."""
    pause_image: str
    store: ImageStore = field(default_factory=ImageStore)
    """containerd's root: images pulled by an earlier session stay unpacked there."""
    components: list[Component] = field(default_factory=list)
    namespace_process: subprocess.Popen | None = None
    ports: dict[str, int] = field(default_factory=dict)
    host_sysctls: dict[str, str] = field(default_factory=lambda: host_sysctls())
    """The host's values of ``SYSCTLS`` before the node started (:meth:`traces` compares)."""

    @property
    def name(self) -> str:
        assert self.plane.node_name
        return self.plane.node_name

    @property
    def socket(self) -> Path:
        return self.folder / "containerd" / "containerd.sock"

    # -- start ------------------------------------------------------------------------------
    def start(self) -> RealNode:
        began = time.monotonic()
        try:
            self._bridge()
            self.store.claim()
            names = ("kubelet", "kubelet_healthz", "scheduler", "dns_health", "dns_ready")
            self.ports = dict(zip(names, free_ports(len(names)), strict=True))
            self._write_configuration()
            self._start_runtime_and_kubelet()
            self._start_scheduler_and_dns()
            self._wait_ready(timeout=90)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began
        return self

    def _bridge(self) -> None:
        # What a session killed outright (no finalizer ran) left: its bridge, its pods' shims.
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, timeout=30)
        kill_orphaned_shims()
        for command in (
            ["ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge"],
            ["ip", "addr", "add", f"{GATEWAY}/16", "dev", BRIDGE],
            ["ip", "link", "set", BRIDGE, "up"],
        ):
            subprocess.run(command, check=True, capture_output=True, timeout=30)

    def _write_configuration(self) -> None:
        folder = self.folder
        for sub in ("conf", "cni/net.d", "logs", "kubelet", "pod-logs", "sysctl", "var-log"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        (folder / "conf" / "containerd.toml").write_text(self._containerd_toml())
        (folder / "cni" / "net.d" / "10-node.conflist").write_text(json.dumps(self._cni()))
        (folder / "conf" / "kubelet.yaml").write_text(yaml.safe_dump(self._kubelet_config()))
        (folder / "conf" / "kubelet.kubeconfig").write_text(yaml.safe_dump(self._kubeconfig()))
        for name, value in SYSCTLS.items():
            (folder / "sysctl" / name.replace("/", "_")).write_text(value + "\n")

    def _containerd_toml(self) -> str:
        f = self.folder / "containerd"
        return textwrap.dedent(
            f"""\
            version = 2
            root = "{self.store.root}"
            state = "{f}/state"
            disabled_plugins = [{DISABLED_SNAPSHOTTERS}]
            [grpc]
              address = "{self.socket}"
            [ttrpc]
              address = "{self.socket}.ttrpc"
            [plugins]
              [plugins."io.containerd.internal.v1.opt"]
                path = "{f}/opt"
              [plugins."io.containerd.grpc.v1.cri"]
                sandbox_image = "{self.pause_image}"
                stream_server_address = "127.0.0.1"
                stream_server_port = "0"
                enable_selinux = false
                netns_mounts_under_state_dir = true
                restrict_oom_score_adj = true
                [plugins."io.containerd.grpc.v1.cri".containerd]
                  snapshotter = "overlayfs"
                  default_runtime_name = "runc"
                  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
                    runtime_type = "io.containerd.runc.v2"
                    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
                      SystemdCgroup = false
                      BinaryName = "{shutil.which("runc")}"
                      Root = "{f}/runc-root"
                [plugins."io.containerd.grpc.v1.cri".cni]
                  bin_dir = "{CNI}"
                  conf_dir = "{self.folder}/cni/net.d"
                [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{self.registry}"]
                  endpoint = ["http://{self.registry}"]
            """
        )

    def _cni(self) -> dict:
        return {
            "cniVersion": "1.0.0",
            "name": "kfp-ddp-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]],
                        "dataDir": str(self.folder / "cni" / "ipam"),
                    },
                }
            ],
        }

    def _kubelet_config(self) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": GATEWAY,
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["kubelet_healthz"],
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "makeIPTablesUtilChains": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "imageServiceEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(self.folder / "pod-logs"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.plane.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDomain": "cluster.local",
            "clusterDNS": [GATEWAY],
            # Evict for a full disk only when it really is: this machine's disk is shared.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusReportFrequency": "10s",
            # How often the kubelet measures emptyDirs (1m by default): an emptyDir over its
            # sizeLimit is evicted within seconds rather than a minute or two.
            "volumeStatsAggPeriod": "5s",
            "serializeImagePulls": False,
            "volumePluginDir": str(self.folder / "kubelet" / "volume-plugins"),
        }

    def _kubeconfig(self) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "plane",
                    "cluster": {
                        "server": self.plane.url,
                        "certificate-authority": str(self.plane.ca_file),
                    },
                }
            ],
            "users": [{"name": "node", "user": {"token": self.plane.node_token}}],
            "contexts": [{"name": "node", "context": {"cluster": "plane", "user": "node"}}],
            "current-context": "node",
        }

    def _start_runtime_and_kubelet(self) -> None:
        """containerd, then the kubelet, in one private mount namespace (see the module doc)."""
        f = self.folder
        masks = "\n".join(
            f"mount --bind {f}/sysctl/{name.replace('/', '_')} /proc/sys/{name}" for name in SYSCTLS
        )
        CONTAINER_LOGS.mkdir(parents=True, exist_ok=True)
        script = textwrap.dedent(
            f"""\
            set -e
            {masks}
            mount --bind {f}/var-log {CONTAINER_LOGS}
            containerd --config {f}/conf/containerd.toml > {f}/logs/containerd.log 2>&1 &
            echo $! > {f}/containerd.pid
            for i in $(seq 1 300); do [ -S {self.socket} ] && break; sleep 0.1; done
            {self.kubelet} --config={f}/conf/kubelet.yaml \\
              --kubeconfig={f}/conf/kubelet.kubeconfig --root-dir={f}/kubelet \\
              --cert-dir={f}/kubelet/pki --hostname-override={self.name} --node-ip={GATEWAY} \\
              -v=2 > {f}/logs/kubelet.log 2>&1 &
            echo $! > {f}/kubelet.pid
            wait
            """
        )
        (f / "node.sh").write_text(script)
        with (f / "logs" / "node-namespace.log").open("ab") as log:
            self.namespace_process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "bash", str(f / "node.sh")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip

    def _start_scheduler_and_dns(self) -> None:
        kubeconfig = str(self.plane.kubeconfig())
        scheduler = Component(
            "kube-scheduler",
            [
                str(self.scheduler),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
            ],
            self.folder / "logs" / "kube-scheduler.log",
        ).start()
        self.components.append(scheduler)
        dns = Component(
            "coredns",
            [str(self.coredns), "-conf", str(ENVTEST_CONFIG / "Corefile")],
            self.folder / "logs" / "coredns.log",
            {
                "KUBECONFIG": kubeconfig,
                "DNS_ADDR": GATEWAY,
                "DNS_PORT": "53",
                "HEALTH_ADDR": f"127.0.0.1:{self.ports['dns_health']}",
                "READY_ADDR": f"127.0.0.1:{self.ports['dns_ready']}",
            },
        ).start()
        self.components.append(dns)
        scheduler.wait_ready(f"https://127.0.0.1:{self.ports['scheduler']}/healthz", timeout=60)
        dns.wait_ready(f"http://127.0.0.1:{self.ports['dns_ready']}/ready", timeout=60)

    def _wait_ready(self, timeout: float) -> None:
        """The Node Ready, without the not-ready taint (the scheduler places pods only then)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = client.CoreV1Api(self.plane.admin_client())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.namespace_process is not None and self.namespace_process.poll() is not None:
                break
            try:
                node = api.read_node(self.name)
            except ApiException:
                time.sleep(0.3)
                continue
            ready = any(
                c.type == "Ready" and c.status == "True" for c in node.status.conditions or []
            )
            tainted = any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])
            if ready and not tainted:
                return
            time.sleep(0.3)
        raise StartupError(
            f"node {self.name} was not Ready within {timeout:g} s; kubelet log:\n"
            f"{log_tail(self.folder / 'logs' / 'kubelet.log', 40)}\ncontainerd log:\n"
            f"{log_tail(self.folder / 'logs' / 'containerd.log', 15)}"
        )

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Everything this node started, and every trace of it on the host, gone."""
        self.stop_processes()
        self.remove_traces()

    def stop_processes(self) -> None:
        """Its pods' containers, the kubelet, containerd, the scheduler and CoreDNS stopped; the
        bridge stays (a server on the node's address stops before :meth:`remove_traces`)."""
        self._kill_containers()
        self._stop_pid(self.folder / "kubelet.pid")
        self._forget_containers()
        self._stop_pid(self.folder / "containerd.pid")
        if self.namespace_process is not None:
            try:
                self.namespace_process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.namespace_process.pid, signal.SIGKILL)
                self.namespace_process.wait(timeout=15)
        self._kill_shims()
        self.store.release()
        for component in reversed(self.components):
            component.stop()
        self.components.clear()

    def remove_traces(self) -> None:
        """The bridge, the ``kubepods`` cgroups and containerd's empty run folders removed."""
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, timeout=30)
        remove_kubepods_cgroups()
        for leftover in (Path("/run/containerd/s"), Path("/run/containerd")):
            with _suppress_oserror():
                leftover.rmdir()  # only when empty: another containerd's are left alone
        with _suppress_oserror():
            CONTAINER_LOGS.rmdir()

    def traces(self) -> list[str]:
        """What this node left on the host after :meth:`stop` (nothing, if it stopped well): its
        processes (containerd, the kubelet, shims: their command lines name its folder), mounts
        of its folder, the bridge, the ``kubepods`` cgroups, a changed sysctl."""
        folder = str(self.folder)
        found = [
            f"process {pid}: {command[:160]}" for pid, command in _processes() if folder in command
        ]
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        found += [f"mount: {line.split()[4]}" for line in mounts if folder in line]
        if bridge_exists():
            found.append(f"the bridge {BRIDGE}")
        found += [f"the cgroup {path}" for path in kubepods_cgroups()]
        now = host_sysctls()
        found += [
            f"sysctl {name}: {was} before the node, {now[name]} now"
            for name, was in self.host_sysctls.items()
            if now[name] != was
        ]
        return found

    @property
    def _ctr(self) -> list[str]:
        return ["ctr", "--address", str(self.socket), "--namespace", "k8s.io"]

    def _kill_containers(self) -> None:
        """Every task of this node's containerd killed (its pods' processes)."""
        if not self.socket.exists():
            return
        ctr = self._ctr
        listed = subprocess.run(
            [*ctr, "tasks", "ls", "-q"], capture_output=True, text=True, timeout=30
        )
        for task in listed.stdout.split():
            subprocess.run([*ctr, "tasks", "kill", "--signal", "SIGKILL", task],
                           capture_output=True, timeout=30)  # fmt: skip
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            listed = subprocess.run(
                [*ctr, "tasks", "ls"], capture_output=True, text=True, timeout=30
            )
            if "RUNNING" not in listed.stdout:
                return
            time.sleep(0.2)

    def _forget_containers(self) -> None:
        """The kubelet gone, containerd still up: the image store keeps only images."""
        if not self.socket.exists():
            return
        try:
            self.store.forget(self._ctr)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            # The store is emptied when the next node starts; the stop goes on.
            warnings.warn(f"the node's image store is emptied next start: {exc}", stacklevel=2)

    @staticmethod
    def _stop_pid(path: Path) -> None:
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            return
        with _suppress_oserror():
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                return
            time.sleep(0.1)
        with _suppress_oserror():
            os.kill(pid, signal.SIGKILL)

    def _kill_shims(self) -> None:
        """containerd's shims of this node (their command line names its socket)."""
        found = subprocess.run(
            ["pgrep", "-f", f"containerd-shim-runc-v2 .*-address {self.socket}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        for pid in found.stdout.split():
            with _suppress_oserror():
                os.kill(int(pid), signal.SIGKILL)

    def image_names(self) -> list[str]:
        """The references of the images containerd holds (names and IDs)."""
        listed = subprocess.run(
            [*self._ctr, "images", "ls", "-q"], capture_output=True, text=True, timeout=30
        )
        return listed.stdout.split()

    def node_processes(self) -> list[str]:
        """This node's containerd, kubelet and shim processes still running (for the tests)."""
        found = subprocess.run(
            ["pgrep", "-af", f"{self.folder}|containerd-shim-runc-v2 .*{self.socket}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def kill_orphaned_shims() -> None:
    """Shims of a test node whose containerd is gone (its socket removed with its folder)."""
    found = subprocess.run(
        ["pgrep", "-af", "containerd-shim-runc-v2 -namespace k8s.io"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    for line in found.stdout.splitlines():
        pid, _, command = line.partition(" ")
        address = command.split(" -address ", 1)[-1].split()[0] if " -address " in command else ""
        if "/real-node" in address and not Path(address).exists():
            with _suppress_oserror():
                os.kill(int(pid), signal.SIGKILL)


def remove_kubepods_cgroups() -> None:
    """The kubelet's ``kubepods`` cgroups in every hierarchy, deepest first (only empty ones
    can go; the processes in them are gone by now)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        for folder in sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        ):
            with _suppress_oserror():
                folder.rmdir()
        with _suppress_oserror():
            top.rmdir()


def host_sysctls() -> dict[str, str]:
    """The host's values of the sysctls the kubelet would set (``SYSCTLS``)."""
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in SYSCTLS}


def _processes() -> list[tuple[int, str]]:
    """Every process's id and command line (those that end meanwhile left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with _suppress_oserror():
                raw = (entry / "cmdline").read_bytes()
                found.append((int(entry.name), raw.replace(b"\0", b" ").decode(errors="replace")))
    return found


def kubepods_cgroups() -> list[Path]:
    return [h / "kubepods" for h in Path("/sys/fs/cgroup").iterdir() if (h / "kubepods").is_dir()]


class _suppress_oserror:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is not None and issubclass(kind, OSError)


def bridge_exists() -> bool:
    return Path(f"/sys/class/net/{BRIDGE}").exists()


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0
