"""Image names: split the way docker splits them, refused the way a container runtime would
refuse them, with words that say which part is wrong."""

import pytest

from kfp_ddp.image_reference import ImageReference, image_problem

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "registry", "repository", "reference", "endpoint"),
    [
        ("ghcr.io/kfp-ddp/kfp-ddp:0.1.0", "ghcr.io", "kfp-ddp/kfp-ddp", "0.1.0", "https://ghcr.io"),
        ("python", "docker.io", "library/python", "latest", "https://registry-1.docker.io"),
        ("docker.io/python:3.11", "docker.io", "library/python", "3.11", "https://registry-1.docker.io"),
        ("index.docker.io/me/ddp:1", "index.docker.io", "me/ddp", "1", "https://registry-1.docker.io"),
        ("me/ddp:1", "docker.io", "me/ddp", "1", "https://registry-1.docker.io"),
        ("localhost:5000/a/b:c", "localhost:5000", "a/b", "c", "http://localhost:5000"),
        ("localhost/kfp-ddp:1", "localhost", "kfp-ddp", "1", "http://localhost"),
        (f"127.0.0.1:5000/x@{DIGEST}", "127.0.0.1:5000", "x", DIGEST, "http://127.0.0.1:5000"),
        ("[::1]:5000/x:1", "[::1]:5000", "x", "1", "http://[::1]:5000"),
        ("registry.example:5000/team/ddp:1", "registry.example:5000", "team/ddp", "1",
         "https://registry.example:5000"),
    ],
)  # fmt: skip
def test_image_names_split_like_docker(
    image: str, registry: str, repository: str, reference: str, endpoint: str
) -> None:
    ref = ImageReference.parse(image)
    assert (ref.registry, ref.repository, ref.reference, ref.endpoint) == (
        registry,
        repository,
        reference,
        endpoint,
    )
    assert ref.manifest_url == f"{endpoint}/v2/{repository}/manifests/{reference}"


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ("Registry.Example.com/Team/KFP-DDP:V1", "repository paths are lowercase"),
        ("ghcr.io/UPPER/x:1", "repository paths are lowercase"),
        ("", "empty"),
        (" ghcr.io/a/b:1", "white space"),
        ("Not An Image", "white space"),
        ("x:bad tag", "white space"),
        ("x:-bad", "is not a tag"),
        ("x:" + "t" * 129, "is not a tag"),
        ("x@md5:1", "is not a digest"),
        ("ghcr.io//x:1", "is not a repository path"),
        ("bad_host.io/x:1", "is not a registry host"),
        ("ghcr.io:port/x:1", "is not a registry host"),
        ("x/", "is not a repository path"),
    ],
)
def test_names_a_runtime_would_refuse_are_refused_saying_which_part(image: str, words: str):
    with pytest.raises(ValueError, match=words):
        ImageReference.parse(image)
    assert words in (image_problem(image) or "")


@pytest.mark.parametrize(
    "image",
    [
        "REGISTRY.example.com/team/kfp-ddp:V1",  # a host is any case, a tag too
        "localhost/kfp-ddp:0.2.0-cpu",
        "a__b/c--d/e.f_g:1",
        f"ghcr.io/x/y:1@{DIGEST}",
    ],
)
def test_names_a_runtime_accepts_are_accepted(image: str):
    assert image_problem(image) is None
