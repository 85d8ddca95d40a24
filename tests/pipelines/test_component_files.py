"""The component files: in sync with the code, loadable by anyone's pipeline, described, pinned to
an image and a version that match the package's."""

# No `from __future__ import annotations`: KFP reads the test pipelines' real annotations.

import functools
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import json_format
from kfp import compiler, components, dsl
from kfp.pipeline_spec import pipeline_spec_pb2

import components as our_components
from components import DEFAULT_IMAGE
from components.kfp import s3_sync as s3_sync_module
from components.kfp.factory import make_component
from kfp_ddp import __version__
from pipelines.cli import main
from pipelines.component_files import (
    COMPILED_DIR,
    COMPONENT_FILES,
    ComponentFile,
    compile_component,
    compile_components,
    version_line,
)
from tests import yaml_fast

REPO = Path(__file__).resolve().parents[2]
FILE_NAMES = [entry.file_name for entry in COMPONENT_FILES]
ARTIFACT_CLASSES = {
    "system.Model": dsl.Model,
    "system.HTML": dsl.HTML,
    "system.Dataset": dsl.Dataset,
    "system.Metrics": dsl.Metrics,
}
PARAMETER_VALUES = {"String": "x", "Integer": 1, "Float": 0.5, "Boolean": False, "List": []}


def strip_sdk_version(text: str) -> str:
    return re.sub(r"^sdkVersion: .*$", "sdkVersion: <stripped>", text, flags=re.MULTILINE)


