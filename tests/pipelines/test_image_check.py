"""Does the image exist? ``pipelines.image_check`` against a real registry on loopback
(distribution's docker-registry, open and behind htpasswd), a stand-in registry with Bearer token
auth (how ghcr.io and Docker Hub answer), and the credential files of docker and podman."""

from __future__ import annotations

import base64
import json
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kfp_ddp.free_ports import free_port
from kfp_ddp.image_reference import ImageReference
from pipelines import image_check
from pipelines.image_check import (
    ImageMissing,
    ImageUnchecked,
    check_images,
    lookup,
    parse_challenge,
)
from pipelines.registry_credentials import find_credentials
from tests.containers.registry import LocalRegistry, write_oci_archive
from tests.pipelines.token_registry import TokenRegistry

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(autouse=True)
def no_registry_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No auth file of the developer's leaks in: HOME is an empty folder of the test's."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("DOCKER_CONFIG", "REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    return home


def docker_config(home: Path, auths: dict, **extra: object) -> Path:
    path = home / ".docker" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": auths, **extra}))
    return path


def basic(username: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{username}:{password}".encode()).decode()}


@pytest.fixture(scope="module")
def pushed(oci_registry: LocalRegistry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An image in the open registry (one platform) and an index beside it (two)."""
    folder = tmp_path_factory.mktemp("images")
    oci_registry.push_oci_archive(write_oci_archive(folder / "one.tar"), "kfp-ddp:0.1.0")
    multi = write_oci_archive(folder / "multi.tar", platforms=["linux/amd64", "linux/arm64"])
    oci_registry.push_oci_archive(multi, "kfp-ddp:0.1.0-multi")
    return oci_registry.image("kfp-ddp:0.1.0")


@pytest.fixture(scope="module")
def pushed_with_login(
    oci_registry_with_login: LocalRegistry, tmp_path_factory: pytest.TempPathFactory
) -> str:
    archive = write_oci_archive(tmp_path_factory.mktemp("images-login") / "one.tar")
    return oci_registry_with_login.push_oci_archive(archive, "private/kfp-ddp:0.1.0")


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("image", ["", "Not An Image", "ghcr.io/UPPER/x:1", "x:bad tag", "x@md5:1"])
def test_bad_image_names_are_refused_as_names(image: str) -> None:
    with pytest.raises(ImageMissing, match="run: ") as refused:
        check_images([image], what="run")
    assert refused.value.exit_code == 2


def test_bearer_challenge_is_parsed_whatever_the_realm_holds() -> None:
    header = 'Bearer realm="https://auth.example/token?x=y,z",service="registry.example",scope="repository:a/b:pull"'
    assert parse_challenge(header) == (
        "bearer",
        {
            "realm": "https://auth.example/token?x=y,z",
            "service": "registry.example",
            "scope": "repository:a/b:pull",
        },
    )
    assert parse_challenge('Basic realm="x"') == ("basic", {"realm": "x"})


# --- credentials ---------------------------------------------------------------------------


def test_docker_config_auths_by_registry_and_docker_hub_aliases(no_registry_credentials) -> None:
    path = docker_config(
        no_registry_credentials,
        {
            "https://index.docker.io/v1/": basic("hub-user", "hub-pass"),
            "ghcr.io": basic("gh-user", "gh:pass:with:colons"),
            "https://quay.io": {"username": "q-user", "password": "q-pass"},
        },
    )
    hub = find_credentials("docker.io", "library/python")
    assert (hub.username, hub.password, hub.source) == ("hub-user", "hub-pass", str(path))
    gh = find_credentials("ghcr.io", "kfp-ddp/kfp-ddp")
    assert (gh.username, gh.password) == ("gh-user", "gh:pass:with:colons")
    assert find_credentials("quay.io", "a/b").password == "q-pass"
    assert find_credentials("registry.example", "a") is None
    assert "gh:pass" not in repr(gh) and "gh-user" not in repr(gh)


def test_podman_auth_files_come_first_and_namespaces_match_most_specific(
    no_registry_credentials: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker_config(no_registry_credentials, {"quay.io": basic("docker", "d")})
    runtime = tmp_path / "run"
    auth = runtime / "containers" / "auth.json"
    auth.parent.mkdir(parents=True)
    auth.write_text(
        json.dumps({"auths": {"quay.io": basic("podman", "p"), "quay.io/team": basic("team", "t")}})
    )
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert find_credentials("quay.io", "other/x").username == "podman"
    assert find_credentials("quay.io", "team/x").username == "team"
    assert find_credentials("quay.io", "teams/x").username == "podman"  # a prefix is not a match
    explicit = tmp_path / "auth.json"
    explicit.write_text(json.dumps({"auths": {"quay.io": basic("explicit", "e")}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(explicit))
    found = find_credentials("quay.io", "team/x")
    assert (found.username, found.source) == ("explicit", str(explicit))


def test_a_credential_helper_is_asked(
    no_registry_credentials: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker's credential-helper protocol: the server on stdin, JSON on stdout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-fake"
    helper.write_text(
        "#!/bin/sh\nread server\n"
        'if [ "$server" = ghcr.io ]; then echo \'{"Username":"helped","Secret":"h-pass"}\'; '
        "else echo 'credentials not found' >&2; exit 1; fi\n"
    )
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    docker_config(no_registry_credentials, {"ghcr.io": {}}, credsStore="fake")
    found = find_credentials("ghcr.io", "a/b")
    assert (found.username, found.password, found.source) == (
        "helped",
        "h-pass",
        "docker-credential-fake",
    )
    assert find_credentials("quay.io", "a/b") is None


# --- a real registry ----------------------------------------------------------------------


def test_an_existing_tag_passes(pushed: str, oci_registry: LocalRegistry) -> None:
    assert lookup(ImageReference.parse(pushed)).outcome == "found"
    # a multi-platform index is found too (an OCI index is among the accepted types)
    check_images([pushed, oci_registry.image("kfp-ddp:0.1.0-multi")], what="run")


def test_a_missing_tag_is_refused_naming_the_image_and_the_fix(
    pushed: str, oci_registry: LocalRegistry
) -> None:
    missing = oci_registry.image("kfp-ddp:0.2.0")
    with pytest.raises(ImageMissing) as refused:
        check_images([pushed, missing], what="upload")
    message = refused.value.message
    assert refused.value.exit_code == 2
    assert message.startswith(f"upload: the image {missing} does not exist")
    assert "no tag '0.2.0' in kfp-ddp (HTTP 404)" in message
    assert f"make image IMAGE={missing} && docker push {missing}" in message
    assert "--image" in message
    # a repository that does not exist either
    with pytest.raises(ImageMissing, match="nothing-here"):
        check_images([oci_registry.image("nothing-here:1")], what="run")


def test_the_release_image_says_which_workflow_pushes_it(
    oci_registry: LocalRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = oci_registry.image("kfp-ddp:9.9.9")
    monkeypatch.setattr(image_check, "DEFAULT_IMAGE", release)
    monkeypatch.setattr(image_check, "RELEASE_VERSION", "9.9.9")
    with pytest.raises(ImageMissing) as refused:
        check_images([release], what="run")
    assert ".github/workflows/release.yml pushes it when tag v9.9.9 is released" in str(
        refused.value.message
    )


def test_a_registry_with_login_passes_with_the_users_credentials(
    pushed_with_login: str, oci_registry_with_login: LocalRegistry, no_registry_credentials: Path
) -> None:
    registry = oci_registry_with_login
    password = registry.password
    assert password is not None
    # no credentials: refused, saying how to log in
    with pytest.raises(ImageUnchecked) as refused:
        check_images([pushed_with_login], what="run")
    message = refused.value.message
    assert refused.value.exit_code == 1
    assert f"docker login {registry.host}" in message and f"podman login {registry.host}" in message
    assert "--skip-image-check" in message
    # the user's docker config: found
    login = {registry.host: basic(registry.username, password)}
    path = docker_config(no_registry_credentials, login)
    found = lookup(ImageReference.parse(pushed_with_login))
    assert (found.outcome, found.credentials.source) == ("found", str(path))
    check_images([pushed_with_login], what="run")
    with pytest.raises(ImageMissing):  # credentials do not make a missing tag exist
        check_images([registry.image("private/kfp-ddp:nope")], what="run")
    # wrong credentials: refused naming the file they came from, never the secrets
    docker_config(no_registry_credentials, {registry.host: basic(registry.username, "wrong-pw")})
    with pytest.raises(ImageUnchecked) as wrong:
        check_images([pushed_with_login], what="run")
    assert f"refused the credentials from {path} (HTTP 401)" in wrong.value.message
    for secret in ("wrong-pw", password, registry.username):
        assert secret not in wrong.value.message
        assert secret not in message


def test_an_unreachable_registry_is_refused_naming_the_skip_flag() -> None:
    image = f"127.0.0.1:{free_port()}/kfp-ddp:0.1.0"
    with pytest.raises(ImageUnchecked) as refused:
        check_images([image], what="schedule")
    message = refused.value.message
    assert message.startswith(f"schedule: cannot ask http://{image.split('/')[0]} whether the")
    assert "refused" in message  # connection refused
    assert "--skip-image-check" in message


def test_a_registry_that_does_not_answer_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_check, "TIMEOUT_S", 0.3)
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        image = f"127.0.0.1:{silent.getsockname()[1]}/kfp-ddp:0.1.0"
        with pytest.raises(ImageUnchecked, match=r"no answer within 0.3 s.*--skip-image-check"):
            check_images([image], what="run")


# --- Bearer token auth (ghcr.io, Docker Hub): a stand-in registry ---------------------------


@pytest.fixture
def token_registry() -> Iterator[TokenRegistry]:
    with TokenRegistry(tags={"0.1.0"}) as registry:
        yield registry


def test_an_anonymous_token_then_one_head_and_no_retry_of_a_404(
    token_registry: TokenRegistry,
) -> None:
    assert lookup(ImageReference.parse(token_registry.image("0.1.0"))).outcome == "found"
    token_registry.requests.clear()
    found = lookup(ImageReference.parse(token_registry.image("0.2.0")))
    assert found.outcome == "missing"
    sent = [(method, path.split("?")[0]) for method, path, _ in token_registry.requests]
    assert sent == [
        ("HEAD", "/v2/kfp-ddp/kfp-ddp/manifests/0.2.0"),
        ("GET", "/token"),
        ("HEAD", "/v2/kfp-ddp/kfp-ddp/manifests/0.2.0"),
    ]
    assert "Authorization" not in token_registry.requests[1][2]  # anonymous


def test_a_token_for_the_users_credentials(
    token_registry: TokenRegistry, no_registry_credentials: Path
) -> None:
    token_registry.login = ("me", "s3cret-pw")
    image = token_registry.image("0.1.0")
    with pytest.raises(ImageUnchecked, match="docker login"):
        check_images([image], what="run")
    host = token_registry.host
    path = docker_config(no_registry_credentials, {host: basic("me", "s3cret-pw")})
    check_images([image], what="run")
    docker_config(no_registry_credentials, {host: basic("me", "not-it")})
    with pytest.raises(ImageUnchecked) as refused:
        check_images([image], what="run")
    assert f"refused the credentials from {path} (its token service answered HTTP 401)" in (
        refused.value.message
    )
    assert "not-it" not in refused.value.message and "s3cret" not in refused.value.message


def test_an_identity_token_is_exchanged_like_docker_does(
    token_registry: TokenRegistry, no_registry_credentials: Path
) -> None:
    token_registry.login = ("me", "s3cret-pw")
    token_registry.refresh_token = "refresh-abc"
    host = token_registry.host
    docker_config(no_registry_credentials, {host: {"identitytoken": "refresh-abc"}})
    check_images([token_registry.image("0.1.0")], what="run")
    assert ("POST", "/token") in [(m, p) for m, p, _ in token_registry.requests]


@pytest.mark.parametrize("status", [500, 503, 429])
def test_a_registry_error_is_refused_naming_the_skip_flag(
    token_registry: TokenRegistry, status: int
) -> None:
    token_registry.status = status
    with pytest.raises(ImageUnchecked, match=rf"\(HTTP {status}\).*--skip-image-check"):
        check_images([token_registry.image("0.1.0")], what="run")
