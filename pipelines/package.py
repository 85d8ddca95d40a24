"""Compiled pipeline packages: compile one, read one, its declared parameters, caching off.

A package is the YAML ``kfp-ddp compile`` writes (and the Kubeflow UI uploads): the PipelineSpec,
then the kfp-kubernetes platform spec. Submitting commands either compile the pipeline now for
``--image`` or send a given ``--package``; ``submitted_images`` names the images a run of it pulls
(``pipelines.image_check`` asks their registries whether they exist).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from components import DEFAULT_IMAGE
from kfp_ddp.atomic_files import write_atomic, write_text_atomic

COMPILED = Path(__file__).resolve().parent / "compiled"
PACKAGES = {
    "object-store": COMPILED / "training_pipeline.yaml",
    "shared-volume": COMPILED / "training_pipeline_shared_volume.yaml",
}
"""The committed compiled pipelines, one per storage mode (kept in sync by a golden test)."""
DEFAULT_PACKAGE = PACKAGES["object-store"]
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (its wheels are): the same documents as
the pure-Python ``SafeLoader``, ~11x faster on a compiled pipeline (0.016 s against 0.18 s)."""
LIST_DATA_COMPONENT = "comp-list-dataset-step"
"""Only the object-store pipeline has it (its data step lists, the other one syncs)."""


def load_package(path: Path) -> tuple[dict, dict]:
    """Read a compiled pipeline YAML: (PipelineSpec dict, platform spec dict or {})."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise click.ClickException(
            f"--package {path}: no such file; compile one with `kfp-ddp compile --output {path}`"
        ) from None
    except OSError as exc:
        raise click.ClickException(f"--package {path}: cannot read it ({exc})") from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=YAML_LOADER) if d is not None]
    except yaml.YAMLError as exc:
        raise click.ClickException(f"--package {path}: not valid YAML ({exc})") from None
    if not docs or not isinstance(docs[0], dict) or "root" not in docs[0]:
        raise click.ClickException(
            f"--package {path}: not a compiled KFP v2 pipeline (no 'root' in the first document)"
        )
    platform: dict = {}
    for doc in docs[1:]:
        platform.update(doc)
    return docs[0], platform


def declared_inputs(pipeline_spec: dict) -> dict[str, dict]:
    """The pipeline's declared parameters: name → {parameterType, defaultValue?, ...}."""
    return pipeline_spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {}) or {}


def default_arguments(inputs: dict[str, dict]) -> dict[str, Any]:
    """The declared defaults, typed (protobuf hands integers back as floats)."""
    arguments = {}
    for name, spec in inputs.items():
        if "defaultValue" not in spec:
            continue
        value = spec["defaultValue"]
        if spec.get("parameterType") == "NUMBER_INTEGER" and isinstance(value, float):
            value = int(value)
        arguments[name] = value
    return arguments


def disable_caching(pipeline_spec: dict) -> int:
    """Turn caching off for every task of every DAG (root and nested); returns the task count.

    ``kfp.Client(enable_caching=False)`` only rewrites the root DAG's tasks, so tasks inside an
    ExitHandler or a condition would still hit the cache; this walks all of them.
    """
    dags = [pipeline_spec.get("root", {}).get("dag", {})]
    dags += [c.get("dag", {}) for c in pipeline_spec.get("components", {}).values()]
    count = 0
    for dag in dags:
        for task in (dag.get("tasks") or {}).values():
            task.setdefault("cachingOptions", {})["enableCache"] = False
            count += 1
    return count


def write_yaml_atomically(docs: Sequence[dict], path: Path) -> None:
    """Write YAML documents to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    write_text_atomic(path, yaml.safe_dump_all(docs, sort_keys=True))


def package_storage(pipeline_spec: dict) -> str:
    """The storage mode a compiled pipeline was compiled for."""
    components = pipeline_spec.get("components", {})
    return "object-store" if LIST_DATA_COMPONENT in components else "shared-volume"


def compile_pipeline(
    output: Path,
    *,
    image: str = DEFAULT_IMAGE,
    storage: str = "object-store",
    cluster_settings: dict | None = None,
) -> Path:
    """Compile the training pipeline for ``image``, ``storage`` and the admin's
    ``cluster_settings`` to ``output`` (atomically, readable by all)."""
    from kfp import compiler

    # Here, not at the top: building the pipeline imports every component and the cluster
    # clients (~4 s), which the CLI's other commands (and its --help) do not need.
    from pipelines.training import build_training_pipeline

    try:
        pipeline = build_training_pipeline(
            image=image, storage=storage, cluster_settings=cluster_settings
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    output = Path(output)
    with tempfile.TemporaryDirectory(prefix="kfp-ddp-compile-") as tmp:
        compiled = Path(tmp) / "pipeline.yaml"
        compiler.Compiler().compile(pipeline_func=pipeline, package_path=str(compiled))
        data = compiled.read_bytes()
    write_atomic(output, lambda handle: handle.write(data))
    return output


def package_images(pipeline_spec: dict) -> set[str]:
    """The container images of every step of a compiled pipeline."""
    executors = pipeline_spec.get("deploymentSpec", {}).get("executors", {})
    return {e.get("container", {}).get("image", "") for e in executors.values()} - {""}


def submitted_images(pipeline_spec: dict, arguments: dict[str, Any] | None = None) -> set[str]:
    """Every image a run of the pipeline pulls: its steps' and the training nodes' (the
    ``image`` parameter's argument, else its declared default)."""
    images = package_images(pipeline_spec)
    node_image = (arguments or {}).get("image")
    if node_image is None:
        node_image = declared_inputs(pipeline_spec).get("image", {}).get("defaultValue")
    if isinstance(node_image, str) and node_image:
        images.add(node_image)
    return images


@contextlib.contextmanager
def package_for_submit(
    package: Path | None,
    image: str,
    *,
    storage: str = "object-store",
    no_cache: bool = False,
) -> Iterator[tuple[Path, dict]]:
    """Yield (path of the package to send, its PipelineSpec dict).

    Without ``--package`` the pipeline is compiled now for ``--image`` and ``storage``; with
    ``no_cache`` a copy with caching disabled on every task is written and sent instead.
    """
    with tempfile.TemporaryDirectory(prefix="kfp-ddp-") as tmp:
        if package is None:
            package = compile_pipeline(Path(tmp) / "pipeline.yaml", image=image, storage=storage)
        spec, platform = load_package(package)
        if no_cache:
            disable_caching(spec)
            package = Path(tmp) / "pipeline-no-cache.yaml"
            write_yaml_atomically([spec, platform] if platform else [spec], package)
        yield package, spec
