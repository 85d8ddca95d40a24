"""One GPU's training step, rung by rung: today's trainer step, then each change toward MLPerf.

Every rung trains the same model (``--model``, default ResNet-50) at ``--image-size`` on synthetic
data already on the GPU, with the trainer's own parts (:func:`trainer.build.build_parts`: the
fused SGD with Nesterov momentum, the LR schedule, bf16 autocast, channels_last) and the trainer's
step (:meth:`trainer.loop.Trainer.train_step`'s sequence: forward under autocast, zero_grad,
backward, optimizer step, scheduler step; the loss is never read back inside the timed steps).
The rungs, in one process, the first being the named baseline every ratio is against:

* ``eager`` — today's trainer step (``python -m trainer.train`` without ``--compile``);
* ``compile`` — ``torch.compile`` of the model (the trainer's ``--compile``), default mode;
* ``eager+graph`` / ``compile+graph`` — the whole step (forward, backward, optimizer, LR) captured
  once into one CUDA graph and replayed: no kernel launches from Python per step;
* ``max-autotune`` — ``torch.compile(mode="max-autotune-no-cudagraphs")`` (+ the whole-step graph):
  Inductor benchmarks Triton templates against cuBLAS/cuDNN per shape (minutes the first time;
  the results are cached on disk, so a later run pays nothing);
* ``…@B`` — the same at per-GPU batch ``B`` (``--batches``).

Each rung: weights from the same seed, ``--warmup`` untimed steps (compilation, cuDNN autotuning,
graph capture), then ``--steps`` timed with CUDA events around the whole span; images/s, the ratio
to the first rung (``eager`` unless ``--rungs`` starts with another), the first steps' seconds
(compile cost) and the peak memory. Correctness: from the same weights on the same batch, each
rung's first loss and first weight update are compared with an fp32 eager step without TF32
(relative L2 difference: the eager bf16 rung's own distance is the yardstick; a broken rung lands
far above it), and the weights after all the steps with the first rung's (these drift apart over
tens of steps at a high learning rate: rounding differences grow); NaN fails. ``--budget-s``
skips the rungs that would not finish in time, saying so.

    python benchmarks/resnet50_step.py --budget-s 240 --json out.json        # a GPU node
    python benchmarks/resnet50_step.py --device cpu --model resnet18 --image-size 32 \\
        --batch-size 8 --steps 3 --warmup 2 --rungs eager,eager+graph        # the CPU path
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.build import Precision, RunPlan, TrainingParts, build_parts  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402

GFLOP_PER_IMAGE_224 = 3 * 4.1  # ResNet-50: ~4.1 GFLOP (multiply-adds x2) forward, x3 with backward
RUNGS = ("eager", "compile", "eager+graph", "compile+graph", "max-autotune")
# Seconds a rung needs beyond its steps on an H100 (first compile; measured, then rounded up).
SETUP_COST_S = {"eager": 15, "compile": 60, "eager+graph": 20, "compile+graph": 45}
SETUP_COST_S["max-autotune"] = 150


@dataclass(frozen=True)
class Rung:
    name: str
    batch: int
    compile_mode: str | None
    """None: eager; else a torch.compile mode."""
    graph: bool
    """The whole step captured into one CUDA graph."""


def rungs_from(names: list[str], batch: int) -> list[Rung]:
    modes = {"compile": "default", "max-autotune": "max-autotune-no-cudagraphs"}
    out = []
    for name in names:
        if name not in RUNGS:
            raise SystemExit(f"--rungs: unknown rung {name!r}; choose from {', '.join(RUNGS)}")
        base = name.removesuffix("+graph")
        graph = name.endswith("+graph") or name == "max-autotune"
        out.append(Rung(name, batch, modes.get(base), graph))
    return out


def setup_cost_s(rung: Rung, batch: int) -> float:
    """What a rung costs besides its steps (a compile at a new batch size is a new compile)."""
    cost = SETUP_COST_S[rung.name.split("@")[0]]
    if rung.batch != batch and rung.compile_mode:
        cost = max(cost, SETUP_COST_S["compile"])
    return cost


# ------------------------------------------------------------------------- one rung's step
class Step:
    """The trainer's step on one fixed batch, eager, compiled, or replayed from a CUDA graph."""

    def __init__(self, args: argparse.Namespace, rung: Rung, device: torch.device, tmp: Path):
        config = TrainConfig(
            output_dir=tmp,
            synthetic=True,
            model=args.model,
            num_classes=1000,
            batch_size=rung.batch,
            image_size=args.image_size,
            precision=args.precision,
            channels_last=device.type == "cuda",
            device=device.type,
        )
        total = args.warmup + args.steps + 8
        plan = RunPlan(
            steps_per_epoch=total, total_steps=total, global_batch=rung.batch, warmup_steps=5
        )
        self.precision = Precision.resolve(config.precision, device)
        torch.manual_seed(0)  # the same initial weights on every rung
        self.parts: TrainingParts = build_parts(
            config, num_classes=1000, plan=plan, device=device, precision=self.precision
        )
        self.device = device
        generator = torch.Generator(device=device).manual_seed(1)
        shape = (rung.batch, 3, args.image_size, args.image_size)
        fmt = torch.channels_last if config.channels_last else torch.contiguous_format
        self.images = torch.randn(shape, generator=generator, device=device).contiguous(
            memory_format=fmt
        )
        self.labels = torch.randint(0, 1000, (rung.batch,), generator=generator, device=device)
        model = self.parts.model
        self.forward = torch.compile(model, mode=rung.compile_mode) if rung.compile_mode else model
        self.graph: torch.cuda.CUDAGraph | None = None
        if rung.graph:
            # Tensor learning rates: the scheduler fills them in place, so a replay reads the new
            # value (a float would be baked into the captured kernels).
            for group in self.parts.optimizer.param_groups:
                group["lr"] = torch.tensor(group["lr"], device=device)
        self.last_loss: torch.Tensor | None = None
        self.first: dict[str, torch.Tensor] = {}
        """The first step's loss and weight update (the correctness check)."""
        self.initial_weights = _flat_weights(self.parts.model)

    def eager_step(self) -> torch.Tensor:
        parts = self.parts
        with self.precision.autocast(self.device):
            loss = parts.criterion(self.forward(self.images), self.labels)
        parts.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        parts.optimizer.step()
        if not self.first:  # outside the timed steps: the warm-up's first step
            update = _flat_weights(parts.model) - self.initial_weights
            self.first = {"loss": loss.detach().float().cpu(), "update": update}
        return loss.detach()

    def capture(self, warmup: int) -> None:
        """Warm up on a side stream (compile, cuDNN autotune), then capture one whole step."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.eager_step()
                self.parts.scheduler.step()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the warm-up's blocks back, before the graph's own pool
        self.parts.optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.last_loss = self.eager_step()

    def __call__(self) -> torch.Tensor:
        if self.graph is None:
            loss = self.eager_step()
        else:
            self.graph.replay()
            loss = self.last_loss  # type: ignore[assignment]
        self.parts.scheduler.step()
        return loss


# ---------------------------------------------------------------------------------- measuring
def measure(args: argparse.Namespace, rung: Rung, device: torch.device, tmp: Path) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    torch._dynamo.reset()
    began = time.perf_counter()
    step = Step(args, rung, device, tmp)
    if rung.graph:
        if not cuda:
            raise SystemExit(f"{rung.name}: CUDA graphs need a CUDA device")
        step.capture(args.warmup)
        torch.cuda.synchronize()
    else:
        for _ in range(args.warmup):
            step()
        _sync(device)
    setup_s = time.perf_counter() - began
    start, end = _timer(device)
    start()
    for _ in range(args.steps):
        loss = step()
    seconds = end()
    images_per_sec = args.steps * rung.batch / seconds
    result = {
        "rung": rung.name,
        "batch": rung.batch,
        "images_per_sec": round(images_per_sec, 1),
        "ms_per_step": round(1000 * seconds / args.steps, 3),
        "setup_s": round(setup_s, 1),
        "loss": round(float(loss), 4),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "weights": _flat_weights(step.parts.model),
        "first": step.first,
    }
    if args.image_size == 224 and args.model == "resnet50":
        result["tflops"] = round(images_per_sec * GFLOP_PER_IMAGE_224 / 1000, 1)
    del step
    if cuda:
        torch.cuda.empty_cache()
    return result


def _timer(device: torch.device):
    if device.type == "cuda":
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def stop() -> float:
            last.record()
            last.synchronize()
            return first.elapsed_time(last) / 1000

        return first.record, stop
    began = [0.0]

    def start() -> None:
        began[0] = time.perf_counter()

    return start, lambda: time.perf_counter() - began[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _flat_weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])


def _rounded(value: float) -> float:
    return float(f"{value:.3g}")


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", default="", help="more per-GPU batches for the best rung")
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--rungs", default=",".join(RUNGS))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--budget-s", type=float, default=math.inf)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # as the trainer (trainer.device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    rungs = rungs_from(args.rungs.split(","), args.batch_size)
    deadline = time.monotonic() + args.budget_s
    results: list[dict] = []
    print(_header(device), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        reference = {"fp32": fp32_first_step(args, device, Path(tmp))}
        for rung in rungs:
            run_rung(args, rung, device, Path(tmp), deadline, results, reference)
        measured = [r for r in results if "images_per_sec" in r]
        if measured:  # the fastest rung again at the other batch sizes
            best = max(measured, key=lambda r: r["images_per_sec"])
            chosen = next(x for x in rungs if x.name == best["rung"])
            for size in (int(b) for b in args.batches.split(",") if b):
                rung = Rung(f"{chosen.name}@{size}", size, chosen.compile_mode, chosen.graph)
                run_rung(args, rung, device, Path(tmp), deadline, results, reference)
    if args.json:
        summary = {**vars(args), "card": _header(device), "torch": torch.__version__}
        summary.update(json=str(args.json), budget_s=str(args.budget_s), results=results)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if any("error" in r for r in results) else 0


def fp32_first_step(args: argparse.Namespace, device: torch.device, tmp: Path) -> dict:
    """The reference: the first step's loss and weight update in fp32 (no TF32), eager."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        exact = argparse.Namespace(**{**vars(args), "precision": "fp32"})
        step = Step(exact, Rung("fp32", args.batch_size, None, False), device, tmp)
        step.eager_step()
        return step.first
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        if device.type == "cuda":
            torch.cuda.empty_cache()


