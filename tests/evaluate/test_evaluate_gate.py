"""The pass/fail gate: threshold, baseline, tolerance, the reason string, and baseline loading."""

from __future__ import annotations

import json

import pytest

from components.evaluate import EvaluationError, decide_gate, evaluate, load_baseline


@pytest.mark.parametrize(
    ("accuracy", "threshold", "baseline", "tolerance", "passed", "reason"),
    [
        (0.981, 0.97, 0.975, 0.01, True,
         "accuracy 0.981 ≥ threshold 0.97 and within 0.01 of baseline 0.975"),
        (0.99, 0.5, 0.8, 0.01, True, "accuracy 0.99 ≥ threshold 0.5 and above baseline 0.8"),
        (0.9, 0.97, None, 0.01, False, "accuracy 0.9 < threshold 0.97 (no baseline)"),
        (0.97, 0.97, None, 0.01, True, "accuracy 0.97 ≥ threshold 0.97 (no baseline)"),
        # Digits are added until the two numbers differ: never "0.97 < threshold 0.97".
        (0.9699, 0.97, None, 0.01, False, "accuracy 0.9699 < threshold 0.97 (no baseline)"),
        (0.94, 0.9, 0.975, 0.01, False,
         "accuracy 0.94 is 0.035 below baseline 0.975 (tolerance 0.01)"),
        (0.9, 0.97, 0.975, 0.01, False,
         "accuracy 0.9 < threshold 0.97 and is 0.075 below baseline 0.975 (tolerance 0.01)"),
        # Exactly at the tolerance passes although 0.97 - 0.96 > 0.01 in binary floating point.
        (0.96, 0.0, 0.97, 0.01, True,
         "accuracy 0.96 ≥ threshold 0 and within 0.01 of baseline 0.97"),
        (0.95, 0.0, 0.97, 0.0, False, "accuracy 0.95 is 0.02 below baseline 0.97 (tolerance 0)"),
    ],
)  # fmt: skip
def test_gate_decision_and_reason(accuracy, threshold, baseline, tolerance, passed, reason):
    assert decide_gate(
        accuracy, threshold=threshold, baseline_accuracy=baseline, tolerance=tolerance
    ) == (passed, reason)


def test_gate_checks_its_arguments():
    with pytest.raises(EvaluationError, match=r"threshold=-0\.5 is out of range"):
        decide_gate(0.5, threshold=-0.5)
    with pytest.raises(EvaluationError, match=r"baseline accuracy=1\.2 is out of range"):
        decide_gate(0.5, baseline_accuracy=1.2)


def test_evaluate_applies_threshold_and_baseline(colour_model, colour_data):
    # The colour model scores 0.4 on its data (see test_evaluate_scoring).
    passing = evaluate(
        colour_model, colour_data, device="cpu", threshold=0.3, baseline={"accuracy": 0.41}
    )
    assert passing.passed
    assert passing.reason == "accuracy 0.4 ≥ threshold 0.3 and within 0.01 of baseline 0.41"
    assert passing.baseline_accuracy == 0.41

    # The trainer's summary.json works as a baseline too (val_accuracy).
    failing = evaluate(colour_model, colour_data, device="cpu", baseline={"val_accuracy": 0.5})
    assert not failing.passed
    assert failing.reason == "accuracy 0.4 is 0.1 below baseline 0.5 (tolerance 0.01)"
    assert failing.scalar_metrics()["passed"] == 0.0


def test_load_baseline_from_a_local_file(tmp_path):
    assert load_baseline("") is None
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"accuracy": 0.93, "loss": 0.2}))
    assert load_baseline(str(path)) == {"accuracy": 0.93, "loss": 0.2}


def test_load_baseline_errors_name_the_uri_and_the_fix(tmp_path):
    # A missing baseline must not silently open the gate.
    with pytest.raises(EvaluationError, match=r"no such file; pass '' for no baseline"):
        load_baseline(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(EvaluationError, match=r"bad\.json' is not JSON"):
        load_baseline(str(bad))
    bad.write_text("[0.9]")
    with pytest.raises(EvaluationError, match=r"holds a list; expected a JSON object"):
        load_baseline(str(bad))
    bad.write_text('{"loss": 0.1}')
    with pytest.raises(EvaluationError, match=r"no 'accuracy' \(or 'val_accuracy'\) key"):
        load_baseline(str(bad))
    with pytest.raises(EvaluationError, match=r"must look like s3://bucket/key"):
        load_baseline("s3://bucket-only")


def test_load_baseline_from_s3(tmp_path, monkeypatch):
    from kfp_ddp.local_s3 import LocalS3Server

    with LocalS3Server() as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        bucket = s3.create_bucket("models")
        s3.client().put_object(
            Bucket=bucket, Key="run-1/eval.json", Body=json.dumps({"accuracy": 0.88}).encode()
        )

        assert load_baseline(f"s3://{bucket}/run-1/eval.json") == {"accuracy": 0.88}
        with pytest.raises(EvaluationError) as err:
            load_baseline(f"s3://{bucket}/run-2/eval.json")
        assert "could not be read (NoSuchKey)" in str(err.value)
        assert s3.secret_key not in str(err.value)


def test_load_baseline_reads_the_credentials_of_now(s3_server, monkeypatch):
    """boto3's default session keeps the first credentials it found: a process whose
    environment changed since (the check step run in-process, a test after another server's)
    must still sign with the keys it has now."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "STALEKEY00000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "stale-secret")
    boto3.setup_default_session()
    assert boto3.DEFAULT_SESSION.get_credentials().access_key == "STALEKEY00000000"
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.create_bucket("baseline-now")
    s3_server.client().put_object(Bucket=bucket, Key="eval.json", Body=b'{"accuracy": 0.5}')
    try:
        assert load_baseline(f"s3://{bucket}/eval.json") == {"accuracy": 0.5}
    finally:
        boto3.DEFAULT_SESSION = None
