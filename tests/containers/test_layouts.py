"""tests/containers/layouts.py's blob sharing: a new layout starts with links to the blobs of
the complete layouts, and keeps only those its image uses (no podman needed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.containers import layouts


def _blob(layout: Path, content: bytes) -> str:
    digest = hashlib.sha256(content).hexdigest()
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest).write_bytes(content)
    return f"sha256:{digest}"


def _image(layout: Path, layers: list[bytes]) -> None:
    """A layout of one image: its layers, a config and a manifest named by the index."""
    manifest = {
        "config": {"digest": _blob(layout, b"config of " + b"+".join(layers))},
        "layers": [{"digest": _blob(layout, layer)} for layer in layers],
    }
    entry = {"digest": _blob(layout, json.dumps(manifest).encode())}
    (layout / "index.json").write_text(json.dumps({"manifests": [entry]}))


def test_a_new_layout_links_the_known_blobs_and_keeps_only_its_own(monkeypatch, tmp_path):
    monkeypatch.setattr(layouts, "LAYOUTS", tmp_path)
    base = tmp_path / "localhost_kfp-ddp_cpu" / "0123456789abcdef"
    _image(base, [b"debian", b"wheels", b"sources v1"])
    interrupted = tmp_path / "localhost_kfp-ddp_cpu" / ".fedcba9876543210.partial"
    _blob(interrupted, b"half a layer")  # never linked: only complete layouts are

    new = tmp_path / "localhost_kfp-ddp-ray_test" / ".1111222233334444.partial"
    layouts._link_known_blobs(new / "blobs" / "sha256")
    linked = {path.name: path for path in (new / "blobs" / "sha256").iterdir()}
    known = {path.name: path for path in (base / "blobs" / "sha256").iterdir()}
    assert linked.keys() == known.keys()
    assert all(linked[name].samefile(known[name]) for name in known)  # links, not copies

    _image(new, [b"debian", b"wheels", b"sources v1", b"ray"])  # what skopeo writes
    layouts._remove_unused_blobs(new)
    kept = {path.name for path in (new / "blobs" / "sha256").iterdir()}
    ours = json.loads((new / "index.json").read_text())["manifests"][0]["digest"]
    manifest = json.loads((new / "blobs" / "sha256" / ours.removeprefix("sha256:")).read_text())
    assert kept == {
        d.removeprefix("sha256:")
        for d in [ours, manifest["config"]["digest"], *(x["digest"] for x in manifest["layers"])]
    }
    assert len(kept) == 6  # 4 layers, a config, a manifest: base's config and manifest went
    assert all((base / "blobs" / "sha256" / name).is_file() for name in known)  # from here only
