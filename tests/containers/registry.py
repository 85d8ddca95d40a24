"""A real OCI registry on loopback for tests (a pytest plugin, registered in tests/conftest.py).

Fixtures (session scope, one registry per test process, stopped at the session's end):

- ``oci_registry``: distribution's ``/usr/bin/docker-registry serve`` (Debian's docker-registry
  package) on 127.0.0.1 and a free port, its storage under the session's tmp dir, open to all.
- ``oci_registry_with_login``: the same behind htpasswd basic auth (``REGISTRY_USER`` /
  ``REGISTRY_PASSWORD``); every push and pull needs them.

Both yield a ``LocalRegistry``::

    def test_pushed(oci_registry):
        image = oci_registry.push_oci_archive(archive, "kfp-ddp:0.1.0-cpu")  # or:
        image = oci_registry.push_oci_layout(oci_layout(podman, IMAGE), "kfp-ddp:0.1.0-cpu")  # or:
        image = oci_registry.push_podman_image(
            "localhost/kfp-ddp:0.1.0-cpu", "kfp-ddp:0.1.0-cpu",
            podman_args=["--root", ROOT, "--runroot", RUNROOT], env={"CONTAINERS_CONF": CONF},
        )
        assert image == f"{oci_registry.host}/kfp-ddp:0.1.0-cpu"

``.host`` is ``127.0.0.1:PORT`` (what an image name starts with), ``.url`` ``http://127.0.0.1:PORT``.
Without docker-registry the tests that use a registry skip, saying what to install; the push
helpers skip likewise without skopeo or podman (``.ci/run`` installs all three when run as root).
``write_oci_archive`` makes a tiny image to push without any container tool.

Pushing as root, skopeo and podman record which blobs they saw in containers/image's blob-info
cache, /var/lib/containers/cache (a cache of digests, not storage; they have no flag to move it);
images themselves never leave the test's folders.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kfp_ddp.free_ports import free_port

REGISTRY_BINARY = "/usr/bin/docker-registry"
HOW_TO_GET = (
    "apt-get install docker-registry skopeo podman (Debian/Ubuntu; .ci/run does it as root)"
)
REGISTRY_USER = "kfp-ddp-tester"
REGISTRY_PASSWORD = "registry-secret-5d1f0c"
"""Test-only. ``REGISTRY_HTPASSWD`` holds its bcrypt hash (distribution accepts bcrypt only),
made once with Python's crypt module: crypt(PASSWORD, mksalt(METHOD_BLOWFISH, rounds=32))."""
REGISTRY_HTPASSWD = (
    f"{REGISTRY_USER}:$2b$05$wvQ3fB50wd78suPw6VHYsOeImAZAhDy8wy6dl9zxjHoAo9oIjpE4q\n"
)
START_TIMEOUT_S = 30.0
PORT_ATTEMPTS = 3
PUSH_TIMEOUT_S = 300


