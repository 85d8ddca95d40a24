"""The user's credentials for a container registry, read where docker and podman keep them.

Looked up in podman's order, then docker's: ``$REGISTRY_AUTH_FILE``,
``${XDG_RUNTIME_DIR}/containers/auth.json``, ``~/.config/containers/auth.json``, then
``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``). The first file with an entry
for the registry wins: an ``auths`` entry (base64 ``auth`` of ``user:password``,
``username``/``password``, or an ``identitytoken``), else the credential helper that file names
(``credHelpers`` for the registry, else ``credsStore``: ``docker-credential-<name> get``).

A secret is never part of a message, a log line or a ``repr``: what the check reports is
``source``, the file or helper the credentials came from.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kfp_ddp.image_reference import DOCKER_HUB, normalized_registry

DOCKER_HUB_HELPER_URL = "https://index.docker.io/v1/"
"""The server URL ``docker login`` files Docker Hub under (and hands to credential helpers)."""
HELPER_TIMEOUT_S = 10.0
LOGIN_HINT_FILES = (
    "$REGISTRY_AUTH_FILE, ${XDG_RUNTIME_DIR}/containers/auth.json (podman login), "
    "~/.docker/config.json (docker login)"
)


@dataclass(frozen=True)
class RegistryCredentials:
    """A user name and password (or an identity token) and where they were found."""

    source: str
    """The auth file or ``docker-credential-<name>`` helper they came from (safe to print)."""
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    identity_token: str | None = field(default=None, repr=False)
    """An OAuth2 refresh token (``docker login`` to Docker Hub or Azure Container Registry)."""

    def basic_authorization(self) -> str | None:
        """The ``Authorization: Basic`` value, or None without a user name and password."""
        if self.username is None or self.password is None:
            return None
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def auth_files() -> list[Path]:
    """The auth files that may hold credentials, in the order they are consulted."""
    files = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        files.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    if os.environ.get("XDG_RUNTIME_DIR"):
        files.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    home = Path.home()
    files.append(home / ".config" / "containers" / "auth.json")
    docker_config = os.environ.get("DOCKER_CONFIG")
    files.append((Path(docker_config) if docker_config else home / ".docker") / "config.json")
    return files


def _key_scope(key: str) -> str:
    """An ``auths`` key as ``registry[/namespace]``: no scheme, no ``/v1/`` or ``/v2/``."""
    key = key.strip().removeprefix("https://").removeprefix("http://").rstrip("/")
    for suffix in ("/v1", "/v2"):
        key = key.removesuffix(suffix)
    registry, _, namespace = key.partition("/")
    registry = normalized_registry(registry)
    return f"{registry}/{namespace}" if namespace else registry


def _matching_entry(auths: dict, registry: str, repository: str) -> dict | None:
    """The most specific ``auths`` entry for ``registry/repository`` (podman allows
    ``registry/namespace`` keys), or None."""
    target = f"{normalized_registry(registry)}/{repository}"
    best: tuple[int, dict] | None = None
    for key, entry in auths.items():
        if not isinstance(entry, dict):
            continue
        scope = _key_scope(key)
        if (target == scope or target.startswith(scope + "/")) and (
            best is None or len(scope) > best[0]
        ):
            best = (len(scope), entry)
    return best[1] if best else None


def _from_entry(entry: dict, source: str) -> RegistryCredentials | None:
    if entry.get("identitytoken"):
        return RegistryCredentials(source=source, identity_token=str(entry["identitytoken"]))
    if entry.get("auth"):
        try:
            pair = base64.b64decode(str(entry["auth"]), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        username, sep, password = pair.partition(":")
        return (
            RegistryCredentials(source=source, username=username, password=password)
            if sep
            else None
        )
    if entry.get("username") and entry.get("password") is not None:
        return RegistryCredentials(
            source=source, username=str(entry["username"]), password=str(entry["password"])
        )
    return None


def from_helper(helper: str, registry: str) -> RegistryCredentials | None:
    """Ask ``docker-credential-<helper> get`` (docker's credential-helper protocol); None when
    it is missing, fails or knows nothing for ``registry``."""
    program = f"docker-credential-{helper}"
    server = DOCKER_HUB_HELPER_URL if normalized_registry(registry) == DOCKER_HUB else registry
    try:
        result = subprocess.run(
            [program, "get"],
            input=server,
            capture_output=True,
            text=True,
            timeout=HELPER_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        return None
    if not isinstance(answer, dict) or not answer.get("Secret"):
        return None
    if answer.get("Username") == "<token>":  # the helpers' marker of an identity token
        return RegistryCredentials(source=program, identity_token=str(answer["Secret"]))
    return RegistryCredentials(
        source=program, username=str(answer.get("Username", "")), password=str(answer["Secret"])
    )


def _read_config(path: Path) -> dict | None:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def find_credentials(registry: str, repository: str) -> RegistryCredentials | None:
    """The user's credentials for ``registry`` (e.g. ``ghcr.io``, ``docker.io``,
    ``127.0.0.1:5000``) and ``repository``, or None when no auth file has any."""
    for path in auth_files():
        config = _read_config(path)
        if config is None:
            continue
        auths = config.get("auths")
        auths = auths if isinstance(auths, dict) else {}
        entry = _matching_entry(auths, registry, repository)
        credentials = _from_entry(entry, str(path)) if entry is not None else None
        if credentials is not None:
            return credentials
        helpers = config.get("credHelpers")
        helpers = helpers if isinstance(helpers, dict) else {}
        helper = helpers.get(registry) or helpers.get(normalized_registry(registry))
        helper = helper or config.get("credsStore")
        if helper:
            credentials = from_helper(str(helper), registry)
            if credentials is not None:
                return credentials
    return None
