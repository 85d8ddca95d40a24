"""Where a run's weights start (``--init-from``; the pipeline's ``init_from``).

=====================  ==========================================================================
``''``                 random weights (seeded by ``--seed``)
``imagenet``           torchvision's pretrained weights for ``--model``, through torchvision's
                       weights API and its cache (``$TORCH_HOME/hub/checkpoints``): downloaded
                       once, or read from a cache filled beforehand (clusters without internet)
``s3://…/``            a model folder this pipeline published (``weights.pt`` + ``model.json``)
``s3://…/x.pt``        a state dict (``.pt`` / ``.pth``), read by ``torch.load(weights_only=True)``
``latest``             the pipeline's: the model ``<publish_uri>/latest.json`` names, resolved by
                       its check step to an ``s3://`` folder (the trainer itself refuses it)
a path                 the trainer's own runs: a model folder or a state dict on its disk (the
                       pipeline refuses paths: the nodes cannot read the machine that gave it)
=====================  ==========================================================================

An ``s3://`` value may end in ``#sha256=<hex>``: the weights file must have that digest. The
pipeline's check step reads the weights, checks them against the model and pins the value, so
the training starts from exactly what was checked (and the run's folder, its cache key, names
it).

The weights must be the model's: the same parameter names and shapes. Only the classifier head
may differ, in its number of classes. Weights that name their classes (a published folder's
model.json) keep the row of each class the run still has, by name, wherever the class now sits
in the sorted class folders; new classes get fresh rows (``head by class name: 9 of the 10
classes kept, new 'dog', dropped 'cats'``): a data set that gained or lost a class keeps what the
model learnt of the others, and no class starts from another's row. Other weights get a new head
for another number of classes (``new head for 5 classes (was 1000)``). Anything else is refused,
naming the flag, before step 1.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from kfp_ddp.class_names import class_key
from trainer.errors import ConfigError
from trainer.model_shapes import head_parameter_names
from trainer.tv_compat import import_torchvision

IMAGENET = "imagenet"
LATEST = "latest"
PIN = "#sha256="
STATE_SUFFIXES = (".pt", ".pth")
FOLDER_FILES = ("weights.pt", "model.json")
"""A published model folder (``trainer.export``): its weights and its card."""
PREFIXES = ("module.", "_orig_mod.")
"""What DDP and torch.compile put before the names of a state dict saved from their wrapper."""
AUXILIARY = ("AuxLogits.", "aux1.", "aux2.")
"""Auxiliary classifiers of inception_v3 and googlenet: in their ImageNet weights, not in the
model the trainer builds (``aux_logits=False``)."""
OFFLINE_FIX = (
    "this machine cannot download it ({reason}). On a cluster without internet: copy the file "
    "into S3 and set {name} to its s3:// URI (e.g. s3://models/pretrained/{file}), or fill a "
    "torchvision cache beforehand and point TORCH_HOME at it in the nodes' env (overrides_json "
    '{{"env": {{"TORCH_HOME": "/cache/torch"}}}} with the volume mounted there; the file goes '
    "to $TORCH_HOME/hub/checkpoints/{file})"
)


class StartingWeightsError(ConfigError):
    """``--init-from`` (``init_from``) names weights this run cannot start from.

    ``value`` is what was given, ``fix`` what is wrong and what to do: the trainer says
    ``--init-from VALUE: FIX``, the pipeline ``init_from='VALUE': FIX``.
    """

    def __init__(self, value: str, fix: str):
        super().__init__(f"--init-from {value!r}: {fix}")
        self.value = value
        self.fix = fix


@dataclass(frozen=True)
class StartingWeights:
    """Weights read for ``init_from``, and where they came from."""

    init_from: str
    uri: str
    """Where the weights file was read: an s3:// URI or torchvision's download URL."""
    sha256: str
    state: dict[str, torch.Tensor] = field(repr=False)
    arch: str | None = None
    """The model the weights are for, when they say it (a published folder's model.json)."""
    classes: int | None = None
    """Their number of classes, when they say it (model.json)."""
    class_names: list[str] | None = None
    """Their classes in the head's order, when they say it (model.json)."""

    def record(self) -> dict[str, str]:
        """What ``summary.json`` and ``model.json`` keep of them."""
        return {"init_from": self.init_from, "uri": self.uri, "sha256": self.sha256}

    def pinned(self) -> str:
        """The value that names exactly these weights (``s3://…#sha256=…``; ``imagenet`` is
        pinned by torchvision's own file name)."""
        if self.init_from == IMAGENET:
            return IMAGENET
        return f"{split_pin(self.init_from)[0]}{PIN}{self.sha256}"


