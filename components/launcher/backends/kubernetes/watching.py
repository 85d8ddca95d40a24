"""Watches as Kubernetes clients do them (an informer's list-then-watch), for the job and its pods.

``ResumableWatch.events(timeout_s)`` is one watch request. The first lists the objects (each
reported ``ADDED``) and watches from the list's ``resourceVersion``; each later request continues
from the last version seen, so nothing is missed or replayed between requests. When the server
answers ``410 Gone`` (that version was compacted away: the gap was too long or the cluster too
busy), the next request lists again, and objects that vanished in the gap are reported
``DELETED`` with their last known state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

Event = tuple[str, Any]
"""(``ADDED`` | ``MODIFIED`` | ``DELETED``, the object: a client model or a dict)."""


def _metadata(obj: Any) -> tuple[str, str | None]:
    """(name, uid) of a client model or a dict."""
    if isinstance(obj, dict):
        metadata = obj.get("metadata") or {}
        return metadata.get("name", ""), metadata.get("uid")
    return obj.metadata.name, obj.metadata.uid


def _list_version(listed: Any) -> str | None:
    if isinstance(listed, dict):
        return (listed.get("metadata") or {}).get("resourceVersion")
    return listed.metadata.resource_version


def _items(listed: Any) -> list[Any]:
    return listed.get("items", []) if isinstance(listed, dict) else list(listed.items or [])


def _watch_decoding_as(list_call: Callable[..., Any]) -> Any:
    """A ``Watch`` that decodes its events with the client of ``list_call``'s API object (a
    ``ModelApiClient``, clients.py), not with the default client a ``Watch`` makes itself."""
    from kubernetes import watch

    stream = watch.Watch()
    api_client = getattr(getattr(list_call, "__self__", None), "api_client", None)
    if api_client is not None:
        stream._api_client = api_client  # what Watch.unmarshal_event decodes with
    return stream


@dataclass
class ResumableWatch:
    """A watch of ``list_call(*args, **kwargs)`` (a ``kubernetes`` client list method)."""

    list_call: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    note: Callable[[str], None]
    what: str
    """What is watched, for the notes (``pod``, ``job``)."""
    stream: Any = None
    """The ``kubernetes.watch.Watch`` of every request (made by the first)."""
    version: str | None = None
    """The resourceVersion to continue from (None: list first)."""
    known: dict[str, Any] = field(default_factory=dict)
    """Name → the last state seen of each object that exists."""

    def events(self, timeout_s: int) -> Iterator[Event]:
        """The events of one watch request of at most ``timeout_s`` seconds."""
        from kubernetes.client.rest import ApiException

        if self.version is None:
            yield from self._relist()
        if self.stream is None:
            self.stream = _watch_decoding_as(self.list_call)
        stream = self.stream
        try:
            for event in stream.stream(
                self.list_call,
                *self.args,
                resource_version=self.version,
                timeout_seconds=timeout_s,
                **self.kwargs,
            ):
                kind, obj = event["type"], event["object"]
                self.version = stream.resource_version or self.version
                name, _ = _metadata(obj)
                if kind == "DELETED":
                    self.known.pop(name, None)
                else:
                    self.known[name] = obj
                yield kind, obj
        except ApiException as exc:
            if exc.status != 410:
                raise
            self.note(
                f"{self.what} watch expired (410 Gone: resourceVersion {self.version} is no "
                "longer kept); listing again"
            )
            self.version = None

    def _relist(self) -> Iterator[Event]:
        listed = self.list_call(*self.args, **self.kwargs)
        items = {_metadata(obj)[0]: obj for obj in _items(listed)}
        for name, last in list(self.known.items()):
            # Gone in the gap, or replaced by an object of the same name (another uid).
            if name not in items or _metadata(items[name])[1] != _metadata(last)[1]:
                del self.known[name]
                yield "DELETED", last
        for name, obj in items.items():
            kind = "MODIFIED" if name in self.known else "ADDED"
            self.known[name] = obj
            yield kind, obj
        self.version = _list_version(listed)
