"""Where the control plane's binaries come from: the envtest convention.

``KUBEBUILDER_ASSETS`` names a folder holding ``kube-apiserver`` and ``etcd`` (what
``setup-envtest use 1.36 -p path`` prints); it wins. Otherwise every binary is decompressed from
``../shared/envtest/<name>.xz`` into a cache folder keyed by the archive's SHA-256, once (an
atomic rename, so parallel test processes never see half a binary). A binary found in neither
place is ``None``: the tests that need it skip, saying how to get it.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

SHARED_ENVTEST = Path(__file__).resolve().parents[3] / "shared" / "envtest"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kfp-ddp" / "envtest"

CORE = ("etcd", "kube-apiserver")
"""What KUBEBUILDER_ASSETS holds (setup-envtest also puts kubectl there)."""
CONTROLLERS = (
    "kube-controller-manager",
    "jobset-controller",
    "trainer-controller-manager",
    "training-operator",
    "kuberay-operator",
    "mpi-operator",
)
COMPILER = "kfp-argo-compile"
HOW_TO_GET = (
    "put ../shared/envtest (the *.xz binaries) beside the repository (looked in "
    f"{SHARED_ENVTEST}), or set KUBEBUILDER_ASSETS to a folder holding them: kube-apiserver "
    "and etcd (`setup-envtest use 1.36 -p path` prints one), plus kube-controller-manager, "
    "jobset-controller, trainer-controller-manager, training-operator and kfp-argo-compile for "
    "the tests that run the controllers or the KFP compiler (build.sh in ../shared/envtest "
    "rebuilds them)"
)


@dataclass(frozen=True)
class Binaries:
    """Paths of the binaries found (None: not available here)."""

    paths: dict[str, Path | None]

    def __getitem__(self, name: str) -> Path:
        path = self.paths.get(name)
        if path is None:
            raise KeyError(name)
        return path

    def missing(self, names: tuple[str, ...]) -> list[str]:
        return [name for name in names if self.paths.get(name) is None]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _decompressed(archive: Path) -> Path:
    """The binary of ``archive`` in the cache (decompressed on first use)."""
    target = CACHE / _sha256(archive)[:16] / archive.stem
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out,
        lzma.open(archive) as source,
    ):
        shutil.copyfileobj(source, out, 1 << 20)
    os.chmod(out.name, 0o755)
    os.replace(out.name, target)
    return target


def _from_assets(name: str) -> Path | None:
    folder = os.environ.get("KUBEBUILDER_ASSETS")
    if not folder:
        return None
    path = Path(folder) / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def find_binaries(names: tuple[str, ...] = (*CORE, *CONTROLLERS, COMPILER)) -> Binaries:
    """Each binary from KUBEBUILDER_ASSETS, else from ../shared/envtest, else None."""
    paths: dict[str, Path | None] = {}
    for name in names:
        path = _from_assets(name)
        archive = SHARED_ENVTEST / f"{name}.xz"
        if path is None and archive.is_file():
            path = _decompressed(archive)
        paths[name] = path
    return Binaries(paths)
