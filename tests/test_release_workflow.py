"""The release workflow (.github/workflows/release.yml): actionlint-clean, and it releases the
image the Makefile and the CLI name (ghcr.io/<owner>/kfp-ddp:<pyproject version>[-cpu]) and
compiles the pipelines and component files for exactly that tag, with the CLI's own options."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
import yaml

from components import DEFAULT_IMAGE
from components.launcher import SpecError, TrainSpec
from pipelines.cli import main
from pipelines.plan import STORAGE_MODES

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
ACTIONLINT = Path(sys.executable).with_name("actionlint")
OWNER = "kfp-ddp"
"""The GitHub organization whose release the Makefile's RELEASE_IMAGE names."""


def workflow() -> dict:
    # YAML 1.1 reads the key `on` as True; GitHub reads it as "on".
    return yaml.safe_load(WORKFLOW.read_text())


def pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def makefile_release_image() -> str:
    """The Makefile's RELEASE_IMAGE with $(VERSION) filled in."""
    makefile = (ROOT / "Makefile").read_text()
    (image,) = re.findall(r"^RELEASE_IMAGE\s*:?=\s*(\S+)\s*$", makefile, re.MULTILINE)
    return image.replace("$(VERSION)", pyproject_version())


def actionlint(path: Path) -> subprocess.CompletedProcess:
    assert ACTIONLINT.exists(), f"{ACTIONLINT} missing: pip install -c constraints.txt -e '.[dev]'"
    return subprocess.run(
        [str(ACTIONLINT), "-no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_actionlint_passes() -> None:
    result = actionlint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("steps.build.outputs.digest", "steps.bulid.outputs.digest", 'property "bulid"'),
        ("needs: [version, image]", "needs: [version, images]", 'job "images"'),
        ("runs-on: ubuntu-24.04", "runs_on: ubuntu-24.04", "runs_on"),
    ],
)
def test_actionlint_refuses_a_broken_copy(
    tmp_path: Path, old: str, new: str, complaint: str
) -> None:
    """The lint above means something: the same linter fails on a one-word mistake."""
    text = WORKFLOW.read_text()
    assert old in text
    broken = tmp_path / "release.yml"
    broken.write_text(text.replace(old, new, 1))
    result = actionlint(broken)
    assert result.returncode != 0, result.stdout
    assert complaint in result.stdout


def run_version_step(tmp_path: Path, tag: str, owner: str) -> tuple[int, str, dict[str, str]]:
    """Run the `version` job's script as the runner would: (exit code, log, its outputs)."""
    (step,) = [s for s in workflow()["jobs"]["version"]["steps"] if s.get("id") == "version"]
    outputs = tmp_path / "outputs"
    outputs.write_text("")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")},
        **workflow()["env"],
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_REF_NAME": tag,
        "GITHUB_REPOSITORY_OWNER": owner,
        "GITHUB_OUTPUT": str(outputs),
    }
    proc = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    values = dict(line.split("=", 1) for line in outputs.read_text().splitlines() if line)
    return proc.returncode, proc.stdout + proc.stderr, values


