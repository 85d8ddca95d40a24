"""The pipeline's own steps (lightweight KFP components; each body is self-contained).

- ``check_arguments_step`` (written by ``check_step_source`` into ``generated_check_step.py``):
  the run's first step, cheap: every argument checked before anything
  else runs (``pipelines.validation``), so a bad value from the Kubeflow UI fails in seconds.
- ``stage_dataset_step``: sync the ImageFolder from S3 into the workspace and freeze what was
  synced. The sync target is keyed by the source (``data/<source key>/mirror``), so runs of other
  data never share — or ``--delete`` — each other's files; after the sync the mirror is checked
  for a ``train/`` and a ``val/`` split and frozen as ``data/<source key>/<digest>/`` (hard links:
  no copy of the bytes; a later sync replaces files by renaming, so a frozen snapshot never
  changes). Training and evaluation read the snapshot of their own digest.
- ``list_dataset_step`` (object-store storage): the same layout check and digest from a listing
  of the data set, nothing downloaded; every training node stages the data itself.
- ``publish_model_step``: upload the model that passed the gate, with its evaluation.
"""

# No `from __future__ import annotations`: KFP reads the artifact types from real annotations.

import dataclasses
from typing import NamedTuple, Optional

from kfp.dsl import HTML, Artifact, Dataset, Input, Model, Output

from components.kfp.function import REQUIRED, function_source, literal, module_source
from pipelines.late_checks import check_baseline, check_model_input
from pipelines.parameter_errors import ArgumentError, ParameterError
from pipelines.parameters import COMPILE_TIME, PARAMETERS, function_inputs
from pipelines.plan import checkpoint_base
from pipelines.run_start import resolve_run_start
from pipelines.validation import check_arguments

CHECK_OUTPUTS = ("checkpoint_uri", "init_from", "baseline_uri", "latest_run")
"""The check step's outputs (``run_argument_check``'s, in order)."""


def run_argument_check(arguments: dict) -> tuple[str, str, str, str]:
    """The check step's work: fail with one line per problem (parameter, value, fix).

    Returns ``CHECK_OUTPUTS``: where the training keeps its checkpoints (and, with object-store
    storage, its model): checkpoint_uri, or its default; then what the run starts from
    (``pipelines.run_start``): init_from checked and pinned, baseline_uri, and the run the
    latest.json pointer names ('' for none).
    """

    try:
        check_arguments(arguments)
        check_model_input(arguments)
        start = resolve_run_start(arguments)
        # in S3 (this step's credentials), as the evaluation reads it
        check_baseline({**arguments, "baseline_uri": start.baseline_uri})
    except ArgumentError as exc:
        for problem in exc.problems:
            print(f"bad argument: {problem}", flush=True)
        raise SystemExit(
            f"{len(exc.problems)} bad pipeline argument(s): {exc.problems[0]}"
        ) from None
    for note in start.notes:
        print(f"start: {note}", flush=True)
    if start.init_from:
        print(f"start: the training starts from {start.init_from}", flush=True)
    print("all pipeline arguments are valid")
    return checkpoint_base(arguments), start.init_from, start.baseline_uri, start.latest_run


def check_run_size(images: dict[str, dict[str, int]], **size: int) -> None:
    """The data step's check of the run's size against the training images it counted
    (``pipelines.run_size``): a warning line each, or the step fails naming ``batch_size``."""
    from pipelines.run_size import RunSize  # trainer.data (torch) for the data steps only

    run = RunSize.of(sum(images.get("train", {}).values()), **size)
    if run is None:
        return
    for warning in run.warnings():
        print(f"data: warning: {warning}", flush=True)
    try:
        run.check()
    except ParameterError as exc:
        print(f"bad argument: {exc}", flush=True)
        raise SystemExit(f"bad pipeline argument: {exc}") from None


CHECK_IMPORTS = ("from typing import NamedTuple",)
"""What the check step's return annotation needs."""


