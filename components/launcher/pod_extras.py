"""``PodExtras``: the pod settings a ``TrainSpec`` carries as plain Kubernetes JSON.

Most of a training pod has a typed ``TrainSpec`` field (GPUs, CPU, memory, tolerations, node
selector, PVC mounts, plain env values). What a KFP task forwards to the job (``task_config``,
see ``task_config.py``) can hold more: an affinity, environment variables that reference a
Secret, a ConfigMap or the pod's own fields (``valueFrom``: the value never enters a manifest),
and volumes with their mounts (a PVC with a ``subPath``, a Secret or ConfigMap volume, KFP's
workspace). Those travel here in the Kubernetes API's own JSON shape, the shape KFP's backend
fills in, and go unchanged into the TrainJob's runtime patch and the PyTorchJob/TFJob pod
template, beside what the spec builds.

They obey the spec's rules (``spec_problems``, run by ``TrainSpec``'s checks): volume kinds by
the Pod Security level (``restricted`` allows exactly the kinds Kubernetes' restricted standard
allows; a hostPath volume needs ``pod_security=privileged`` and a folder outside the node's
system folders, like ``stage_cache_host_path``), no name or mount path that one of the spec's
own volumes uses (the scratch emptyDirs at /tmp and HOME included: a mount below them is fine),
no variable the spec or the controller sets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from components.launcher.names import DNS1123_LABEL, ENV_NAME, controller_env
from components.launcher.pod_paths import (
    SCRATCH_ENV,
    host_path_problem,
    scratch_clash,
    scratch_dir_at,
)

AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
RESTRICTED_VOLUME_KINDS = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
"""The volume kinds Kubernetes' restricted Pod Security Standard allows."""
RESERVED_VOLUME_NAMES = ("dshm", "tmp", "home", "staged-data", "stage-cache")
"""Volume names the spec's own volumes use (``pod_parts``; PVC mounts are ``pvc-N``)."""
RESERVED_PATHS = ("/dev/shm", "/stage", "/stage-cache")


@dataclass(frozen=True, kw_only=True)
class PodExtras:
    """Pod settings as Kubernetes JSON, for what ``TrainSpec`` has no typed field of its own."""

    affinity: dict[str, Any] | None = None
    """The pods' affinity (Kubernetes ``Affinity``: nodeAffinity, podAffinity,
    podAntiAffinity)."""
    env: list[dict[str, Any]] = field(default_factory=list)
    """Environment variables of the training container taken from a reference (Kubernetes
    ``EnvVar`` with ``valueFrom``: secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."""
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """Volumes of the pods (Kubernetes ``Volume``: a name and one source)."""
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    """Their mounts in the training container (Kubernetes ``VolumeMount``)."""

    @classmethod
    def coerce(cls, value: Any) -> PodExtras:
        """A PodExtras from itself, None, a dict of its fields (snake or camel case) or JSON."""
        if isinstance(value, PodExtras):
            return value
        if value is None or value == "":
            return cls()
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"pod_extras is not JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise ValueError(f"pod_extras={value!r} must be a dict of affinity/env/volumes")
        data = {("volume_mounts" if k == "volumeMounts" else k): v for k, v in value.items()}
        unknown = sorted(set(data) - {"affinity", "env", "volumes", "volume_mounts"})
        if unknown:
            raise ValueError(
                f"pod_extras: unknown keys {unknown}; allowed: affinity, env, volumes, "
                "volume_mounts"
            )
        return cls(
            affinity=data.get("affinity") or None,
            env=list(data.get("env") or []),
            volumes=list(data.get("volumes") or []),
            volume_mounts=list(data.get("volume_mounts") or []),
        )

    def __bool__(self) -> bool:
        return bool(self.affinity or self.env or self.volumes or self.volume_mounts)

    def __repr__(self) -> str:
        """Names and paths only: an env entry could carry a value someone put there by hand."""
        volumes = [v.get("name") for v in self.volumes if isinstance(v, dict)]
        paths = [m.get("mountPath") for m in self.volume_mounts if isinstance(m, dict)]
        return (
            f"PodExtras(affinity={sorted(self.affinity or {})}, env={self.env_names()}, "
            f"volumes={volumes}, volume_mounts={paths})"
        )

    def env_names(self) -> list[str]:
        return [str(e.get("name")) for e in self.env if isinstance(e, dict)]


def volume_kind(volume: dict[str, Any]) -> str:
    """The source of a Kubernetes Volume JSON (``persistentVolumeClaim``, ``secret``...)."""
    kinds = [k for k in volume if k != "name"]
    return kinds[0] if len(kinds) == 1 else ""


def spec_problems(spec: Any) -> list[tuple[str, str]]:
    """(field, why) for every way ``spec.pod_extras`` breaks the spec's rules."""
    extras: PodExtras = spec.pod_extras
    found = _affinity_problems(extras.affinity)
    found += _env_problems(spec, extras)
    found += _volume_problems(spec, extras)
    return found