def split_pin(init_from: str) -> tuple[str, str]:
    """(the location, the pinned digest or '')."""
    location, _, digest = init_from.partition(PIN)
    return location, digest


def check_value(init_from: str) -> None:
    """StartingWeightsError unless ``init_from`` has one of the forms above (no I/O)."""
    location, digest = split_pin(init_from)
    if init_from in ("", IMAGENET):
        return
    if init_from == LATEST:
        raise StartingWeightsError(
            init_from,
            "'latest' is the pipeline's: its check step reads <publish_uri>/latest.json and "
            "hands the trainer that model's s3:// URI; give the trainer an s3:// URI itself",
        )
    if ("://" in location and not location.startswith("s3://")) or location == "s3://":
        raise StartingWeightsError(
            init_from,
            "use '' (random weights), 'imagenet' (torchvision's pretrained weights), 'latest' "
            "(the pipeline's last published model), an s3:// model folder "
            "(weights.pt + model.json) or an s3://…/file.pt state dict (the trainer alone also "
            "takes a path on its machine)",
        )
    if digest and (len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest)):
        raise StartingWeightsError(init_from, f"{PIN}{digest} is not a sha256 digest (64 hex)")


def fetch(init_from: str, arch: str, *, endpoint_url: str | None = None) -> StartingWeights | None:
    """The weights ``init_from`` names for ``--model arch`` (None: random weights)."""
    check_value(init_from)
    if not init_from:
        return None
    if init_from == IMAGENET:
        return _imagenet(arch)
    if init_from.startswith("s3://"):
        return _from_s3(init_from, endpoint_url)
    return _from_path(init_from)


@dataclass(frozen=True)
class TorchvisionWeights:
    """torchvision's pretrained weights for a model, and where its cache keeps their file."""

    arch: str
    weights: Any
    """The ``WeightsEnum`` member (``DEFAULT``): its ``url``, ``meta``, ``get_state_dict``."""

    @property
    def file(self) -> str:
        return PurePosixPath(self.weights.url).name

    @property
    def cached(self) -> Path:
        """The file in torchvision's cache (``$TORCH_HOME/hub/checkpoints``)."""
        return Path(torch.hub.get_dir()) / "checkpoints" / self.file

    def unreachable(self, reason: str) -> StartingWeightsError:
        """The refusal when they can be neither downloaded nor found in the cache."""
        return StartingWeightsError(
            IMAGENET,
            f"torchvision's weights for {self.arch} ({self.weights}) come from "
            f"{self.weights.url}, and "
            + OFFLINE_FIX.format(reason=reason[:200], name="init_from", file=self.file),
        )


def torchvision_weights(arch: str) -> TorchvisionWeights:
    """torchvision's default pretrained weights for ``arch``; StartingWeightsError if none."""
    tv = import_torchvision()
    try:
        weights = tv.models.get_model_weights(arch).DEFAULT
    except (ValueError, KeyError, AttributeError) as err:
        raise StartingWeightsError(
            IMAGENET,
            f"torchvision has no pretrained weights for --model {arch} ({err}); use a model "
            "that has (torchvision.models.list_models) or an s3:// state dict",
        ) from err
    return TorchvisionWeights(arch=arch, weights=weights)


def _imagenet(arch: str) -> StartingWeights:
    found = torchvision_weights(arch)
    try:
        state = found.weights.get_state_dict(progress=False, check_hash=True)
    except (OSError, RuntimeError) as err:  # URLError is an OSError
        raise found.unreachable(str(getattr(err, "reason", err)).splitlines()[0]) from err
    return StartingWeights(
        init_from=IMAGENET,
        uri=found.weights.url,
        sha256=_sha256(found.cached),
        state=_state_dict(IMAGENET, state),
        arch=arch,
        classes=len(found.weights.meta.get("categories") or []) or None,
    )


def _from_s3(init_from: str, endpoint_url: str | None) -> StartingWeights:
    from components.s3_sync import S3SyncError, sync  # S3 only for the runs that need it

    location, _ = split_pin(init_from)
    is_file = location.lower().endswith(STATE_SUFFIXES)
    folder, _, name = location.rpartition("/") if is_file else (location.rstrip("/"), "", "")
    wanted = [name] if is_file else list(FOLDER_FILES)
    with tempfile.TemporaryDirectory(prefix="kfp-ddp-init-") as tmp:
        try:
            sync(
                f"{folder}/",
                tmp,
                include=[_literal_glob(w) for w in wanted],
                endpoint_url=endpoint_url,
                progress=False,
            )
        except S3SyncError as err:
            raise StartingWeightsError(init_from, f"cannot be read: {err}") from err
        return _read(init_from, Path(tmp), name, uri_folder=folder)