def stale_files(committed: Path, fresh: Path) -> list[str]:
    """The component files that differ between two folders (or exist in only one)."""
    names = {p.name for p in committed.glob("*.yaml")} | {p.name for p in fresh.glob("*.yaml")}
    return sorted(
        name
        for name in names
        if not (committed / name).is_file()
        or not (fresh / name).is_file()
        or strip_sdk_version((committed / name).read_text())
        != strip_sdk_version((fresh / name).read_text())
    )


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The component files compiled now, for the release image (what is committed)."""
    return Path(
        compile_components(tmp_path_factory.mktemp("components"), image=DEFAULT_IMAGE)[0].parent
    )


def _documents(path: Path) -> tuple[dict, dict]:
    docs = [d for d in yaml_fast.safe_load_all(path.read_text()) if d]
    return docs[0], (docs[1] if len(docs) > 1 else {})


def test_committed_component_files_are_up_to_date(fresh: Path) -> None:
    assert sorted(p.name for p in fresh.glob("*.yaml")) == sorted(FILE_NAMES)
    assert stale_files(COMPILED_DIR, fresh) == [], (
        "components/compiled/ is stale: run `make components` "
        "(kfp-ddp compile-components --output components/compiled) and commit the files"
    )


def _changed_s3_sync(tmp_path: Path):
    """A copy of the S3 sync component function with one more parameter (a changed signature)."""
    source = inspect.getsource(s3_sync_module)
    marker = "    dry_run: bool = False,\n"
    assert marker in source
    changed = source.replace(marker, marker + "    verbose: bool = False,\n", 1)
    path = tmp_path / "changed_s3_sync_component.py"
    path.write_text(changed)
    spec = importlib.util.spec_from_file_location("changed_s3_sync_component", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module.s3_sync_component


def test_the_golden_check_fails_on_a_changed_signature(fresh: Path, tmp_path: Path) -> None:
    """A signature change without regenerating the files is caught, and only that file."""
    changed_dir = tmp_path / "changed"
    shutil.copytree(fresh, changed_dir)
    entry = ComponentFile(
        file_name="s3_sync.yaml",
        factory=functools.partial(make_component, _changed_s3_sync(tmp_path)),
    )
    compile_component(entry.component(DEFAULT_IMAGE), changed_dir / entry.file_name)
    assert stale_files(COMPILED_DIR, changed_dir) == ["s3_sync.yaml"]
    assert "verbose" in (changed_dir / "s3_sync.yaml").read_text()
    # A file missing from the folder is stale too.
    (changed_dir / "evaluate.yaml").unlink()
    assert stale_files(COMPILED_DIR, changed_dir) == ["evaluate.yaml", "s3_sync.yaml"]


def _arguments(component) -> dict:
    """A value for every required input: a constant parameter or an imported artifact."""
    arguments = {}
    for name, spec in component.component_spec.inputs.items():
        if spec.optional:
            continue
        schema = spec.type.split("@")[0]
        if schema in ARTIFACT_CLASSES:
            arguments[name] = dsl.importer(
                artifact_uri=f"s3://bucket/{name}", artifact_class=ARTIFACT_CLASSES[schema]
            ).output
        else:
            arguments[name] = PARAMETER_VALUES[spec.type]
    return arguments


@pytest.mark.parametrize("file_name", FILE_NAMES)
def test_each_file_loads_and_compiles_into_a_pipeline(file_name: str, tmp_path: Path) -> None:
    component = components.load_component_from_file(str(COMPILED_DIR / file_name))

    @dsl.pipeline(name="uses-one-component")
    def uses_it() -> None:
        component(**_arguments(component))

    path = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(uses_it, str(path))
    pipeline_doc, _ = _documents(path)
    spec = json_format.ParseDict(pipeline_doc, pipeline_spec_pb2.PipelineSpec())
    executor = spec.deployment_spec.fields["executors"].struct_value.fields
    ours = [
        e.struct_value.fields["container"].struct_value.fields["image"].string_value
        for name, e in executor.items()
        if not name.startswith("exec-importer")
    ]
    assert ours == [DEFAULT_IMAGE]
    (task,) = [
        t
        for t in pipeline_doc["root"]["dag"]["tasks"].values()
        if "importer" not in t["taskInfo"]["name"]
    ]
    given_inputs = task.get("inputs", {})  # absent when every input is optional
    given = set(given_inputs.get("parameters", {})) | set(given_inputs.get("artifacts", {}))
    assert {n for n, s in component.component_spec.inputs.items() if not s.optional} <= given


@pytest.mark.parametrize("file_name", FILE_NAMES)
def test_every_input_and_output_is_described(file_name: str) -> None:
    pipeline_doc, _ = _documents(COMPILED_DIR / file_name)
    (component,) = pipeline_doc["components"].values()
    described = 0
    for section in ("inputDefinitions", "outputDefinitions"):
        for kind in ("parameters", "artifacts"):
            for name, spec in component.get(section, {}).get(kind, {}).items():
                description = spec.get("description", "")
                assert description, f"{file_name}: {section} {name} has no description"
                for markup in ("``", ":func:", ":class:"):
                    assert markup not in description, (file_name, name, description)
                described += 1
    assert described >= 3


@pytest.mark.parametrize("file_name", FILE_NAMES)
def test_each_file_pins_the_image_and_names_the_version(file_name: str) -> None:
    text = (COMPILED_DIR / file_name).read_text()
    header = text.split("\n# Inputs:")[0]
    assert version_line(DEFAULT_IMAGE) in header
    pipeline_doc, _ = _documents(COMPILED_DIR / file_name)
    images = {e["container"]["image"] for e in pipeline_doc["deploymentSpec"]["executors"].values()}
    assert images == {DEFAULT_IMAGE}


def test_the_release_image_tag_is_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    repository, _, tag = DEFAULT_IMAGE.rpartition(":")
    assert tag == version, (
        f"components.DEFAULT_IMAGE={DEFAULT_IMAGE!r} but pyproject.toml's version is {version!r}: "
        "the image and the component files share the package version"
    )
    assert __version__ == version, (
        f"the installed kfp-ddp is {__version__}, pyproject.toml says {version}: reinstall "
        "(pip install -e .)"
    )
    assert f"{repository}:{__version__}" == our_components.DEFAULT_IMAGE
    if shutil.which("make"):
        env = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "MAKEFLAGS")}
        shown = subprocess.run(
            ["make", "-s", "-n", "image"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"IMAGE={DEFAULT_IMAGE} image/build.sh release" in shown


def test_the_cli_prints_the_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"kfp-ddp, version {__version__}"


def test_compile_components_for_another_image(tmp_path: Path) -> None:
    image = "registry.example/team/kfp-ddp:0.1.0-fix"
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["compile-components", "--image", image, "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(FILE_NAMES)
    for name in FILE_NAMES:
        pipeline_doc, _ = _documents(out / name)
        images = {
            e["container"]["image"] for e in pipeline_doc["deploymentSpec"]["executors"].values()
        }
        assert images == {image}
        assert version_line(image) in (out / name).read_text()
    # The training nodes run the step's image unless the pipeline says otherwise.
    train = components.load_component_from_file(str(out / "training_job.yaml"))
    assert train.component_spec.inputs["image"].default == image
    assert "WARNING" not in result.output


def test_compile_components_refuses_a_bad_image_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["compile-components", "--image", "not an image", "--output", str(out)]
    )
    assert result.exit_code == 2
    assert "--image" in result.output and "'not an image'" in result.output
    assert not out.exists()


def test_compile_components_leaves_other_files_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.yaml").write_text("kept: true\n")
    (out / "s3_sync.yaml").write_text("an older s3_sync.yaml\n")
    result = CliRunner().invoke(main, ["compile-components", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "mine.yaml").read_text() == "kept: true\n"
    assert "PIPELINE DEFINITION" in (out / "s3_sync.yaml").read_text()
    assert "placeholder" in result.output or "release image" in result.output


def test_the_generated_kfp_functions_are_what_their_declarations_write(tmp_path):
    """``components/kfp/generated_training_job.py`` and ``pipelines/generated_check_step.py``
    hold the source KFP embeds, ``trainer/model_names.py`` torchvision's model names: a
    declaration (or torchvision) changed without ``make components`` fails here, and ``--check``
    names the stale file."""
    from pipelines.generate import GENERATED, main, stale

    assert stale() == [], "run `make components`"
    assert main(["--check"]) == 0
    # A copy that says otherwise than its declaration is stale: a parameter named otherwise, a
    # model name that torchvision does not have.
    edits = {"trainer/model_names.py": ('"resnet18"', '"resnet19"')}
    for name, write in GENERATED.items():
        old, new = edits.get(name, ("checkpoint_uri", "checkpoint_url"))
        text = write()
        assert old in text, name
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text.replace(old, new, 1))
    assert set(stale(tmp_path)) == set(GENERATED)
