"""A local folder of images served as S3, for ``kfp-ddp run-local --data`` and ``make demo``.

The pipeline reads its data from S3 on a cluster and here alike, so a folder on this machine is
put behind a local S3 server (SeaweedFS, ``kfp_ddp.local_s3``) first: its objects stay in a
folder of the caller's so that a second run syncs only what changed (the data step's digest, and
with it the training's caching, stays the same for unchanged data). While the context is open,
the standard AWS variables point at the server, as a Kubernetes Secret would on a cluster;
kfp.local's step processes inherit them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from components.s3_sync import sync
from components.s3_sync.options import SyncReport
from kfp_ddp.local_s3 import LocalS3Server

LOCAL_BUCKET = "kfp-ddp-local"
LOCAL_MODELS_URI = f"s3://{LOCAL_BUCKET}/models"
"""Where ``run-local --data`` publishes when no publish_uri is given."""


@dataclass(frozen=True)
class ServedData:
    """A folder's copy in the local S3 server, and where the models may go beside it."""

    data_uri: str
    endpoint_url: str
    models_uri: str
    upload: SyncReport
    server: LocalS3Server
    """The running server (its ``client()`` reads back what the run wrote)."""


@contextmanager
def served_folder(
    folder: Path,
    s3_data: Path,
    *,
    bucket: str = LOCAL_BUCKET,
    data_prefix: str | None = None,
    models_prefix: str = "models",
) -> Iterator[ServedData]:
    """Serve ``folder`` from a local S3 server that keeps its objects in ``s3_data``; the data
    at ``s3://<bucket>/<data_prefix>`` (default ``datasets/<the folder's name>``), the same
    files as the folder (what an earlier run uploaded and the folder no longer has is
    removed)."""
    data_uri = f"s3://{bucket}/{data_prefix}" if data_prefix else local_data_uri(folder, bucket)
    with LocalS3Server(data_dir=s3_data) as s3, environment(s3.env()):
        s3.create_bucket(bucket)
        # A mirror of the folder: a file removed from it (a bad image deleted, an image moved
        # from train/ to val/) leaves the served copy too, or it would still train on it.
        upload = sync(
            str(folder),
            data_uri,
            endpoint_url=s3.endpoint_url,
            progress=False,
            delete=True,
            max_delete="100%",
        )
        yield ServedData(
            data_uri=data_uri,
            endpoint_url=s3.endpoint_url,
            models_uri=f"s3://{bucket}/{models_prefix}",
            upload=upload,
            server=s3,
        )


def links_not_served(folder: Path) -> list[str]:
    """The links under ``folder`` that its upload to the local S3 server does not follow, as
    ``'train' -> /elsewhere/train``: every linked folder (an upload never descends into one) and
    every linked file that leads out of ``folder``. The data step would not see what they hold
    (``components.s3_sync.local_files.walk_local``'s rule)."""
    root = os.path.realpath(folder)
    found = []
    for top, dirs, files in os.walk(folder):  # links to folders are listed, not descended
        for name in sorted(dirs + files):
            path = Path(top, name)
            if not path.is_symlink():
                continue
            target = os.path.realpath(path)
            leaves = os.path.commonpath([root, target]) != root
            if name in dirs or leaves:
                found.append(f"{str(path.relative_to(folder))!r} -> {target}")
    return found


def local_data_uri(folder: Path, bucket: str = LOCAL_BUCKET) -> str:
    """Where ``served_folder`` puts ``folder``: ``s3://<bucket>/datasets/<its name>``."""
    return f"s3://{bucket}/datasets/{_key_part(folder.resolve().name)}"


def local_gpu_count() -> int:
    """CUDA GPUs this machine has (0 with a CPU build of torch)."""
    import torch  # ~1 s: only run-local asks

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _key_part(name: str) -> str:
    """A folder name as one plain key segment (``My Photos`` -> ``my-photos``)."""
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "data"


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment (inherited by the processes it starts, such as
    kfp.local's steps) while the context is open; what was there before comes back after."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