def _from_path(init_from: str) -> StartingWeights:
    """A model folder or a state dict on this machine's disk (the trainer's own runs)."""
    location, _ = split_pin(init_from)
    path = Path(location)
    if path.is_dir():
        return _read(init_from, path, "", uri_folder=str(path))
    if path.is_file():
        return _read(init_from, path.parent, path.name, uri_folder=str(path.parent))
    raise StartingWeightsError(
        init_from, "no such file or folder here; give a model folder or a .pt/.pth state dict"
    )


def _read(init_from: str, found: Path, name: str, *, uri_folder: str) -> StartingWeights:
    """The weights in ``found``: the file ``name``, or (no name) a model folder's."""
    location, pinned = split_pin(init_from)
    weights = found / (name or FOLDER_FILES[0])
    if not weights.is_file():
        what = name or "weights.pt and model.json (a model folder)"
        raise StartingWeightsError(
            init_from,
            f"holds no {what}; give a model folder this pipeline published "
            "(s3://…/<run id>/) or a .pt/.pth state dict",
        )
    card = {} if name else _card(init_from, found / FOLDER_FILES[1])
    digest = _sha256(weights)
    if pinned and digest != pinned:
        raise StartingWeightsError(
            init_from,
            f"the weights changed since they were checked (sha256 {digest}); start the run "
            "again to check them anew",
        )
    return StartingWeights(
        init_from=location,
        uri=f"{uri_folder.rstrip('/')}/{weights.name}",
        sha256=digest,
        state=_load(init_from, weights),
        arch=card.get("arch"),
        classes=card.get("num_classes"),
        class_names=_names(card.get("class_names")),
    )


def _names(value: Any) -> list[str] | None:
    """A model card's class names, if it holds a list of distinct names."""
    if isinstance(value, list) and all(isinstance(n, str) for n in value):
        return value if len(set(value)) == len(value) else None
    return None


def _card(init_from: str, path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise StartingWeightsError(
            init_from,
            "has weights.pt but no model.json: not a model folder this pipeline published; "
            "give the weights file itself (s3://…/weights.pt)",
        )
    try:
        card = json.loads(path.read_text())
    except ValueError as err:
        raise StartingWeightsError(init_from, f"its model.json is not JSON ({err})") from err
    return card if isinstance(card, dict) else {}


def _load(init_from: str, path: Path) -> dict[str, torch.Tensor]:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same refusal
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err)
        raise StartingWeightsError(
            init_from,
            f"{path.name} is not a state dict torch.load(weights_only=True) can read ({reason}); "
            "save the weights with torch.save(model.state_dict(), path)",
        ) from err
    return _state_dict(init_from, loaded)


def _state_dict(init_from: str, loaded: Any) -> dict[str, torch.Tensor]:
    """``loaded`` as a state dict (parameter name → tensor), DDP's and compile's prefixes off."""
    if not (
        isinstance(loaded, Mapping)
        and loaded
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items())
    ):
        what = type(loaded).__name__
        if isinstance(loaded, Mapping):
            what += f" with keys {sorted(map(str, loaded))[:5]}"
        raise StartingWeightsError(
            init_from,
            f"holds a {what}, not a state dict (parameter names to tensors); save the weights "
            "with torch.save(model.state_dict(), path)",
        )
    state = {}
    for key, tensor in loaded.items():
        for prefix in PREFIXES:
            key = key.removeprefix(prefix)
        state[key] = tensor
    return state


@dataclass(frozen=True)
class HeadChange:
    """The classifier head changed: its parameters, and the classes they had and have.

    By class name (the weights say their classes): a class of both keeps its row of the head,
    wherever it now is; a new class gets a fresh row. Else the whole head is new."""

    keys: list[str]
    was: int
    now: int
    kept: list[str] | None = None
    """The classes whose rows were carried over by name (None: the whole head is new)."""
    new: list[str] = field(default_factory=list)
    """The classes the weights did not have (fresh rows)."""
    dropped: list[str] = field(default_factory=list)
    """The weights' classes this run does not have."""

    def line(self) -> str:
        if self.kept is None:
            return f"new head for {self.now} classes (was {self.was})"
        parts = [f"head by class name: {len(self.kept)} of the {self.now} classes kept"]
        if self.new:
            parts.append(f"new {_listed(self.new)}")
        if self.dropped:
            parts.append(f"dropped {_listed(self.dropped)}")
        return ", ".join(parts)


