"""Container image references, parsed by the grammar docker and the OCI distribution spec use.

``[registry[:port]/]repository[:tag][@algorithm:digest]``: the registry is the first part when it
has a ``.`` or a ``:`` or is ``localhost`` (a host name, an IPv4 address or a bracketed IPv6
address, any case); the repository is lowercase components (``a-z0-9`` joined by ``.``, ``_``,
``__`` or dashes) separated by ``/``; a tag is up to 128 of ``\\w.-`` not starting with ``.`` or
``-``. No registry means Docker Hub (single names under ``library/``), no tag ``latest``.

Every layer checks an image with ``ImageReference.parse`` (the launcher's spec, the KFP
components, the pipeline parameter, the registry check), so a name a container runtime would
refuse is refused before anything is submitted, with the same words everywhere.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io")
DOCKER_HUB_API = "registry-1.docker.io"
"""Where Docker Hub's distribution API answers."""
EXAMPLE = "ghcr.io/my-team/kfp-ddp:0.2.0"

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"
)
_TAG = re.compile(r"\w[\w.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}")


@dataclass(frozen=True)
class ImageReference:
    """An image name split the way docker splits it."""

    image: str
    """As given, e.g. ``ghcr.io/kfp-ddp/kfp-ddp:0.1.0``."""
    registry: str
    """``ghcr.io``, ``docker.io``, ``127.0.0.1:5000``."""
    repository: str
    """``kfp-ddp/kfp-ddp``, ``library/python``."""
    reference: str
    """The tag, or the ``sha256:...`` digest."""

    @classmethod
    def parse(cls, image: str) -> ImageReference:
        """Raises ValueError, saying which part is wrong and how a good one looks, for a name
        docker would refuse."""
        if not isinstance(image, str) or not image.strip():
            raise ValueError(f"{image!r} is empty, not an image name; e.g. {EXAMPLE}")
        if image != image.strip() or any(c.isspace() for c in image):
            raise ValueError(f"{image!r} has white space; an image name has none, e.g. {EXAMPLE}")
        name, _, digest = image.partition("@")
        first, slash, rest = name.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
            if not _HOST.fullmatch(registry):
                raise ValueError(
                    f"{image!r}: {registry!r} is not a registry host[:port], e.g. ghcr.io or "
                    "127.0.0.1:5000"
                )
        else:
            registry, path = DOCKER_HUB, name
        tag = None
        if ":" in path.rsplit("/", 1)[-1]:
            path, _, tag = path.rpartition(":")
        if normalized_registry(registry) == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        if not path or not all(_COMPONENT.fullmatch(part) for part in path.split("/")):
            hint = " (repository paths are lowercase)" if path != path.lower() else ""
            raise ValueError(
                f"{image!r}: {path!r} is not a repository path{hint}; an image name is "
                f"[registry/]repository[:tag][@digest], e.g. {EXAMPLE}"
            )
        if tag is not None and not _TAG.fullmatch(tag):
            raise ValueError(
                f"{image!r}: {tag!r} is not a tag (up to 128 letters, digits, '_', '.', '-', "
                "not starting with '.' or '-')"
            )
        if digest and not _DIGEST.fullmatch(digest):
            raise ValueError(f"{image!r}: {digest!r} is not a digest, e.g. sha256:<64 hex>")
        return cls(
            image=image, registry=registry, repository=path, reference=digest or tag or "latest"
        )

    @property
    def endpoint(self) -> str:
        """The registry's API base: ``https://ghcr.io``, ``http://127.0.0.1:5000``."""
        host = DOCKER_HUB_API if normalized_registry(self.registry) == DOCKER_HUB else self.registry
        return f"{'http' if is_loopback(host) else 'https'}://{host}"

    @property
    def manifest_url(self) -> str:
        return f"{self.endpoint}/v2/{self.repository}/manifests/{self.reference}"


def image_problem(image: object) -> str | None:
    """What is wrong with ``image`` as an image name, None if nothing."""
    if not isinstance(image, str):
        return f"{image!r} is not a string; e.g. {EXAMPLE}"
    try:
        ImageReference.parse(image)
    except ValueError as exc:
        return str(exc)
    return None


def normalized_registry(registry: str) -> str:
    """``index.docker.io`` and ``registry-1.docker.io`` → ``docker.io``; others unchanged."""
    registry = registry.lower()
    return DOCKER_HUB if registry in DOCKER_HUB_ALIASES else registry


def is_loopback(host: str) -> bool:
    """``localhost[:port]``, ``127.x.y.z[:port]``, ``[::1][:port]``."""
    hostname = urllib.parse.urlsplit(f"//{host}").hostname or ""
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False