def _affinity_problems(affinity: Any) -> list[tuple[str, str]]:
    if affinity is None:
        return []
    if not isinstance(affinity, dict) or set(affinity) - set(AFFINITY_KINDS):
        return [
            ("pod_extras", f"affinity must be a Kubernetes Affinity ({', '.join(AFFINITY_KINDS)})")
        ]
    return []


def _env_problems(spec: Any, extras: PodExtras) -> list[tuple[str, str]]:

    found = []
    own = set(spec.merged_env()) | set(_s3_names(spec)) | set(SCRATCH_ENV)
    controller = controller_env(spec.api, spec.runtime.policy)
    seen: set[str] = set()
    for var in extras.env:
        name = var.get("name") if isinstance(var, dict) else None
        source = (var.get("valueFrom") or {}) if isinstance(var, dict) else {}
        if not isinstance(name, str) or not ENV_NAME.match(name):
            found.append(("pod_extras", f"env {var!r}: needs a valid variable name"))
            continue
        if "value" in var or not isinstance(source, dict) or len(source) != 1:
            found.append(
                (
                    "pod_extras",
                    f"env {name}: needs exactly one valueFrom source of {', '.join(ENV_SOURCES)} "
                    "(plain values go in env)",
                )
            )
        elif next(iter(source)) not in ENV_SOURCES:
            found.append(("pod_extras", f"env {name}: valueFrom allows {', '.join(ENV_SOURCES)}"))
        if name in own or name in seen:
            found.append(("pod_extras", f"env {name}: set twice (the spec sets it too)"))
        if controller is not None and controller.taken([name]):
            found.append(("pod_extras", f"env {name} is set by {controller.owner}"))
        seen.add(name)
    return found


def _s3_names(spec: Any) -> list[str]:
    names = ["AWS_ENDPOINT_URL_S3"] if spec.s3_endpoint else []
    if spec.s3_credentials_secret:
        names += ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    return names


def _volume_problems(spec: Any, extras: PodExtras) -> list[tuple[str, str]]:

    found = []
    names: dict[str, dict[str, Any]] = {}
    for volume in extras.volumes:
        name = volume.get("name") if isinstance(volume, dict) else None
        if not isinstance(name, str) or not DNS1123_LABEL.match(name) or len(name) > 63:
            found.append(("pod_extras", f"volume {volume!r}: needs a DNS-1123 label as its name"))
            continue
        if name in RESERVED_VOLUME_NAMES or name.startswith("pvc-"):
            found.append(("pod_extras", f"volume {name}: the name of one of the spec's volumes"))
        if name in names and names[name] != volume:
            found.append(("pod_extras", f"volume {name}: two different volumes of that name"))
        names[name] = volume
        why = _source_problem(spec, volume)
        if why:
            found.append(("pod_extras", f"volume {name}: {why}"))
    return found + _mount_problems(spec, extras, set(names))


def _source_problem(spec: Any, volume: dict[str, Any]) -> str:
    """What the Pod Security level (or the node's safety) says against a volume's source."""
    kind = volume_kind(volume)
    if not kind:
        return "needs exactly one source"
    if kind == "hostPath":
        if spec.pod_security != "privileged":
            return (
                f"a hostPath volume (the node's file system) is refused by the "
                f"{spec.pod_security} Pod Security Standard: it needs pod_security=privileged (a "
                "cluster setting) and a namespace that enforces privileged"
            )
        why = host_path_problem((volume.get("hostPath") or {}).get("path"))
        return f"hostPath {why}" if why else ""
    if kind not in RESTRICTED_VOLUME_KINDS and spec.pod_security == "restricted":
        return (
            f"{kind} volumes are refused by the restricted Pod Security Standard (it allows "
            f"{', '.join(RESTRICTED_VOLUME_KINDS)}): use one of those, or pod_security=baseline"
        )
    return ""


def _mount_problems(spec: Any, extras: PodExtras, names: set[str]) -> list[tuple[str, str]]:
    found = []
    taken = {p.path for p in spec.pvcs} | set(RESERVED_PATHS)
    for mount in extras.volume_mounts:
        name = mount.get("name") if isinstance(mount, dict) else None
        path = mount.get("mountPath") if isinstance(mount, dict) else None
        if name not in names:
            found.append(("pod_extras", f"volume mount {mount!r}: names no volume of pod_extras"))
        if not isinstance(path, str) or not path.startswith("/"):
            found.append(("pod_extras", f"volume mount {mount!r}: needs an absolute mountPath"))
            continue
        scratch = scratch_dir_at(path)
        if scratch:
            found.append(("pod_extras", f"volume mount {name} at {path}: {scratch_clash(scratch)}"))
        elif path in taken or any(path.startswith(p + "/") for p in RESERVED_PATHS):
            found.append(
                ("pod_extras", f"volume mount {name} at {path}: a path the spec mounts too")
            )
        taken.add(path)
    return found