def _listed(names: list[str], shown: int = 10) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(repr(n) for n in names[:shown]) + more


def match(
    model: torch.nn.Module, weights: StartingWeights, *, arch: str, num_classes: int
) -> HeadChange | None:
    """StartingWeightsError unless ``weights`` fit ``model`` (``arch`` with ``num_classes``)
    but for the classifier head's classes; the head change, if any."""
    value = weights.init_from
    if weights.arch is not None and weights.arch != arch:
        raise StartingWeightsError(
            value, f"is a {weights.arch} model, not --model {arch}: set model={weights.arch}"
        )
    own = model.state_dict()
    state = {k: v for k, v in weights.state.items() if k in own or not k.startswith(AUXILIARY)}
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    differ = sorted(k for k in own.keys() & state.keys() if own[k].shape != state[k].shape)
    head = [
        k
        for k in differ
        if own[k].ndim and own[k].shape[0] == num_classes and own[k].shape[1:] == state[k].shape[1:]
    ]
    was = {state[k].shape[0] for k in head}
    if missing or unexpected or len(head) != len(differ) or len(was) > 1:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of the model's tensors missing (e.g. {missing[:3]})")
        if unexpected:
            parts.append(f"{len(unexpected)} not in the model (e.g. {unexpected[:3]})")
        other = [k for k in differ if k not in head] or differ
        if differ and other:
            k = other[0]
            shapes = f"{tuple(state[k].shape)} vs {tuple(own[k].shape)}"
            parts.append(f"shapes differ, e.g. {k} {shapes}")
        raise StartingWeightsError(
            value,
            f"these are not weights of --model {arch} ({'; '.join(parts)}); give weights of "
            f"the same architecture, or set model to theirs",
        )
    if not head:
        return None
    return HeadChange(keys=head, was=was.pop(), now=num_classes)


def load_into(
    model: torch.nn.Module,
    weights: StartingWeights,
    *,
    arch: str,
    num_classes: int,
    class_names: list[str] | None = None,
) -> HeadChange | None:
    """Copy ``weights`` into ``model`` (checked by ``match``). When both name their classes
    (``class_names``: this run's, in order) and the names differ, the head's rows follow the
    names (:func:`head_by_name`); else a head of another size keeps the model's own new
    initialisation."""
    change = match(model, weights, arch=arch, num_classes=num_classes)
    own = model.state_dict()
    state = {k: v for k, v in weights.state.items() if k in own}
    renamed = (
        weights.class_names is not None
        and class_names is not None
        and [class_key(n) for n in class_names] != [class_key(n) for n in weights.class_names]
    )
    if renamed:
        head = sorted(head_parameter_names(arch, num_classes) & state.keys())
        by_name = head_by_name(own, state, head, weights.class_names or [], class_names or [])
        if by_name is not None:
            state.update(by_name[0])
            change = by_name[1]
            model.load_state_dict(state, strict=False)
            return change
    for key in change.keys if change else ():
        del state[key]
    model.load_state_dict(state, strict=False)
    return change


def head_by_name(
    own: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    head: list[str],
    was: list[str],
    now: list[str],
) -> tuple[dict[str, torch.Tensor], HeadChange] | None:
    """The head's tensors with the rows of ``was`` moved to where ``now`` has the same class,
    the model's own fresh rows for the new classes (None if the weights' head does not have one
    row per name in ``was``)."""
    if not head or any(state[key].shape[0] != len(was) for key in head):
        return None
    row_of = {class_key(name): row for row, name in enumerate(was)}  # either spelling
    present = {class_key(name) for name in now}
    moved = {}
    for key in head:
        rows = own[key].clone()
        for row, name in enumerate(now):
            if class_key(name) in row_of:
                rows[row] = state[key][row_of[class_key(name)]]
        moved[key] = rows
    change = HeadChange(
        keys=head,
        was=len(was),
        now=len(now),
        kept=[n for n in now if class_key(n) in row_of],
        new=[n for n in now if class_key(n) not in row_of],
        dropped=[n for n in was if class_key(n) not in present],
    )
    return moved, change


def _literal_glob(name: str) -> str:
    """``name`` as a glob that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
