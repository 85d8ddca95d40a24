"""The gate: does a model's accuracy pass the threshold and stay near a baseline's?

``load_baseline`` reads a previous model's metrics (an eval.json or summary.json, local or in S3);
``decide_gate`` gives the verdict and its reason in words.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.evaluate.errors import EPS, EvaluationError, check_fraction
from kfp_ddp.s3_uri import S3UriError, parse_s3_uri


def baseline_accuracy_of(baseline: Mapping[str, Any]) -> float:
    """The accuracy in a previous model's metrics: ``accuracy`` (eval.json) or ``val_accuracy``
    (the trainer's summary.json)."""
    if not isinstance(baseline, Mapping):
        raise EvaluationError(
            f"baseline={baseline!r} must be a metrics dict such as {{'accuracy': 0.95}}"
        )
    key = "accuracy" if "accuracy" in baseline else "val_accuracy"
    if key not in baseline:
        raise EvaluationError(
            f"baseline has no 'accuracy' (or 'val_accuracy') key; keys: {sorted(baseline)}; "
            "pass a previous eval.json or summary.json, e.g. {'accuracy': 0.95}"
        )
    value = baseline[key]
    try:
        check_fraction(f"baseline[{key!r}]", value)
    except EvaluationError as err:
        raise EvaluationError(f"{err} (it must be an accuracy)") from None
    return float(value)


def _fmt(value: float, other: float | None = None) -> str:
    """Shortest readable form (0.981, 0.97); more digits only where needed to tell two values
    apart, so a failure never reads 'accuracy 0.97 < threshold 0.97'."""
    for digits in range(3, 17):
        text = f"{value:.{digits}g}"
        if other is None or value == other or text != f"{other:.{digits}g}":
            return text
    return repr(value)


def decide_gate(
    accuracy: float,
    *,
    threshold: float = 0.0,
    baseline_accuracy: float | None = None,
    tolerance: float = 0.01,
) -> tuple[bool, str]:
    """``(passed, reason)``: accuracy >= threshold and, with a baseline, not more than
    ``tolerance`` below it."""
    check_fraction("accuracy", accuracy)
    check_fraction("threshold", threshold)
    check_fraction("tolerance", tolerance)
    meets_threshold = accuracy >= threshold - EPS
    relation = "≥" if meets_threshold else "<"
    threshold_text = (
        f"accuracy {_fmt(accuracy, threshold)} {relation} threshold {_fmt(threshold, accuracy)}"
    )
    if baseline_accuracy is None:
        return meets_threshold, f"{threshold_text} (no baseline)"
    check_fraction("baseline accuracy", baseline_accuracy)
    baseline = _fmt(baseline_accuracy, accuracy)
    drop = baseline_accuracy - accuracy
    within = drop <= tolerance + EPS
    if not within:
        baseline_text = (
            f"{_fmt(drop, tolerance)} below baseline {baseline} (tolerance {_fmt(tolerance, drop)})"
        )
    elif -drop > tolerance + EPS:
        baseline_text = f"above baseline {baseline}"
    else:
        baseline_text = f"within {_fmt(tolerance)} of baseline {baseline}"
    if meets_threshold and within:
        return True, f"{threshold_text} and {baseline_text}"
    if within:
        return False, threshold_text
    if meets_threshold:
        return False, f"accuracy {_fmt(accuracy, baseline_accuracy)} is {baseline_text}"
    return False, f"{threshold_text} and is {baseline_text}"


def load_baseline(uri: str, *, endpoint_url: str | None = None) -> dict[str, Any] | None:
    """A previous model's metrics from ``uri``: '' → None; a local JSON file; or
    ``s3://bucket/key`` (boto3 at ``endpoint_url``, else the endpoint and credentials of the
    standard AWS environment).

    A URI that names nothing is an error, not "no baseline": a typo must not open the gate.
    """
    if not uri:
        return None
    if uri.startswith("s3://"):
        raw = _read_s3(uri, endpoint_url)
    else:
        path = Path(uri)
        if not path.is_file():
            raise EvaluationError(
                f"baseline_uri={uri!r}: no such file; pass '' for no baseline, a local JSON "
                "file, or s3://bucket/key"
            )
        raw = path.read_bytes()
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EvaluationError(f"baseline_uri={uri!r} is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise EvaluationError(
            f"baseline_uri={uri!r} holds a {type(data).__name__}; expected a JSON object "
            "such as {'accuracy': 0.95}"
        )
    baseline_accuracy_of(data)  # fail here, naming the URI's content, rather than later
    return data


def _read_s3(uri: str, endpoint_url: str | None) -> bytes:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    # Here, like boto3: only a baseline in S3 needs a client.
    from components.s3_sync.connection import botocore_session

    try:
        where = parse_s3_uri(uri, prefix_required=True)
    except S3UriError as err:
        raise EvaluationError(
            f"baseline_uri={uri!r} must look like s3://bucket/key.json ({err.problem})"
        ) from None
    bucket, key = where.bucket, where.prefix
    try:
        # boto3 reads AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and the credential chain itself,
        # in a session of its own: boto3's default session keeps the credentials it found first,
        # so a process whose environment changed since (the check step in-process, tests) would
        # sign with stale keys.
        session = boto3.session.Session(botocore_session=botocore_session())
        client = session.client("s3", endpoint_url=endpoint_url or None)
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        return body.read()
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "?")
        raise EvaluationError(
            f"baseline_uri={uri!r} could not be read ({code}); check the key, the endpoint "
            "(AWS_ENDPOINT_URL_S3) and the credentials (AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY), or pass '' for no baseline"
        ) from None
    except BotoCoreError as err:
        raise EvaluationError(f"baseline_uri={uri!r} could not be read: {err}") from None
