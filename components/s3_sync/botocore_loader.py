"""botocore's data loader, made cheaper for a process that only makes S3 clients.

The same files from the same search path (``AWS_DATA_PATH``, ``~/.aws/models``, botocore's
own data) and the same models; two things cost less (an S3 client in ~50 ms instead of
~100 ms here):

- JSON objects are parsed into plain dicts (ordered, like every dict) instead of
  OrderedDicts: the S3 model, its endpoint rules and endpoints.json are ~3 MB of JSON.
- "Is there a model of service X?", which botocore asks before loading one, looks in X's
  folders only; botocore answers it by listing the folders of all ~440 services (twice per
  client: the model and the endpoint rules). The full list is still there for whoever
  iterates over it.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence

from botocore.loaders import JSONFileLoader, Loader, create_loader


def s3_loader(data_path: str | None) -> Loader:
    """The loader for ``data_path`` (botocore's ``data_path`` setting, i.e. AWS_DATA_PATH)."""
    search_paths = list(create_loader(data_path).search_paths)  # botocore's own search path
    return _Loader(
        extra_search_paths=search_paths,
        file_loader=_PlainJSONFileLoader(),
        include_default_search_paths=False,
    )


class _PlainJSONFileLoader(JSONFileLoader):
    def load_file(self, file_path):
        for extension, opener in ((".json", open), (".json.gz", gzip.open)):
            try:
                with opener(file_path + extension, "rb") as handle:
                    return json.loads(handle.read())
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                continue
        return None


class _Loader(Loader):
    def list_available_services(self, type_name):
        return _ServiceNames(self, type_name)

    def has_model(self, service_name: str, type_name: str) -> bool:
        """Whether some API version of ``service_name`` has a ``type_name`` file: botocore's
        test for one service, without looking at the others."""
        for base in self.search_paths:
            folder = os.path.join(base, service_name)
            if not os.path.isdir(folder):
                continue
            for version in os.listdir(folder):
                if self.file_loader.exists(os.path.join(folder, version, type_name)):
                    return True
        return False


class _ServiceNames(Sequence):
    """``list_available_services``'s answer: ``name in it`` asks ``has_model``; anything else
    gets botocore's full, sorted list."""

    def __init__(self, loader: _Loader, type_name: str) -> None:
        self._loader = loader
        self._type_name = type_name
        self._all: list[str] | None = None

    def __contains__(self, service_name: object) -> bool:
        return isinstance(service_name, str) and self._loader.has_model(
            service_name, self._type_name
        )

    def _names(self) -> list[str]:
        if self._all is None:
            self._all = Loader.list_available_services(self._loader, self._type_name)
        return self._all

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())