def expand(text: str, values: dict[str, str]) -> str:
    """``${{ name }}`` → its value; any expression not in ``values`` fails the test."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        assert name in values, f"unexpected expression ${{{{ {name} }}}} in {text!r}"
        return values[name]

    return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", value, text)


def released(tmp_path: Path) -> dict[str, str]:
    code, log, outputs = run_version_step(tmp_path, f"v{pyproject_version()}", owner=OWNER)
    assert code == 0, log
    return {f"needs.version.outputs.{k}": v for k, v in outputs.items()}


def test_the_tag_must_be_pyprojects_version(tmp_path: Path) -> None:
    code, log, outputs = run_version_step(tmp_path, "v99.0.0", owner=OWNER)
    assert code == 1
    assert f"pyproject.toml's version is {pyproject_version()}" in log
    assert outputs == {}
    # GHCR names are lowercase whatever the owner's spelling.
    code, log, outputs = run_version_step(tmp_path, f"v{pyproject_version()}", owner="KFP-DDP")
    assert code == 0, log
    assert outputs == {"version": pyproject_version(), "repository": "ghcr.io/kfp-ddp/kfp-ddp"}


def test_the_images_are_the_makefiles_release_image_and_its_cpu_variant(tmp_path: Path) -> None:
    values = released(tmp_path)
    assert makefile_release_image() == DEFAULT_IMAGE
    job = workflow()["jobs"]["image"]
    (build,) = [s for s in job["steps"] if s.get("id") == "build"]
    assert build["uses"].startswith("docker/build-push-action@")
    assert build["with"]["push"] is True
    assert build["with"]["sbom"] is True
    assert build["with"]["provenance"] == "mode=max"
    tags = {}
    for variant in job["strategy"]["matrix"]["include"]:
        matrix = {f"matrix.{k}": v for k, v in variant.items() if isinstance(v, str)}
        build_args = expand(build["with"]["build-args"], values | matrix | {"github.sha": "SHA"})
        args = dict(line.split("=", 1) for line in build_args.split() if line)
        tags[variant["variant"]] = expand(build["with"]["tags"], values | matrix)
        assert args["VARIANT"] == variant["variant"]
        assert args["VERSION"] == pyproject_version()
        if variant["variant"] == "cpu":
            assert args["BASE_IMAGE"] == "debian:bookworm-slim"
        else:
            assert "BASE_IMAGE" not in args  # the Dockerfile's default: the CUDA base
    assert tags == {"cuda": DEFAULT_IMAGE, "cpu": f"{DEFAULT_IMAGE}-cpu"}
    signs = [s for s in job["steps"] if "cosign sign" in s.get("run", "")]
    for sign, built in zip(signs, ("build", "build-mpi", "build-ray"), strict=True):  # each digest
        assert sign["run"].strip() == 'cosign sign --yes "${REPOSITORY}@${DIGEST}"'
        assert sign["env"]["DIGEST"] == f"${{{{ steps.{built}.outputs.digest }}}}"
        assert expand(sign["env"]["REPOSITORY"], values) == DEFAULT_IMAGE.rsplit(":", 1)[0]


def test_each_image_has_its_mpi_variant_the_mpi_runtime_names(tmp_path: Path) -> None:
    """image/mpi/ on top of the digest just pushed, tagged -mpi: the image our MPI runtime
    (manifests/kfp-ddp-mpi-runtime.yaml) names for this version."""
    values = released(tmp_path)
    job = workflow()["jobs"]["image"]
    (mpi,) = [s for s in job["steps"] if s.get("id") == "build-mpi"]
    assert mpi["with"]["context"] == "image/mpi" and mpi["with"]["push"] is True
    digest = {"steps.build.outputs.digest": "sha256:PUSHED"}
    base = expand(mpi["with"]["build-args"], values | digest).strip()
    assert base == f"BASE_IMAGE={DEFAULT_IMAGE.rsplit(':', 1)[0]}@sha256:PUSHED"
    tags = set()
    for variant in job["strategy"]["matrix"]["include"]:
        matrix = {f"matrix.{k}": v for k, v in variant.items() if isinstance(v, str)}
        tags.add(expand(mpi["with"]["tags"], values | matrix))
    assert tags == {f"{DEFAULT_IMAGE}-mpi", f"{DEFAULT_IMAGE}-cpu-mpi"}
    runtime = yaml.safe_load((ROOT / "manifests" / "kfp-ddp-mpi-runtime.yaml").read_text())
    images = {
        container["image"]
        for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        for container in job["template"]["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"{DEFAULT_IMAGE}-mpi"}


def test_each_image_has_its_ray_variant_the_rayjob_refusal_names(tmp_path: Path) -> None:
    """The same Dockerfile with EXTRAS=ray (its dependency layer from the first build's cache),
    the same build arguments otherwise, tagged -ray: the image a RayJob's refusal of the default
    image names (components/launcher/spec_rules.py)."""
    values = released(tmp_path)
    job = workflow()["jobs"]["image"]
    steps = {s.get("id"): s for s in job["steps"]}
    build, ray = steps["build"], steps["build-ray"]
    assert ray["uses"] == build["uses"] and ray["with"]["context"] == build["with"]["context"]
    assert ray["with"]["push"] is True and ray["with"]["sbom"] is True
    assert ray["with"]["provenance"] == "mode=max"
    tags = set()
    for variant in job["strategy"]["matrix"]["include"]:
        matrix = {f"matrix.{k}": v for k, v in variant.items() if isinstance(v, str)}
        context = values | matrix | {"github.sha": "SHA"}
        plain = expand(build["with"]["build-args"], context).split()
        assert sorted(expand(ray["with"]["build-args"], context).split()) == sorted(
            [*plain, "EXTRAS=ray"]
        )
        tags.add(expand(ray["with"]["tags"], values | matrix))
    assert tags == {f"{DEFAULT_IMAGE}-ray", f"{DEFAULT_IMAGE}-cpu-ray"}
    with pytest.raises(SpecError, match=re.escape(f"{DEFAULT_IMAGE}-ray")):
        TrainSpec(name="j", api="rayjob")


def test_the_release_compiles_for_exactly_the_released_image(tmp_path: Path) -> None:
    """Every kfp-ddp command of the release job parses with the CLI's own options, for the
    released tag; both storage modes and the component files are compiled and attached."""
    values = released(tmp_path)
    job = workflow()["jobs"]["release"]
    image = expand(job["env"]["IMAGE"], values)
    assert image == DEFAULT_IMAGE
    commands = [
        shlex.split(line.replace('"${IMAGE}"', image))
        for step in job["steps"]
        for line in step.get("run", "").splitlines()
        if line.strip().startswith("kfp-ddp ")
    ]
    storages, outputs = set(), set()
    parent = click.Context(main, info_name="kfp-ddp")
    for argv in commands:
        name = argv[1]
        sub = main.get_command(parent, name).make_context(name, argv[2:], parent=parent)
        assert sub.params["image"] == DEFAULT_IMAGE, argv
        outputs.add(str(sub.params["output"]))
        if name == "compile":
            storages.add(sub.params["storage"])
        else:
            assert name == "compile-components", argv
    assert storages == set(STORAGE_MODES)
    assert outputs == {
        "dist/training_pipeline.yaml",
        "dist/training_pipeline_shared_volume.yaml",
        "dist/components",
    }
    (publish,) = [s for s in job["steps"] if "gh release create" in s.get("run", "")]
    for attached in ("dist/training_pipeline.yaml", "dist/training_pipeline_shared_volume.yaml"):
        assert attached in publish["run"]
    assert "dist/components/*.yaml" in publish["run"]


def test_least_privilege_and_pinned_actions() -> None:
    data = workflow()
    assert data[True] == {"push": {"tags": ["v*"]}}  # `on:`
    assert data["permissions"] == {}
    permissions = {name: job["permissions"] for name, job in data["jobs"].items()}
    assert permissions == {
        "version": {"contents": "read"},
        "image": {"contents": "read", "packages": "write", "id-token": "write"},
        "release": {"contents": "write"},
    }
    for job in data["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@(v\d+(\.\d+)*|[0-9a-f]{40})", step["uses"])
