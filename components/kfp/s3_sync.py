"""KFP component for the S3 sync: thin wrapper around ``components.s3_sync.sync()``.

Credentials are never parameters: the step reads them from its environment, which a pipeline
fills from a Kubernetes Secret with :func:`use_s3_credentials`.
"""

# No `from __future__ import annotations` here: KFP reads the real types of the signature.
from kfp import dsl
from kfp.dsl import Dataset, Output

from components import DEFAULT_IMAGE
from components.kfp.factory import make_component

SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
"""Keys of the Kubernetes Secret that :func:`use_s3_credentials` exposes as env vars."""


def s3_sync_component(
    source: str,
    destination: str,
    endpoint_url: str,
    include: list,
    exclude: list,
    delete: bool,
    dataset: Output[Dataset],
    max_delete: str = "",
    dry_run: bool = False,
) -> str:
    """Sync source to destination (s3://bucket/prefix to a folder, or back); returns the digest.

    Credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, e.g. from a
    Kubernetes Secret), never from parameters.

    Args:
        source: s3://bucket/prefix or a folder to copy from.
        destination: a folder or s3://bucket/prefix to copy to (the other side of source).
        endpoint_url: URL of an S3-compatible endpoint (MinIO, SeaweedFS...); empty for the
            standard AWS environment and config.
        include: glob patterns of relative paths to sync (empty: everything).
        exclude: glob patterns of relative paths to leave out.
        delete: delete destination files the source lacks; an empty source is refused, and so
            are more deletions than max_delete allows.
        max_delete: the most files delete may remove: "N" files or "P%" of the destination's;
            empty for the default (at most half of a non-empty destination, never all of it).
        dry_run: list what would change and change nothing.

    Returns:
        dataset: the synced data, its URI on the local side; metadata: source, destination,
            files, bytes, digest, transferred, skipped, deleted, refused, seconds, dry_run.
        Output: the digest of the source listing (keys, sizes, ETags): a caching key.
    """
    # KFP runs this function's body alone, in the image: its imports are inside it.
    from components.s3_sync import sync

    report = sync(
        source,
        destination,
        endpoint_url=endpoint_url or None,
        include=list(include or []),
        exclude=list(exclude or []),
        delete=bool(delete),
        max_delete=max_delete or None,
        dry_run=bool(dry_run),
        progress=False,
    )
    for rel in report.would_transfer:
        print(f"s3-sync: would transfer {rel}")
    for rel in report.would_delete:
        print(f"s3-sync: would delete {rel}")
    dataset.metadata.update(
        {
            "source": source,
            "destination": destination,
            "files": report.files,
            "bytes": report.bytes_total,
            "digest": report.digest,
            "transferred": report.transferred,
            "skipped": report.skipped,
            "deleted": report.deleted,
            "refused": len(report.refused),
            "seconds": round(report.seconds, 3),
            "dry_run": report.dry_run,
        }
    )
    print(f"s3-sync: {report.summary()}")
    return report.digest


def make_s3_sync_op(image: str = DEFAULT_IMAGE):
    """The S3 sync component, running on ``image``."""
    return make_component(s3_sync_component, image=image)


def use_s3_credentials(task: dsl.PipelineTask, secret_name: str) -> dsl.PipelineTask:
    """Give ``task`` the Secret's AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY as env vars."""
    from kfp import kubernetes

    if not secret_name:
        raise ValueError("secret_name='' : name the Kubernetes Secret that holds the S3 keys")
    return kubernetes.use_secret_as_env(
        task, secret_name=secret_name, secret_key_to_env={k: k for k in SECRET_KEYS}
    )
