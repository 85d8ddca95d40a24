"""What each step of the training pipeline gets from a run's arguments, and the compile-time
choices (backend, storage, the workspace's mount path).

One mapping for every caller: the pipeline calls it at compile time with KFP channels (the
f-strings become placeholders KFP resolves at run time); ``kfp-ddp render`` and the argument
check call it with plain values, so all of them hand the training step the very same inputs.
"""

import json
from collections.abc import Mapping
from typing import Any

from components.launcher.spec import TrainSpec
from pipelines.dataset import snapshot_path
from pipelines.latest_model import LATEST
from pipelines.parameters import step_parameters

WORKSPACE_MOUNT_PATH = "/workspace"
"""Where the workspace PVC is mounted in every step (compile time: kfp-kubernetes wants a str)."""
BACKENDS = ("kubernetes", "local")
STORAGE_MODES = ("object-store", "shared-volume")
DEFAULT_STORAGE = "object-store"
"""No claim at all: what runs on any cluster (RWO-only storage classes included)."""


def training_step_inputs(
    arguments: Mapping[str, Any],
    *,
    data_digest: Any,
    checkpoint_uri: Any,
    init_from: Any = None,
    data_dir: Any = "",
    pvc_name: Any = "",
    data_bytes: Any = 0,
) -> dict[str, Any]:
    """The training component's inputs for the pipeline's ``arguments``.

    Called by the pipeline at compile time (the values are KFP channels: the f-strings become
    placeholders KFP resolves at run time) and by ``kfp-ddp render`` and the argument check with
    plain values, so all of them hand the step the very same inputs. ``data_dir`` and
    ``pvc_name`` are the shared-volume storage's (the frozen data folder, the claim); with
    object-store storage every node stages ``data_uri`` itself and writes on its own disk.
    """
    a = arguments
    workspace_path = a["workspace_path"]
    shared = a.get("storage", DEFAULT_STORAGE) == "shared-volume"
    # Every parameter that sets a step input as it is (the declarations say which)...
    inputs = {name: a[parameter] for name, parameter in step_parameters().items()}
    # ...and what the pipeline derives from its storage, its steps and its compile-time choices.
    return inputs | {
        "name": "",
        "data_dir": data_dir if shared else "",
        "output_dir": f"{workspace_path}/train" if shared else "",
        "data_uri": "" if shared else a["data_uri"],
        "checkpoint_uri": checkpoint_uri,
        # The check step's, checked and pinned (latest resolved); the parameter itself elsewhere.
        "init_from": a["init_from"] if init_from is None else init_from,
        "backend": a["backend"],
        "pvc_name": pvc_name if shared else "",
        "pvc_mount_path": workspace_path if shared else "",
        "data_digest": data_digest,
        "data_bytes": 0 if shared else data_bytes,
        "cluster_settings_json": a.get("cluster_settings", ""),
    }


def checkpoint_base(arguments: Mapping[str, Any]) -> str:
    """Where the training keeps what outlives its pods: ``checkpoint_uri``, or without one
    ``<publish_uri>/training`` for object-store storage ('' — no mirror — for shared-volume)."""
    given = str(arguments.get("checkpoint_uri") or "")
    if given or arguments.get("storage", DEFAULT_STORAGE) == "shared-volume":
        return given
    return f"{str(arguments['publish_uri']).rstrip('/')}/training"


def staged_data_dir(arguments: Mapping[str, Any], digest: str) -> str:
    """Where the data step freezes ``arguments``' data of ``digest`` (render's view of it;
    '' with object-store storage, where each node stages it)."""
    if arguments.get("storage", DEFAULT_STORAGE) != "shared-volume":
        return ""
    return str(
        snapshot_path(
            arguments["workspace_path"],
            arguments["data_uri"],
            arguments.get("s3_endpoint") or None,
            digest,
        )
    )


def planned_step_inputs(
    arguments: Mapping[str, Any], data_digest: str, data_bytes: int = 0
) -> dict[str, Any]:
    """The training step's inputs from plain values, for a data step that found ``data_digest``
    and ``data_bytes`` (``kfp-ddp render`` and the argument check: what the pipeline would hand
    the step). ``init_from=latest`` is resolved by the check step when the run starts (the
    model published last); planned here, it is the run without it (random weights)."""
    given = arguments.get("init_from")
    return training_step_inputs(
        arguments,
        data_dir=staged_data_dir(arguments, data_digest),
        data_digest=data_digest,
        pvc_name=arguments.get("workspace_pvc", ""),
        checkpoint_uri=checkpoint_base(arguments),
        init_from="" if given == LATEST else given,
        data_bytes=data_bytes,
    )


def cluster_settings_json(settings: Mapping[str, Any] | None) -> str:
    """The compile-time node-access settings as the training step's ``cluster_settings_json``
    (checked: TrainSpec fields only)."""
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(TrainSpec.setting_names()))
    if unknown:
        raise ValueError(
            f"cluster_settings: unknown TrainSpec field(s) {unknown}; e.g. "
            '{"pod_security": "privileged", "stage_cache_host_path": "/mnt/kfp-ddp-cache"}'
        )
    return json.dumps(settings, sort_keys=True) if settings else ""


def check_build_options(backend: str, storage: str, workspace_size: str | None) -> None:
    """The compile-time choices go together (raises ValueError naming the one that does not)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: use one of {', '.join(BACKENDS)}")
    if storage not in STORAGE_MODES:
        raise ValueError(f"storage={storage!r}: use one of {', '.join(STORAGE_MODES)}")
    if workspace_size is not None and storage != "shared-volume":
        raise ValueError(
            f"workspace_size={workspace_size!r} creates a claim: storage={storage!r} uses none "
            "(pass storage='shared-volume', or leave workspace_size out)"
        )
