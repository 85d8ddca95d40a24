"""The model a pipeline published last: the pointer ``<publish_uri>/latest.json``.

Continuous training: a scheduled run with ``init_from=latest`` starts from the model the pointer
names, and with ``baseline_uri=latest`` publishes only a model that beats it. The pointer:

- is written by the publish step **after** the model's folder ``<publish_uri>/<run id>/`` is
  complete (the verified sync has returned), in one PUT: a reader sees the old pointer or the
  new one, never a pointer to a model still uploading;
- holds ``run_id``, ``uri`` (the model folder), ``accuracy``, ``data_digest`` and
  ``published_at``;
- moves only from the model the run was compared with. The check step of a run with
  ``init_from=latest`` or ``baseline_uri=latest`` reads the pointer at the run's start
  (``latest_run``: the run id it names, or ''), and the publish step moves it with a
  conditional PUT (``If-Match`` its ETag; ``If-None-Match: *`` when there was none). When
  another run published in between, the later of the two **is refused**: its model stays in its
  own folder, the pointer keeps naming the other run's, and the step says so. A model is never
  made "latest" without having been gated against the model it replaces. A run that uses
  neither ``latest`` was compared with no earlier model: its model becomes the latest
  whatever was published meanwhile (``ANY_RUN``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from kfp_ddp.s3_uri import parse_s3_uri

POINTER_NAME = "latest.json"
LATEST = "latest"
"""The value of ``init_from`` and ``baseline_uri`` that means "the model the pointer names"."""
ANY_RUN = "*"
"""``seen_run`` of a run that was not compared with the latest model (neither setting was
``latest``): it moves the pointer whatever it names."""


class PointerError(RuntimeError):
    """The pointer could not be read or written (not: there is none yet)."""


@dataclass(frozen=True)
class Pointer:
    """What ``latest.json`` says."""

    run_id: str
    uri: str
    """The model folder, ``<publish_uri>/<run id>/`` (weights.pt, model.json, eval.json)."""
    accuracy: float | None
    data_digest: str
    published_at: str
    etag: str = ""
    """The object's ETag when read (not stored in it)."""

    @property
    def eval_uri(self) -> str:
        """The model's evaluation (what ``baseline_uri=latest`` gates against)."""
        return f"{self.uri.rstrip('/')}/eval.json"

    def to_json(self) -> bytes:
        data = {k: v for k, v in asdict(self).items() if k != "etag"}
        return json.dumps(data, indent=2, sort_keys=True).encode()


def pointer_uri(publish_uri: str) -> str:
    return f"{publish_uri.rstrip('/')}/{POINTER_NAME}"


def _where(publish_uri: str) -> tuple[str, str]:
    """(bucket, key) of the pointer (``publish_uri`` is checked by the parameter rules)."""
    where = parse_s3_uri(publish_uri)
    return where.bucket, f"{where.prefix}/{POINTER_NAME}" if where.prefix else POINTER_NAME


def _client(endpoint_url: str | None) -> Any:
    import boto3

    # Here, like boto3: only the steps that read or move the pointer make a client.
    from components.s3_sync.connection import botocore_session

    # A session of its own: boto3's default one keeps the credentials it found first. Its data
    # loader is the process's (the parsed S3 model: ~70 ms of CPU less a client).
    session = boto3.session.Session(botocore_session=botocore_session())
    return session.client("s3", endpoint_url=endpoint_url or None)


def read_pointer(publish_uri: str, *, endpoint_url: str | None = None) -> Pointer | None:
    """The pointer under ``publish_uri``; None when nothing was published there yet."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _where(publish_uri)
    try:
        answer = _client(endpoint_url).get_object(Bucket=bucket, Key=key)
        raw = answer["Body"].read()
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "?")
        if code in ("NoSuchKey", "404"):
            return None
        raise PointerError(f"{pointer_uri(publish_uri)} could not be read ({code})") from None
    except BotoCoreError as err:
        raise PointerError(f"{pointer_uri(publish_uri)} could not be read: {err}") from None
    try:
        data = json.loads(raw)
        return Pointer(
            run_id=str(data["run_id"]),
            uri=str(data["uri"]),
            accuracy=data.get("accuracy"),
            data_digest=str(data.get("data_digest", "")),
            published_at=str(data.get("published_at", "")),
            etag=answer.get("ETag", ""),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise PointerError(
            f"{pointer_uri(publish_uri)} is not a pointer this pipeline wrote ({err}); delete "
            "it, or publish elsewhere"
        ) from None


def new_pointer(*, run_id: str, uri: str, evaluation: Any, data_digest: str) -> Pointer:
    """The pointer to a model just published."""
    accuracy = evaluation.get("accuracy") if isinstance(evaluation, dict) else None
    return Pointer(
        run_id=run_id,
        uri=uri,
        accuracy=accuracy if isinstance(accuracy, int | float) else None,
        data_digest=data_digest,
        published_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def move_pointer(
    publish_uri: str, new: Pointer, *, seen_run: str, endpoint_url: str | None = None
) -> tuple[bool, str]:
    """Point ``publish_uri``'s pointer at ``new`` if it still names ``seen_run`` (the run id
    it named when this run started; '' for none; ``ANY_RUN``: whatever it names).
    (moved, what happened, in one line)."""
    from botocore.exceptions import ClientError

    current = read_pointer(publish_uri, endpoint_url=endpoint_url)
    now = current.run_id if current else ""
    if seen_run != ANY_RUN and now != seen_run:
        return False, _refused(publish_uri, new, current, seen_run)
    bucket, key = _where(publish_uri)
    condition: dict[str, str] = {}
    if seen_run != ANY_RUN:
        condition = {"IfMatch": current.etag} if current else {"IfNoneMatch": "*"}
    try:
        _client(endpoint_url).put_object(
            Bucket=bucket,
            Key=key,
            Body=new.to_json(),
            ContentType="application/json",
            **condition,
        )
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "?")
        if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
            latest = read_pointer(publish_uri, endpoint_url=endpoint_url)
            return False, _refused(publish_uri, new, latest, seen_run)
        raise PointerError(f"{pointer_uri(publish_uri)} could not be written ({code})") from None
    was = f" (was run {now})" if now else " (the first model published there)"
    return True, f"{pointer_uri(publish_uri)} now names run {new.run_id}{was}"


def _refused(publish_uri: str, new: Pointer, current: Pointer | None, seen_run: str) -> str:
    other = f"run {current.run_id}" if current else "no model"
    seen = f"run {seen_run}" if seen_run else "no model"
    return (
        f"{pointer_uri(publish_uri)} left naming {other}: it named {seen} when this run "
        f"started, so another run published meanwhile and this run's model was not compared "
        f"with it; run {new.run_id}'s model stays in {new.uri} (give it as baseline_uri or "
        "init_from to use it)"
    )