def check_step_source() -> str:
    """The module of ``check_arguments_step``: a KFP function whose parameters are the
    pipeline's (declared once, in ``pipelines.parameters``) plus the compile-time choices; it
    calls ``run_argument_check`` with all of them (``generated_check_step.py``)."""

    inputs = [
        dataclasses.replace(i, default=REQUIRED, doc="")
        for i in function_inputs(PARAMETERS, image="")
    ] + list(COMPILE_TIME)
    given = "".join(f"        {literal(i.name)}: {i.name},\n" for i in inputs)
    function = function_source(
        "check_arguments_step",
        inputs,
        doc=(
            "Check every pipeline argument; fail with one line per problem (parameter, value, "
            "fix).\n\nIts parameters are the pipeline's (pipelines.parameters) plus the "
            "compile-time backend,\nworkspace_path, storage and cluster_settings. Returns where "
            "the training keeps its\ncheckpoints (and, with object-store storage, its model): "
            "checkpoint_uri, or its default;\ninit_from checked and pinned, baseline_uri "
            "resolved (latest: publish_uri/latest.json),\nand latest_run, the run the pointer "
            "names now."
        ),
        body=f"""
from collections import namedtuple

# KFP runs this function alone, in the image: what it calls is imported here.
from pipelines.steps import CHECK_OUTPUTS, run_argument_check

checked = run_argument_check(
    {{
{given}    }}
)
return namedtuple("Outputs", CHECK_OUTPUTS)(*checked)
""",
        returns=(
            'NamedTuple("Outputs", [("checkpoint_uri", str), ("init_from", str), '
            '("baseline_uri", str), ("latest_run", str)])'
        ),
    )
    summary = (
        "The pipeline's first step, its parameters the pipeline's "
        "(``pipelines.steps.check_step_source``)."
    )
    return module_source(summary, CHECK_IMPORTS, function)


def stage_dataset_step(
    data_uri: str,
    endpoint_url: str,
    workspace_path: str,
    dataset: Output[Dataset],
    workers: int = 0,
    gpus_per_worker: int = 0,
    nproc_per_node: int = 0,
    batch_size: int = 0,
    epochs: int = 0,
    image_size: int = 0,
) -> NamedTuple("Outputs", [("data_dir", str), ("digest", str)]):  # type: ignore[valid-type]  # KFP's form
    """Sync data_uri into the workspace, check its train/ and val/ splits, freeze it by digest.

    The mirror is data/<source key>/mirror under workspace_path (one folder per source, so runs
    of other data never share or delete each other's files); the synced data is frozen as
    data/<source key>/<digest>/ with hard links, which a later sync never changes.

    Args:
        data_uri: s3://bucket/prefix of an ImageFolder with train/<class>/* and val/<class>/*.
        endpoint_url: URL of an S3-compatible endpoint; empty for the standard AWS environment.
        workspace_path: the shared volume's path in this step (and in the training nodes).
        workers: the run's training nodes; with batch_size, a batch that a rank's share of
            the training images cannot fill is refused here (0: not checked).
        gpus_per_worker: GPUs per node (the processes per node when nproc_per_node is 0).
        nproc_per_node: processes per node; 0: one per GPU.
        batch_size: images per step per process; 0: not checked.
        epochs: passes over the data: a run of over a year at the fastest measured rate is
            warned of.
        image_size: the training image size (the rate estimate scales with it).

    Returns:
        dataset: the synced data; metadata: the sync's counts, the digest and the frozen folder.
        data_dir: the frozen folder, the data dir of training and evaluation.
        digest: the digest of the source listing (keys, sizes, ETags): the training step's
            caching key.
    """
    # KFP runs this function's body alone, in the image: its imports are inside it.
    from collections import namedtuple

    from pipelines.dataset import stage_dataset
    from pipelines.steps import check_run_size

    staged = stage_dataset(data_uri, workspace_path, endpoint_url=endpoint_url or None)
    dataset.metadata.update(staged.metadata())
    print(f"data: {staged.summary()}")
    for line in staged.report_lines():
        print(f"data: {line}")
    check_run_size(
        staged.images,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        nproc_per_node=nproc_per_node,
        batch_size=batch_size,
        epochs=epochs,
        image_size=image_size,
    )
    Outputs = namedtuple("Outputs", ["data_dir", "digest"])
    return Outputs(str(staged.snapshot), staged.digest)


