"""`kfp-ddp upload/run/schedule` ask the image's registry first (a real one on loopback) and
refuse a missing or unverifiable image before anything reaches the KFP API server."""

from __future__ import annotations

import atexit
import base64
import functools
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from components import DEFAULT_IMAGE
from kfp_ddp.free_ports import free_port
from pipelines.cli import main
from pipelines.package import compile_pipeline
from tests.containers.registry import LocalRegistry, write_oci_archive
from tests.pipelines.kfp_api_server import FakeKfpServer

REQUIRED = ["-p", "data_uri=s3://bucket/digits", "-p", "publish_uri=s3://bucket/models"]
COMMANDS = ["upload", "run", "schedule"]


@functools.cache
def package_for(image: str) -> str:
    folder = Path(tempfile.mkdtemp(prefix="kfp-ddp-test-package-"))
    atexit.register(shutil.rmtree, folder, True)  # cached for the session, removed after it
    return str(compile_pipeline(folder / "pipeline.yaml", image=image))


def submit(command: str, server: FakeKfpServer, package: str, *extra: str):
    args = [command, "--host", server.url, "--package", package, *extra]
    if command == "schedule":
        args += ["--cron", "0 2 * * *"]
    args += REQUIRED if command != "upload" else []
    return CliRunner().invoke(main, args, catch_exceptions=True)


def created(server: FakeKfpServer) -> int:
    return len(server.pipelines) + len(server.runs) + len(server.recurring_runs)


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No auth file of the developer's leaks in."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    for name in ("DOCKER_CONFIG", "REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    return folder


@pytest.fixture(scope="module")
def images(
    oci_registry: LocalRegistry,
    oci_registry_with_login: LocalRegistry,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, str]:
    archive = write_oci_archive(tmp_path_factory.mktemp("cli-images") / "image.tar")
    return {
        "present": oci_registry.push_oci_archive(archive, "kfp-ddp:cli"),
        "missing": oci_registry.image("kfp-ddp:not-pushed"),
        "private": oci_registry_with_login.push_oci_archive(archive, "kfp-ddp:cli"),
    }


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_image_is_refused_before_anything_is_sent(
    kfp_server: FakeKfpServer, images: dict[str, str], command: str
) -> None:
    missing = images["missing"]
    result = submit(command, kfp_server, package_for(missing))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert error.startswith(f"Error: {command}: the image {missing} does not exist")
    assert f"make image IMAGE={missing} && docker push {missing}" in error
    assert "--image" in error
    assert kfp_server.requests == []


@pytest.mark.parametrize("command", COMMANDS)
def test_an_existing_image_goes_through(
    kfp_server: FakeKfpServer, images: dict[str, str], command: str
) -> None:
    result = submit(command, kfp_server, package_for(images["present"]))
    assert result.exit_code == 0, result.output
    assert created(kfp_server) == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreachable_registry_is_refused_unless_skipped(
    kfp_server: FakeKfpServer, command: str
) -> None:
    package = package_for(f"127.0.0.1:{free_port()}/kfp-ddp:0.1.0")
    refused = submit(command, kfp_server, package)
    assert refused.exit_code == 1, refused.output
    assert "cannot ask http://127.0.0.1:" in refused.output
    assert "--skip-image-check" in refused.output
    assert kfp_server.requests == []
    skipped = submit(command, kfp_server, package, "--skip-image-check")
    assert skipped.exit_code == 0, skipped.output
    assert created(kfp_server) == 1


def test_a_private_image_goes_through_with_the_users_docker_login(
    kfp_server: FakeKfpServer,
    images: dict[str, str],
    oci_registry_with_login: LocalRegistry,
    home: Path,
) -> None:
    registry = oci_registry_with_login
    package = package_for(images["private"])
    refused = submit("run", kfp_server, package)
    assert refused.exit_code == 1, refused.output
    assert f"docker login {registry.host}" in refused.output
    assert kfp_server.requests == []
    config = home / ".docker" / "config.json"
    config.parent.mkdir()
    pair = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    config.write_text(json.dumps({"auths": {registry.host: {"auth": pair}}}))
    accepted = submit("run", kfp_server, package)
    assert accepted.exit_code == 0, accepted.output
    assert len(kfp_server.runs) == 1
    for result in (refused, accepted):
        assert str(registry.password) not in result.output
        assert pair not in result.output


def test_the_training_nodes_image_parameter_is_checked_too(
    kfp_server: FakeKfpServer, images: dict[str, str]
) -> None:
    """-p image=... (the nodes' image) is pulled by the run: a missing one is refused."""
    package = package_for(images["present"])
    result = submit("run", kfp_server, package, "-p", f"image={images['missing']}")
    assert result.exit_code == 2, result.output
    assert f"the image {images['missing']} does not exist" in result.output
    assert kfp_server.requests == []


def test_skip_image_check_is_on_each_command_help() -> None:
    for command in COMMANDS:
        help_text = CliRunner().invoke(main, [command, "--help"]).output
        assert "--skip-image-check" in help_text, command


@pytest.mark.parametrize("command", ["compile", "compile-components"])
def test_compile_notes_the_release_image_and_the_workflow(tmp_path: Path, command: str) -> None:
    result = CliRunner().invoke(main, [command, "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert f"{DEFAULT_IMAGE} is the release image of kfp-ddp" in result.stderr
    assert ".github/workflows/release.yml" in result.stderr and "--image" in result.stderr
    assert "placeholder" not in result.stderr
    own = CliRunner().invoke(
        main, [command, "--output", str(tmp_path / "own"), "--image", "registry.example/ddp:1"]
    )
    assert own.exit_code == 0, own.output
    assert "WARNING" not in own.stderr
