"""The latest.json pointer: written after the model is complete, moved only from the model the
run was compared with; of two runs publishing at once the later one is refused."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pipelines.latest_model import Pointer, move_pointer, new_pointer, read_pointer
from pipelines.publish import publish_model


def _pointer(run: str, uri: str) -> Pointer:
    return new_pointer(
        run_id=run, uri=f"{uri}/{run}/", evaluation={"accuracy": 0.9}, data_digest="d"
    )


def test_the_first_model_is_pointed_at_and_the_next_moves_the_pointer_from_it(s3):
    uri = f"s3://{s3.create_bucket('latest-pointer')}/models"
    assert read_pointer(uri) is None
    moved, said = move_pointer(uri, _pointer("run-1", uri), seen_run="")
    assert (
        moved and said == f"{uri}/latest.json now names run run-1 (the first model published there)"
    )
    first = read_pointer(uri)
    assert first is not None and first.run_id == "run-1" and first.uri == f"{uri}/run-1/"
    assert first.accuracy == 0.9 and first.eval_uri == f"{uri}/run-1/eval.json"
    moved, said = move_pointer(uri, _pointer("run-2", uri), seen_run="run-1")
    assert moved and said.endswith("now names run run-2 (was run run-1)")


def test_a_run_that_was_compared_with_an_older_model_is_refused(s3):
    uri = f"s3://{s3.create_bucket('latest-pointer')}/stale"
    move_pointer(uri, _pointer("run-1", uri), seen_run="")
    move_pointer(uri, _pointer("run-2", uri), seen_run="run-1")  # published meanwhile
    moved, said = move_pointer(uri, _pointer("run-3", uri), seen_run="run-1")
    assert not moved
    assert said.startswith(f"{uri}/latest.json left naming run run-2: it named run run-1 when")
    assert f"run run-3's model stays in {uri}/run-3/" in said
    assert read_pointer(uri).run_id == "run-2"


def _race(uri: str, runs: list[str], seen_run: str) -> dict[str, bool]:
    """Each of ``runs`` moves the pointer at the same moment; which ones moved it."""
    start = threading.Barrier(len(runs))
    results: dict[str, bool] = {}

    def publish(run: str) -> None:
        start.wait()
        results[run] = move_pointer(uri, _pointer(run, uri), seen_run=seen_run)[0]

    threads = [threading.Thread(target=publish, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_of_two_runs_publishing_at_once_exactly_one_moves_the_pointer(s3):
    uri = f"s3://{s3.create_bucket('latest-pointer')}/race"
    for round_ in range(5):
        seen = read_pointer(uri)
        results = _race(uri, [f"r{round_}-a", f"r{round_}-b"], seen.run_id if seen else "")
        winners = [run for run, moved in results.items() if moved]
        assert len(winners) == 1, results
        assert read_pointer(uri).run_id == winners[0]


def test_publish_uploads_the_model_before_it_points_at_it(s3, tmp_path: Path, capsys):
    uri = f"s3://{s3.create_bucket('latest-pointer')}/publish"
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.pt").write_bytes(b"w")
    (model / "model.json").write_text("{}")
    published = publish_model(
        str(model),
        str(tmp_path / "none.html"),
        evaluation={"accuracy": 0.8},
        publish_uri=uri,
        run_id="run-a",
        latest_run="",
        data_digest="abc",
    )
    pointer = read_pointer(uri)
    assert pointer is not None and pointer.uri == published and pointer.data_digest == "abc"
    client = s3.client()
    keys = [
        o["Key"]
        for o in client.list_objects_v2(Bucket="latest-pointer", Prefix="publish/run-a/")[
            "Contents"
        ]
    ]
    assert sorted(keys) == [
        "publish/run-a/eval.json",
        "publish/run-a/model.json",
        "publish/run-a/weights.pt",
    ]
    assert "latest: " in capsys.readouterr().out
    # A model whose files cannot be staged is not published, and the pointer does not move.
    with pytest.raises(FileNotFoundError):
        publish_model(
            str(tmp_path / "missing"),
            "",
            evaluation={},
            publish_uri=uri,
            run_id="run-b",
            latest_run="run-a",
        )
    assert read_pointer(uri).run_id == "run-a"
    body = client.get_object(Bucket="latest-pointer", Key="publish/latest.json")["Body"].read()
    assert json.loads(body)["run_id"] == "run-a"