def list_dataset_step(
    data_uri: str,
    endpoint_url: str,
    dataset: Output[Dataset],
    workers: int = 0,
    gpus_per_worker: int = 0,
    nproc_per_node: int = 0,
    batch_size: int = 0,
    epochs: int = 0,
    image_size: int = 0,
) -> NamedTuple("Outputs", [("digest", str), ("size_bytes", int)]):  # type: ignore[valid-type]  # KFP's form
    """List data_uri in S3 and check its train/ and val/ splits; nothing is downloaded.

    Every training node stages the data itself (object-store storage); the digest is the
    training step's caching key and what every node must find when it stages; the size bounds
    each node's staging volume.

    Args:
        data_uri: s3://bucket/prefix of the ImageFolder (train/ and val/ class folders).
        endpoint_url: S3 endpoint (MinIO, Ceph...); empty for AWS or AWS_ENDPOINT_URL_S3.
        workers: the run's training nodes; with batch_size, a batch that a rank's share of
            the training images cannot fill is refused here (0: not checked).
        gpus_per_worker: GPUs per node (the processes per node when nproc_per_node is 0).
        nproc_per_node: processes per node; 0: one per GPU.
        batch_size: images per step per process; 0: not checked.
        epochs: passes over the data: a run of over a year at the fastest measured rate is
            warned of.
        image_size: the training image size (the rate estimate scales with it).

    Returns:
        dataset: metadata only: the source, files, bytes, classes and the digest.
        digest: the digest of the listing (keys, sizes, ETags).
        size_bytes: the data set's size: every node's staging volume is sized from it.
    """
    # KFP runs this function's body alone, in the image: its imports are inside it.
    from collections import namedtuple

    from pipelines.dataset import inspect_dataset
    from pipelines.steps import check_run_size

    listed = inspect_dataset(data_uri, endpoint_url=endpoint_url or None)
    dataset.metadata.update(listed.metadata())
    print(f"data: {listed.summary()}")
    for line in listed.report_lines():
        print(f"data: {line}")
    check_run_size(
        listed.images,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        nproc_per_node=nproc_per_node,
        batch_size=batch_size,
        epochs=epochs,
        image_size=image_size,
    )
    Outputs = namedtuple("Outputs", ["digest", "size_bytes"])
    return Outputs(listed.digest, listed.bytes_total)


def publish_model_step(
    model: Input[Model],
    report: Input[HTML],
    publish_uri: str,
    endpoint_url: str,
    run_id: str,
    latest_run: str = "*",
    data_digest: str = "",
    evaluation: Optional[Input[Artifact]] = None,  # noqa: UP045 (KFP reads Optional, not | None)
) -> str:
    """Publish the model that passed the gate to publish_uri/<run id>/; returns that URI.

    Uploaded: the model's files (weights.pt, model.json, metrics.jsonl, summary.json), the
    evaluation as eval.json and its page as report.html. Every run publishes to its own prefix,
    so nothing published earlier is ever overwritten. Then publish_uri/latest.json is pointed at
    it, if it still names latest_run (pipelines.latest_model): a model is never made the latest
    without having been gated against the one it replaces.

    Args:
        model: the model to publish (the training step's model output).
        report: the evaluation's report of that model (its metadata holds the evaluation).
        publish_uri: s3://bucket/prefix; the model goes to publish_uri/<run id>/.
        endpoint_url: S3 endpoint (MinIO, Ceph...); empty for AWS or AWS_ENDPOINT_URL_S3.
        run_id: the KFP run id (dsl.PIPELINE_JOB_ID_PLACEHOLDER).
        latest_run: the run latest.json named when this run started ('' for none); *: move
            the pointer whatever it names (a model not compared with the latest one).
        data_digest: the digest of the data the model was trained on (kept in latest.json).
        evaluation: the evaluation step's evaluation output (eval.json); without it, eval.json
            is the report's "eval" metadata (an evaluation of one's own, or of an older image).

    Returns:
        Output: the destination, publish_uri/<run id>/.
    """
    # KFP runs this function's body alone, in the image: its imports are inside it.
    from pipelines.publish import publish_model, read_evaluation

    return publish_model(
        model.path,
        report.path,
        evaluation=read_evaluation(evaluation.path if evaluation else None, report.metadata),
        publish_uri=publish_uri,
        run_id=run_id,
        endpoint_url=endpoint_url or None,
        latest_run=latest_run,
        data_digest=data_digest,
    )
