"""The ``crt`` engine: the AWS CRT S3 client (``awscrt.s3``). Its native event loops sign, send,
retry (exponential backoff, the connection's attempts) and split objects into parallel ranged
GETs / multipart PUTs; bodies come to Python in order.

Per object Python only builds a small HTTP request (``S3Connection.crt_request``: the bucket's
address as botocore resolves it) and receives the body.
"""

from __future__ import annotations

import base64
import sys
import threading
from concurrent import futures
from concurrent.futures import Future
from typing import Any

from components.s3_sync.connection import S3Connection
from components.s3_sync.engine import IN_MEMORY_MAX, PART_SIZE, OnBytes, OnDownloaded
from components.s3_sync.hashing import ETag, is_md5_etag, multipart_candidates
from components.s3_sync.streamed_file import StreamedFile

_SHUTDOWN_WAIT_S = 30
_THIS_THREAD = threading.local()


def keep_thread_state() -> None:
    """Keep the Python thread state of the CRT thread that calls this (from a callback) for
    the thread's life.

    awscrt calls into Python from its event-loop threads, 4 times per GET (headers, body, done,
    shutdown), each time between PyGILState_Ensure and PyGILState_Release; on a thread that
    Python did not start, CPython then creates a thread state (with a 16 KiB frame stack: an
    mmap, and a munmap that interrupts the other CPUs to flush their TLBs) and deletes it again
    every time. That was ~15% of a small-file download's CPU. One Ensure more, never released,
    keeps the state alive (pybind11's ``gil_scoped_acquire::inc_ref`` does the same). Only on
    the event loops of a process that declared them its own
    (``connection.use_process_event_loops``): they live as long as the process, and CPython
    deletes the states at exit. Elsewhere than CPython this does nothing."""
    if getattr(_THIS_THREAD, "kept", False):
        return
    _THIS_THREAD.kept = True  # stored in this very thread state, which now stays
    ensure = _gilstate_ensure()
    if ensure is not None:
        ensure()


def _gilstate_ensure():
    if sys.implementation.name != "cpython":
        return None
    import ctypes

    return ctypes.pythonapi.PyGILState_Ensure  # called with the GIL held (a PyDLL function)


class CrtEngine:
    name = "crt"

    def __init__(self, conn: S3Connection, *, max_concurrency: int) -> None:
        from awscrt.s3 import S3ChecksumAlgorithm, S3ChecksumConfig, S3ChecksumLocation

        self.conn = conn
        self.client = conn.crt()
        self.keep_thread_states = conn.process_event_loops
        self._lock = threading.Lock()
        self._inflight: dict[object, Any] = {}  # request task -> its S3Request (until done)
        self._get_checksums = S3ChecksumConfig(validate_response=True)
        self._put_checksums = S3ChecksumConfig(
            algorithm=S3ChecksumAlgorithm.CRC32, location=S3ChecksumLocation.TRAILER
        )

    def download(
        self,
        bucket: str,
        key: str,
        size: int,
        etag: str,
        temp_path: str,
        on_bytes: OnBytes,
        done: OnDownloaded,
    ) -> None:
        """Start fetching one object; see ``engine.OnDownloaded`` for ``done``. Verifying the
        bytes is the caller's job."""
        from awscrt.s3 import S3RequestType

        if size <= IN_MEMORY_MAX and is_md5_etag(etag):
            # The caller checks these bytes against the listed ETag, their MD5: that one check
            # covers integrity and "same version as listed", so no If-Match/checksum round (on
            # SeaweedFS they cost the server ~30% more per GET). A plain request (DEFAULT), not
            # the CRT's GET_OBJECT machinery with its part-size buffer per object.
            task = _Download(self, size, on_bytes, done, stream=None)
            kind = S3RequestType.DEFAULT
            request = self.conn.crt_request("GET", bucket, key)
            extra: dict[str, Any] = {}
        else:
            headers = [("x-amz-checksum-mode", "ENABLED")]
            if etag:  # the bytes of the version we listed, or a clean 412
                headers.append(("If-Match", f'"{etag}"'))
            stream = None if size <= IN_MEMORY_MAX else _stream(temp_path, size, etag, on_bytes)
            task = _Download(self, size, on_bytes, done, stream=stream)
            kind = S3RequestType.GET_OBJECT  # parallel ranged GETs for big objects
            request = self.conn.crt_request("GET", bucket, key, headers)
            extra = {"checksum_config": self._get_checksums}
        try:
            meta = self.client.make_request(
                type=kind,
                request=request,
                operation_name="GetObject",
                on_body=task.on_body,
                on_done=task.on_done,
                **extra,
            )
        except BaseException:
            if task.stream is not None:
                task.stream.close(None)
            raise
        self._track(task, meta)

    def upload(
        self, path: str, bucket: str, key: str, size: int, md5: str, on_bytes: OnBytes
    ) -> Future:
        from awscrt.s3 import S3RequestType

        headers = [("Content-Length", str(size)), ("Content-Type", "application/octet-stream")]
        single = size < PART_SIZE
        if single:  # one PUT: the server also checks the whole body's MD5
            headers.append(("Content-MD5", base64.b64encode(bytes.fromhex(md5)).decode()))
        meta = self.client.make_request(
            type=S3RequestType.PUT_OBJECT,
            request=self.conn.crt_request("PUT", bucket, key, headers),
            operation_name="PutObject",
            send_filepath=path,
            checksum_config=self._put_checksums,
            on_progress=None if single else on_bytes,
        )
        task = _Upload(self, on_bytes, size if single else 0)
        self._track(task, meta)
        meta.finished_future.add_done_callback(task.on_done)
        return task.future

    def _track(self, task: _Request, meta) -> None:
        """Keep ``meta`` referenced until it finishes (and cancellable on shutdown). Not under
        the lock during ``make_request``: its callback may already be running."""
        with self._lock:
            if not task.ended:
                self._inflight[task] = meta

    def _untrack(self, task: _Request) -> None:
        with self._lock:
            self._inflight.pop(task, None)
            task.ended = True

    def shutdown(self, *, cancel: bool = False) -> None:
        with self._lock:
            inflight = list(self._inflight.values())
        for meta in inflight:
            if cancel:
                meta.cancel()
        # wait(), not result(): result() raises a failed request's error, and the traceback it
        # gets (this frame, holding the requests) stays in the request's own future, a cycle
        # through the CRT that keeps the request, its client and their threads for good
        futures.wait([meta.finished_future for meta in inflight], timeout=_SHUTDOWN_WAIT_S)
        self.client = None  # the connection's close ends it, even if a traceback holds us


