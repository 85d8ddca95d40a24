"""The rules of single pipeline parameters: each takes the value and returns what is wrong with
it and the fix (``None``: fine). ``pipelines.parameters`` attaches one to each parameter; the
check raises ``ParameterError`` with that parameter's name, so the message names exactly it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kfp_ddp.image_reference import image_problem
from kfp_ddp.s3_uri import s3_uri_problem

Rule = Callable[[Any], "str | None"]
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def s3_uri(example: str, *, optional: bool = False) -> Rule:
    """An ``s3://bucket/prefix`` URI with a prefix of its own (``kfp_ddp.s3_uri``); '' allowed
    when ``optional``."""

    def rule(value: Any) -> str | None:
        if optional and value == "":
            return None
        problem = s3_uri_problem(value, prefix_required=True)
        if problem:
            return f"must be an s3://bucket/prefix URI ({problem}), e.g. {example}"
        return None

    return rule


def endpoint_url(value: Any) -> str | None:
    """'' (AWS, or the environment's AWS_ENDPOINT_URL_S3) or an http(s):// URL."""
    if value == "":
        return None
    if not isinstance(value, str) or not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        return "must be a URL such as https://minio.example.com:9000, or '' for AWS"
    return None


def kubernetes_name(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > 253 or not DNS1123.match(value):
        return "must be a Kubernetes object name such as s3-creds"
    return None


def fraction(fix: str, *, below_one: bool = False) -> Rule:
    """A number from 0 to 1 (below 1 with ``below_one``)."""

    def rule(value: Any) -> str | None:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not 0 <= value <= 1 or (below_one and value == 1):
            bounds = "at least 0 and below 1" if below_one else "between 0 and 1"
            return f"must be {bounds}: {fix}"
        return None

    return rule


def baseline_uri(value: Any) -> str | None:
    """'' (no baseline), latest (the model last published), a path, or an s3://bucket/key."""
    if not isinstance(value, str):
        return "write s3://bucket/key, a path, latest or ''"
    if value.startswith("s3:") and s3_uri_problem(value, prefix_required=True):
        return f"write s3://bucket/key or '' ({s3_uri_problem(value, prefix_required=True)})"
    return None


def image(value: Any) -> str | None:
    """A container image name as docker and the OCI distribution spec write it."""
    problem = image_problem(value)
    return f"must be a container image reference: {problem}" if problem else None
