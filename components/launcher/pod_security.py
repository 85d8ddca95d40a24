"""The security contexts that make every pod we create or cause pass its Pod Security Standard.

``TrainSpec.pod_security`` names the level (Kubernetes' Pod Security Standards):

- ``restricted`` (the default): the pod runs as a non-root numeric user (``run_as_user``, the
  image's ``kfp-ddp`` user 1000) with ``runAsNonRoot``, a ``RuntimeDefault`` seccomp profile and
  ``fsGroup`` (volumes writable by the group); every container — ours and our init container —
  has ``allowPrivilegeEscalation: false`` and drops ``ALL`` capabilities.
- ``baseline``: no privilege escalation, ``RuntimeDefault`` seccomp; the image may run as root.
- ``privileged``: nothing imposed but the read-only root (below); the one level that allows
  the opt-in ``capabilities`` (IPC_LOCK for RDMA), ``host_network`` and a hostPath staging cache
  (``TrainSpec`` refuses them at the other levels, naming the level they need).

At every level, every container's root file system is read-only (``readOnlyRootFilesystem``: no
process can alter the image's programs, and nothing is written to the node's disk outside a
bounded volume): the containers write to /dev/shm, the scratch emptyDirs at /tmp and HOME
(``SCRATCH_DIRS``), the staging volume and the job's PVCs (``pod_parts.volumes``).

The same contexts go into the TrainJob's runtime patch (pod and ``node`` container) and the
PyTorchJob/TFJob pod template (every container and init container).
"""

from __future__ import annotations

from kubernetes import client as k8s

from components.launcher.spec import TrainSpec


def pod_context(spec: TrainSpec) -> k8s.V1PodSecurityContext | None:
    """The pod's securityContext for ``spec.pod_security``."""
    group = spec.run_as_group
    strict = spec.pod_security != "privileged"
    context = k8s.V1PodSecurityContext(
        run_as_user=spec.run_as_user,
        run_as_group=group,
        fs_group=group,
        # Only when the volume's root is not ours yet: never a recursive chown of a big claim.
        fs_group_change_policy="OnRootMismatch" if group is not None else None,
        run_as_non_root=True if spec.pod_security == "restricted" else None,
        seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault") if strict else None,
    )
    return context if any(v is not None for v in context.to_dict().values()) else None


def container_context(spec: TrainSpec, *, training: bool = True) -> k8s.V1SecurityContext:
    """A container's securityContext (``training``: the one that may add capabilities)."""
    level = spec.pod_security
    added = spec.capabilities if training and level == "privileged" else []
    dropped = ["ALL"] if level == "restricted" else None
    capabilities = k8s.V1Capabilities(add=added or None, drop=dropped) if added or dropped else None
    return k8s.V1SecurityContext(
        allow_privilege_escalation=False if level != "privileged" else None,
        capabilities=capabilities,
        read_only_root_filesystem=True,
    )
