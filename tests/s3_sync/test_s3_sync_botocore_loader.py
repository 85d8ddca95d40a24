"""The S3 sync's botocore data loader loads what botocore's loader loads, from the same places."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import UnknownServiceError
from botocore.loaders import Loader

from components.s3_sync.botocore_loader import s3_loader


def test_same_models_as_botocore():
    ours, botocores = s3_loader(None), Loader()
    for type_name in ("service-2", "endpoint-rule-set-1"):
        assert ours.load_service_model("s3", type_name) == botocores.load_service_model(
            "s3", type_name
        )
    assert ours.load_data("endpoints") == botocores.load_data("endpoints")


def test_service_names_answer_like_botocore():
    names = s3_loader(None).list_available_services("service-2")
    assert "s3" in names and "sts" in names and "no-such-service" not in names
    assert list(names) == Loader().list_available_services("service-2")
    with pytest.raises(UnknownServiceError):
        s3_loader(None).load_service_model("no-such-service", "service-2")


def test_aws_data_path_is_searched_first(tmp_path):
    model = {"version": "2.0", "metadata": {"apiVersion": "2020-01-01"}, "operations": {}}
    folder = tmp_path / "my-service" / "2020-01-01"
    folder.mkdir(parents=True)
    (folder / "service-2.json").write_text(json.dumps(model))
    loader = s3_loader(str(tmp_path))
    assert "my-service" in loader.list_available_services("service-2")
    assert loader.load_service_model("my-service", "service-2") == model