def run_rung(args, rung: Rung, device, tmp: Path, deadline: float, results: list, reference):
    """Measure one rung (unless the budget is short) and print its line."""
    need = setup_cost_s(rung, args.batch_size)
    if device.type == "cuda" and time.monotonic() + need > deadline:
        print(f"{rung.name:24} skipped: needs ~{need} s, the budget has less", flush=True)
        return
    try:
        result = measure(args, rung, device, tmp)
    except Exception as err:  # a rung that breaks is reported, the others still run
        print(f"{rung.name:24} FAILED: {type(err).__name__}: {err}"[:600], flush=True)
        results.append({"rung": rung.name, "error": f"{type(err).__name__}: {err}"[:2000]})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return
    weights, first = result.pop("weights"), result.pop("first")
    if rung.batch == args.batch_size:
        fp32 = reference["fp32"]
        reference.setdefault("weights", weights)  # the first rung's last weights
        result["step1_loss_vs_fp32"] = _rounded(relative_difference(first["loss"], fp32["loss"]))
        result["step1_update_vs_fp32"] = _rounded(
            relative_difference(first["update"], fp32["update"])
        )
        result["weights_vs_first_rung"] = _rounded(
            relative_difference(weights, reference["weights"])
        )
    if not math.isfinite(result["loss"]):
        result["error"] = "the loss is not finite"
    first = next((r for r in results if "images_per_sec" in r), result)
    result["ratio"] = round(result["images_per_sec"] / first["images_per_sec"], 3)
    result["baseline"] = first["rung"]
    results.append(result)
    print(_line(result), flush=True)


def _header(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name()} | torch {torch.__version__}"
    return f"cpu ({os.cpu_count()} cores) | torch {torch.__version__}"


def _line(r: dict) -> str:
    extra = f" | {r['tflops']} TFLOP/s" if "tflops" in r else ""
    check = ""
    if "step1_update_vs_fp32" in r:
        check = (
            f" | vs fp32: step-1 loss {r['step1_loss_vs_fp32']:.1e}, update "
            f"{r['step1_update_vs_fp32']:.1e} | last weights vs {r['baseline']} "
            f"{r['weights_vs_first_rung']:.2g}"
        )
    return (
        f"{r['rung']:24} batch {r['batch']:4} | {r['images_per_sec']:9,.1f} img/s | "
        f"{r['ratio']:.3f}x {r['baseline']} | {r['ms_per_step']:7.2f} ms/step | "
        f"set-up {r['setup_s']:6.1f} s"
        f" | peak {r['peak_gib']} GiB{extra}{check} | loss {r['loss']}"
    )


with contextlib.suppress(AttributeError):  # quieter recompilation limits for many rungs
    torch._dynamo.config.cache_size_limit = 64

if __name__ == "__main__":
    sys.exit(main())