def _stream(temp_path: str, size: int, etag: str, on_bytes: OnBytes) -> StreamedFile:
    """The temp file a big body is written to and hashed on the way, so it is never read back
    (recv_filepath would also cost 3x the system time). A multipart ETag is hashed with the
    likeliest part size for its part count; if that was not it, the caller asks S3."""
    parsed = ETag.parse(etag)
    parts = parsed.parts if parsed is not None else None
    multipart = parts is not None
    part_size = None
    if parts is not None:
        likely = multipart_candidates(size, parts)
        part_size = likely[0] if likely else None
    return StreamedFile(temp_path, part_size, multipart=multipart, on_bytes=on_bytes)


class _Request:
    """A request in flight; ``ended`` once its callback ran (see ``CrtEngine._track``)."""

    ended = False


class _Download(_Request):
    """One GET: where its body goes (memory or a StreamedFile) and whom to tell at the end."""

    def __init__(
        self,
        engine: CrtEngine,
        size: int,
        on_bytes: OnBytes,
        done: OnDownloaded,
        *,
        stream: StreamedFile | None,
    ) -> None:
        self.engine = engine
        self.size = size
        self.on_bytes = on_bytes
        self.done = done
        self.stream = stream
        self.chunks: list[bytes] = []

    def on_body(self, chunk, offset: int, **_) -> None:
        """The CRT's on_body (a transfer thread). No bound method of ``self`` is stored on
        ``self``: a task is no reference cycle and goes as soon as it is done, not at the next
        garbage collection."""
        if self.engine.keep_thread_states:
            keep_thread_state()
        if self.stream is not None:
            self.stream.write(chunk, offset)
        else:
            self.chunks.append(bytes(chunk))

    def on_done(self, *, error=None, **_) -> None:
        """The CRT's on_done (a transfer thread)."""
        if self.engine.keep_thread_states:
            keep_thread_state()
        self.engine._untrack(self)
        if self.stream is not None:
            error = self.stream.close(error)
        if error is not None:
            self.done(None, error)
        elif self.stream is not None:  # counted its bytes as they came
            self.done(self.stream, None)
        else:
            self.on_bytes(self.size)
            self.done(b"".join(self.chunks), None)


class _Upload(_Request):
    """One PUT; ``future`` resolves when it is done."""

    def __init__(self, engine: CrtEngine, on_bytes: OnBytes, size_when_done: int) -> None:
        self.engine = engine
        self.on_bytes = on_bytes
        self.size_when_done = size_when_done
        self.future: Future = Future()

    def on_done(self, crt_future) -> None:
        """The finished future's callback (a transfer thread)."""
        if self.engine.keep_thread_states:
            keep_thread_state()
        self.engine._untrack(self)
        exc = crt_future.exception()
        if exc is not None:
            self.future.set_exception(exc)
            return
        if self.size_when_done:
            self.on_bytes(self.size_when_done)
        self.future.set_result(None)
