"""The image runs the torch the tests ran, and can compile (Triton needs a C compiler)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _default_base_image() -> str:
    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert match, "Dockerfile: no `ARG BASE_IMAGE=<image>` default"
    return match.group(1)


def test_the_base_images_torch_is_the_pinned_torch():
    image = _default_base_image()
    match = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn\d+-runtime", image)
    assert match, f"BASE_IMAGE {image}: expected pytorch/pytorch:<torch>-cuda<x.y>-cudnn<n>-runtime"
    pins = re.findall(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), re.M)
    assert len(pins) == 1, "constraints.txt: expected exactly one torch== pin"
    assert match.group(1) == pins[0], (
        f"Dockerfile BASE_IMAGE has torch {match.group(1)}, constraints.txt pins torch=={pins[0]}: "
        "move both together"
    )


def test_the_image_has_a_c_compiler_for_triton_and_keeps_the_shared_package():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"apt-get install[^\n]*\bgcc\b", text)
    assert "COPY kfp_ddp ./kfp_ddp" in text


def test_the_image_runs_as_the_non_root_user_the_launcher_asks_for():
    """Restricted Pod Security: the pods run as TrainSpec.run_as_user/run_as_group, which the
    image must provide (numeric, so the kubelet checks runAsNonRoot without /etc/passwd), with a
    writable HOME for the caches and KFP's artifact folders for the steps."""
    from components.launcher import TrainSpec

    text = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users, "Dockerfile: no USER: the image would run as root"
    spec = TrainSpec(name="j")
    assert users[-1] == f"{spec.run_as_user}:{spec.run_as_group}"
    assert re.search(rf"^ARG APP_UID={spec.run_as_user}$", text, re.M)
    assert re.search(rf"^ARG APP_GID={spec.run_as_group}$", text, re.M)
    assert 'useradd --uid "${APP_UID}"' in text
    assert "--create-home --home-dir /home/kfp-ddp" in text
    assert re.search(r"HOME=/home/kfp-ddp", text) and "XDG_CACHE_HOME=/home/kfp-ddp/.cache" in text
    for folder in ("/gcs", "/minio", "/s3"):  # where KFP's launcher writes the artifacts
        assert re.search(rf"mkdir -p[^\n]*{folder}", text), folder
    # Nothing runs as root after the switch.
    assert text.index(f"USER {users[-1]}") > text.rindex("RUN ")


def test_the_ray_extra_is_only_in_the_image_that_asks_for_it():
    """``--build-arg EXTRAS=ray`` adds pyproject's ``ray`` extra (a RayJob's image); the default
    image's dependency list is the project's own, without Ray; an unknown extra is refused."""
    import subprocess
    import sys

    def listed(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(REPO / "image" / "dependencies.py"), "pyproject.toml", *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )

    plain = listed().stdout.splitlines()
    with_ray = listed("--extras", "ray").stdout.splitlines()
    assert not [x for x in plain if x.startswith("ray")]
    assert with_ray[: len(plain)] == plain
    assert [x for x in with_ray if x.startswith("ray[")] == ["ray[default,train]>=2.50"]
    unknown = listed("--extras", "spark")
    assert unknown.returncode != 0 and "EXTRAS='spark'" in unknown.stderr
    assert 'ARG EXTRAS=""' in (REPO / "Dockerfile").read_text()


def test_the_extras_have_a_layer_of_their_own_between_the_dependencies_and_the_sources():
    """An image with an extra (EXTRAS=ray: the -ray variant) reuses the plain image's dependency
    layer from the build cache: the final stage lists the extras' dependencies apart
    (``--only-extras``), installs them after the project's, skips pip without extras, and reads
    EXTRAS after its last RUN only (an ARG joins the cache key of every later RUN)."""
    import subprocess
    import sys

    def only(extras: str) -> list[str]:
        return subprocess.run(
            [sys.executable, "image/dependencies.py", "pyproject.toml", "--only-extras", extras],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.splitlines()

    assert only("ray") == ["ray[default,train]>=2.50"]
    assert only("") == []
    text = (REPO / "Dockerfile").read_text()
    final = text[text.rindex("\nFROM ") :]
    dependencies = final.index("-r /tmp/deps/requirements.txt")
    extras = final.index("-r /tmp/deps/requirements-extras.txt")
    assert dependencies < extras < final.index("COPY kfp_ddp ./kfp_ddp")
    assert "if [ -s /tmp/deps/requirements-extras.txt ]" in final  # no pip without extras
    assert final.index("ARG EXTRAS") > final.rindex("RUN ")
    assert '--only-extras "${EXTRAS}" > /src/requirements-extras.txt' in text
