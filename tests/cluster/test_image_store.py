"""What the real node's image store keeps between sessions (tests/cluster/image_store.py): only
the IDs of the images the session pulled. Its use on the node is in the node's own tests."""

from __future__ import annotations

from tests.cluster.image_store import images_to_forget

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
PULLED = "sha256:4bc138385e7328123bf21e90e129ea070f4c5742965c08fe71c5ede13b5887f3"
OLDER = "sha256:" + "1e" * 32  # an image of an earlier session
MANAGED = "linux/amd64 io.cri-containerd.image=managed"


def _listing(*rows: tuple[str, str]) -> str:
    """``ctr images ls``'s table (its SIZE holds a space)."""
    header = "REF TYPE DIGEST SIZE PLATFORMS LABELS"
    return "\n".join([header, *(f"{ref} {MANIFEST} {d} 579.3 MiB {MANAGED}" for ref, d in rows)])


def test_every_name_goes_and_only_the_ids_of_images_pulled_this_session_stay():
    listing = _listing(
        ("127.0.0.1:40401/kfp-ddp:0.1.0-cpu", PULLED),  # this session's names
        (f"127.0.0.1:40401/kfp-ddp@{PULLED}", PULLED),
        ("sha256:ecbff3fae8521b498886c9569c6f9b655a1d8f00fb37e5584f8f525a57d9bfeb", PULLED),
        ("sha256:97c4aa6088de254aa8ada10f6d3b672ca3ada5d85cf4bcdc987cc7764122115f", OLDER),
    )
    assert images_to_forget(listing) == [
        "127.0.0.1:40401/kfp-ddp:0.1.0-cpu",
        f"127.0.0.1:40401/kfp-ddp@{PULLED}",
        "sha256:97c4aa6088de254aa8ada10f6d3b672ca3ada5d85cf4bcdc987cc7764122115f",
    ]


def test_an_empty_store_forgets_nothing():
    assert images_to_forget(_listing()) == []
    assert images_to_forget("") == []
