"""The loopback registry fixture's push helpers: an OCI archive with skopeo, and an image of a
test-private podman storage (never /var/lib/containers) with podman."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.containers.registry import LocalRegistry, write_oci_archive

PODMAN_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
"""


def manifest_of(registry: LocalRegistry, name: str) -> dict:
    repository, _, tag = name.rpartition(":")
    request = urllib.request.Request(
        f"{registry.url}/v2/{repository}/manifests/{tag}",
        headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json",
            **registry.authorization(),
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_push_an_oci_archive(oci_registry: LocalRegistry, tmp_path: Path) -> None:
    archive = write_oci_archive(tmp_path / "tiny.tar", files={"a.txt": b"a\n"})
    image = oci_registry.push_oci_archive(archive, "tiny:1")
    assert image == f"{oci_registry.host}/tiny:1"
    assert oci_registry.host.startswith("127.0.0.1:")
    assert len(manifest_of(oci_registry, "tiny:1")["layers"]) == 1


@pytest.mark.parametrize("login", [False, True], ids=["open", "login"])
def test_push_a_podman_image_from_a_private_storage(
    request: pytest.FixtureRequest, tmp_path: Path, login: bool
) -> None:
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("no podman: apt-get install podman (.ci/run does it when run as root)")
    registry: LocalRegistry = request.getfixturevalue(
        "oci_registry_with_login" if login else "oci_registry"
    )
    conf = tmp_path / "containers.conf"
    conf.write_text(PODMAN_CONF)
    run = Path(tempfile.mkdtemp(prefix="kfp-ddp-run-"))  # podman: a runroot of <= 50 characters
    request.addfinalizer(lambda: shutil.rmtree(run, ignore_errors=True))
    storage = [
        "--root", str(tmp_path / "root"),
        "--runroot", str(run / "runroot"),
        "--tmpdir", str(run / "tmp"),
        "--storage-driver", "vfs",
    ]  # fmt: skip
    env = {"CONTAINERS_CONF": str(conf)}
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    imported = subprocess.run(
        [podman, *storage, "import", "--quiet", str(rootfs), "localhost/tiny:1"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    image = registry.push_podman_image(
        "localhost/tiny:1", "podman/tiny:1", podman_args=storage, env=env
    )
    assert image == registry.image("podman/tiny:1")
    assert manifest_of(registry, "podman/tiny:1")["layers"]
    assert (tmp_path / "root" / "vfs-images").is_dir()  # the image lived in the test's storage
