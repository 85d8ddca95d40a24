"""Seconds of training lost per checkpoint: the blocking writer vs the background writer.

One training loop (a ResNet-50 by default: its weights plus SGD momentum make a ~195 MiB state,
what ``trainer.checkpointer`` writes for it) checkpoints every ``--every`` steps, with each writer
in turn (alternating rounds):

* ``blocking``: the trainer's writer as it was, ``torch.save`` of the live state on the training
  thread (``Checkpointer(background=False)``);
* ``background``: the trainer's writer now, a copy to host memory (pinned on CUDA), then a thread
  writes while training goes on (``Checkpointer(background=True)``).

Every step is timed (synchronised on CUDA). A checkpoint's cost is the extra time of the steps it
touched, from the saving step until its write has finished (for the background writer: the copy,
plus whatever the writing thread takes from the training thread meanwhile), over the median step
of the same run — robust to a shared machine's load, which whole-run totals are not. Median over
checkpoints; printed with the ratio blocking / background. Writes go to ``--dir`` (default: a
temporary folder on this machine's disk; point it at the volume the cluster uses).

    python benchmarks/checkpoint_stall.py                         # CPU: small images
    python benchmarks/checkpoint_stall.py --device cuda --image-size 224 --batch-size 256 \\
        --precision bf16 --steps 60 --every 10 --dir /workspace/ckpt-bench   # one GPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.checkpointer import Checkpointer  # noqa: E402
from trainer.models import build_model  # noqa: E402
from trainer.run_log import RunLog  # noqa: E402


class Loop:
    """A training loop on one fixed synthetic batch (the model's arithmetic, not the input)."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.device = device
        self.memory_format = torch.channels_last if device.type == "cuda" else torch.preserve_format
        self.model = build_model(args.model, 1000).to(device, memory_format=self.memory_format)
        fused = {"fused": True} if device.type == "cuda" else {}
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=0.01, momentum=0.9, nesterov=True, **fused
        )
        shape = (args.batch_size, 3, args.image_size, args.image_size)
        self.images = torch.randn(shape, device=device).contiguous(memory_format=self.memory_format)
        self.labels = torch.randint(0, 1000, (args.batch_size,), device=device)
        self.amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)

    def step(self) -> None:
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            loss = torch.nn.functional.cross_entropy(self.model(self.images), self.labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def state(self, step: int) -> dict:
        """The layout the trainer checkpoints (model, optimizer, counters)."""
        return {
            "format_version": 1,
            "step": step,
            "epoch": 0,
            "batch_in_epoch": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {},
            "scaler": {},
            "rng": {"seed": 0},
            "config": {},
        }

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def run(loop: Loop, mode: str, args: argparse.Namespace, root: Path) -> dict:
    """Per-step seconds with a checkpoint every ``args.every`` steps; the steps each one touched."""
    shutil.rmtree(root, ignore_errors=True)
    writer = Checkpointer(
        root,
        keep=2,
        is_writer=True,
        log=RunLog(root, is_main=False),
        device=loop.device,
        background=mode == "background",
    )
    step_s: list[float] = []
    touched: list[list[int]] = []  # per checkpoint: the steps it slowed down
    for step in range(1, args.steps + 1):
        busy = writer.writing  # the last checkpoint was still being written as this step began
        began = time.perf_counter()
        loop.step()
        saving = step % args.every == 0
        if saving:
            writer.save(step, lambda step=step: loop.state(step), "bench")
            touched.append([])
        loop.sync()
        step_s.append(time.perf_counter() - began)
        if saving or (busy and touched):
            touched[-1].append(step - 1)
    writer.close()
    if writer.failure is not None:
        raise SystemExit(str(writer.failure))
    affected = {i for steps in touched for i in steps}
    base = statistics.median(s for i, s in enumerate(step_s) if i not in affected)
    lost = [sum(step_s[i] - base for i in steps) for steps in touched if steps]
    return {"step_s": base, "lost_s": lost, "steps_touched": [len(s) for s in touched]}


def state_mib(loop: Loop) -> float:
    state = loop.state(0)
    tensors = list(state["model"].values())
    for per_param in state["optimizer"]["state"].values():
        tensors += [v for v in per_param.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run")
    parser.add_argument("--every", type=int, default=8, help="checkpoint every N steps")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians kept")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dir", type=Path, help="where checkpoints go (default: a temp folder)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = torch.device("cuda" if cuda else "cpu")

    loop = Loop(args, device)
    for _ in range(3):  # warm-up: allocator, cuDNN, the optimizer's state
        loop.step()
    modes = ("blocking", "background")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp) / "checkpoints"
        rounds = [{mode: run(loop, mode, args, root) for mode in modes} for _ in range(args.rounds)]
    lost = {mode: statistics.median(x for r in rounds for x in r[mode]["lost_s"]) for mode in modes}
    step_s = statistics.median(r[m]["step_s"] for r in rounds for m in modes)
    result = {
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "state_mib": round(state_mib(loop), 1),
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "precision": args.precision,
        "steps": args.steps,
        "every": args.every,
        "rounds": args.rounds,
        "step_s": round(step_s, 4),
        "lost_s_per_checkpoint": {mode: round(value, 3) for mode, value in lost.items()},
        "all_lost_s": {m: [round(x, 3) for r in rounds for x in r[m]["lost_s"]] for m in modes},
        "ratio_blocking_to_background": round(lost["blocking"] / max(lost["background"], 1e-3), 1),
    }
    print(
        f"{args.model} ({result['state_mib']} MiB of state) on {result['device']}, "
        f"{step_s:.3f} s/step: training time lost per checkpoint: blocking writer "
        f"{lost['blocking']:.3f} s | background writer {lost['background']:.3f} s | "
        f"ratio {result['ratio_blocking_to_background']}x"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