@dataclass
class LocalRegistry:
    """A running registry: where it listens, and how to put images into it."""

    host: str
    """``127.0.0.1:PORT``: image names in it are ``{host}/{repository}:{tag}``."""
    storage: Path
    """Its filesystem storage (under the session's tmp dir)."""
    log: Path
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def image(self, name: str) -> str:
        """``kfp-ddp:TAG`` → ``127.0.0.1:PORT/kfp-ddp:TAG``."""
        return f"{self.host}/{name}"

    def authorization(self) -> dict[str, str]:
        """The basic-auth header of a registry with login ({} for an open one)."""
        if self.username is None:
            return {}
        pair = f"{self.username}:{self.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}

    def push_oci_archive(self, archive: Path, name: str) -> str:
        """Copy an OCI archive (``podman save --format oci-archive``, ``write_oci_archive``) to
        ``name`` (``kfp-ddp:TAG``) with skopeo, every platform of an index included; returns the
        image's full name."""
        return self._skopeo_push(f"oci-archive:{archive}", name)

    def push_oci_layout(self, reference: str, name: str) -> str:
        """Copy an OCI layout (``oci:DIR:TAG``, e.g. from ``tests.containers.layouts``) to
        ``name`` with skopeo: its layers are uploaded as they are, uncompressed ones included,
        and the image keeps its digest. Returns the image's full name.

        Without ``--preserve-digests`` skopeo gzips every uncompressed layer on its way to a
        registry: measured here for the CPU image's layout (1.5 GB), 20.9 CPU-s of skopeo and
        2 of the registry, against 5.3 and 5 as they are; the node's containerd then has no
        layer to gunzip either."""
        return self._skopeo_push(reference, name, "--preserve-digests")

    def pull_oci_layout(self, image: str, folder: Path) -> Path:
        """Pull ``image`` (a full name in this registry) into the OCI layout ``folder`` with
        skopeo: every blob downloaded and checked against its digest, nothing unpacked, and
        uncompressed layers kept so (skopeo would otherwise gzip them into the layout)."""
        command = [
            _skopeo(),
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            "--dest-oci-accept-uncompressed-layers",
        ]
        if self.username is not None:
            command += ["--src-creds", f"{self.username}:{self.password}"]
        run_image_copy([*command, f"docker://{image}", f"oci:{folder}:pulled"], os.environ)
        return folder

    def _skopeo_push(self, source: str, name: str, *options: str) -> str:
        command = [_skopeo(), "copy", "--quiet", "--all", "--dest-tls-verify=false", *options]
        if self.username is not None:
            command += ["--dest-creds", f"{self.username}:{self.password}"]
        command += [source, f"docker://{self.image(name)}"]
        run_image_copy(command, os.environ)
        return self.image(name)

    def push_podman_image(
        self,
        source: str,
        name: str,
        *,
        podman_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Push the image ``source`` of a podman storage to ``name`` (``kfp-ddp:TAG``).

        ``podman_args``: the global options the image was built with (``--root``,
        ``--runroot``, ``--storage-driver``...; podman wants a runroot of at most 50
        characters); ``env`` is added to this process's environment (e.g. ``CONTAINERS_CONF``).
        Returns the image's full name.
        """
        podman = shutil.which("podman")
        if podman is None:
            pytest.skip(f"no podman to push test images: {HOW_TO_GET}")
        command = [podman, *podman_args, "push", "--quiet", "--tls-verify=false"]
        if self.username is not None:
            command += ["--creds", f"{self.username}:{self.password}"]
        command += [source, f"docker://{self.image(name)}"]
        run_image_copy(command, {**os.environ, **(env or {})})
        return self.image(name)


def _skopeo() -> str:
    """skopeo's path; without it the test skips, saying how to get it."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        pytest.skip(f"no skopeo to copy test images: {HOW_TO_GET}")
    return skopeo


def run_image_copy(
    command: list[str], env: Mapping[str, str], timeout: float = PUSH_TIMEOUT_S
) -> None:
    """Run a copy of an image (``skopeo copy``, ``podman push``); a failure names the tool, the
    source and the destination only (the command may hold credentials) with its error's tail."""
    result = subprocess.run(
        command, capture_output=True, text=True, env=dict(env), timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise AssertionError(
            f"{Path(command[0]).name} copy failed (exit {result.returncode}): "
            f"{' '.join(command[-2:])}\n{result.stderr[-2000:]}"
        )


def _config(storage: Path, port: int, htpasswd: Path | None) -> str:
    """The registry's configuration (distribution's config.yml, version 0.1)."""
    lines = [
        "version: 0.1",
        "log:",
        "  level: warn",
        "  accesslog:",
        "    disabled: true",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {storage}",
        "  delete:",
        "    enabled: true",
        "http:",
        f"  addr: 127.0.0.1:{port}",
        "  secret: kfp-ddp-test-registry",
    ]
    if htpasswd is not None:
        lines += ["auth:", "  htpasswd:", "    realm: kfp-ddp-test", f"    path: {htpasswd}"]
    return "\n".join(lines) + "\n"


def _answers(url: str, headers: Mapping[str, str]) -> bool:
    request = urllib.request.Request(f"{url}/v2/", headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running_registry(folder: Path, *, login: bool = False) -> Iterator[LocalRegistry]:
    """Start ``docker-registry serve`` in ``folder`` (config, storage, log), wait for
    ``GET /v2/`` → 200, yield it, stop it."""
    if not os.access(REGISTRY_BINARY, os.X_OK):
        pytest.skip(f"no {REGISTRY_BINARY} for the test registry: {HOW_TO_GET}")
    folder.mkdir(parents=True, exist_ok=True)
    htpasswd = None
    if login:
        htpasswd = folder / "htpasswd"
        htpasswd.write_text(REGISTRY_HTPASSWD)
    for attempt in range(PORT_ATTEMPTS):
        port = free_port()
        config = folder / "config.yml"
        config.write_text(_config(folder / "storage", port, htpasswd))
        registry = LocalRegistry(
            host=f"127.0.0.1:{port}",
            storage=folder / "storage",
            log=folder / "registry.log",
            username=REGISTRY_USER if login else None,
            password=REGISTRY_PASSWORD if login else None,
        )
        with registry.log.open("ab") as log:
            process = subprocess.Popen(
                [REGISTRY_BINARY, "serve", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while process.poll() is None and not _answers(registry.url, registry.authorization()):
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"the test registry did not answer GET /v2/ within {START_TIMEOUT_S:.0f} "
                        f"s; its log:\n{registry.log.read_text()[-2000:]}"
                    )
                time.sleep(0.05)
            if process.poll() is None:
                yield registry
                return
            tail = registry.log.read_text()[-2000:]
            if "address already in use" not in tail or attempt == PORT_ATTEMPTS - 1:
                raise AssertionError(
                    f"the test registry exited ({process.returncode}); its log:\n{tail}"
                )
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """An open registry on 127.0.0.1 (see the module's docstring)."""
    with running_registry(tmp_path_factory.mktemp("oci-registry")) as registry:
        yield registry


@pytest.fixture(scope="session")
def oci_registry_with_login(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """A registry on 127.0.0.1 that needs ``REGISTRY_USER``/``REGISTRY_PASSWORD``."""
    with running_registry(tmp_path_factory.mktemp("oci-registry-login"), login=True) as registry:
        yield registry


def _blob(layout: tarfile.TarFile, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    layout.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_oci_archive(
    path: Path, *, files: Mapping[str, bytes] | None = None, platforms: Sequence[str] = ()
) -> Path:
    """A tiny image as an OCI archive (an OCI image layout in a tar): one layer holding
    ``files``. With ``platforms`` (``linux/amd64``, ``linux/arm64``) it is a multi-platform
    image index of one manifest per platform, like a release built for several."""
    files = dict(files or {"hello.txt": b"kfp-ddp test image\n"})
    layer_bytes = io.BytesIO()
    with tarfile.open(fileobj=layer_bytes, mode="w") as layer:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            layer.addfile(info, io.BytesIO(data))
    layer_data = layer_bytes.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_data).hexdigest()
    with tarfile.open(path, "w") as layout:
        layer_blob = _blob(layout, layer_data)

        def manifest(os_name: str, architecture: str) -> dict[str, object]:
            config = {
                "architecture": architecture,
                "os": os_name,
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                "config": {},
            }
            content = {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    **_blob(layout, json.dumps(config).encode()),
                },
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_blob}],
            }
            return {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_blob(layout, json.dumps(content).encode()),
                "platform": {"os": os_name, "architecture": architecture},
            }

        if platforms:
            index = {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [manifest(*p.split("/", 1)) for p in platforms],
            }
            top = {
                "mediaType": "application/vnd.oci.image.index.v1+json",
                **_blob(layout, json.dumps(index).encode()),
            }
        else:
            top = manifest("linux", "amd64")
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps({"schemaVersion": 2, "manifests": [top]}).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            layout.addfile(info, io.BytesIO(data))
    return path
