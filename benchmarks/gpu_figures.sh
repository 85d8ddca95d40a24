#!/usr/bin/env bash
# Every GPU figure of the README in one run on one GPU machine (the commands that produced them).
# Writes logs and JSON under $OUT (default ./gpu-figures); prints a short table at the end.
#
#   OUT=/tmp/figs bash benchmarks/gpu_figures.sh     # phases: steps,throughput,compiled (default)
#   PHASES=steps STEP_RUNGS=eager,compile+graph STEP_BATCHES=384,512 bash benchmarks/gpu_figures.sh
#   PHASES=jpeg-compiled,autotune AUTOTUNE_BUDGET_S=300 bash benchmarks/gpu_figures.sh
#   PHASES=stages,steps,both-compiled,autotune DEADLINE_S=540 bash benchmarks/gpu_figures.sh
#
# DEADLINE_S: seconds from the start for the whole script; the autotune phase (always last) gets
# what is left of it, less a margin, instead of AUTOTUNE_BUDGET_S when that is less.
#
# Needs torch + torchvision (CUDA builds), Pillow, NumPy and PyYAML: the trainer runs there alone.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-figures}
PHASES=${PHASES:-steps,throughput,compiled}
STEP_BUDGET_S=${STEP_BUDGET_S:-200}
STEP_RUNGS=${STEP_RUNGS:-eager,compile,eager+graph,compile+graph}
STEP_BATCHES=${STEP_BATCHES:-384,512}
AUTOTUNE_BUDGET_S=${AUTOTUNE_BUDGET_S:-600}
PY=${PYTHON:-python3}
DEADLINE_S=${DEADLINE_S:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# Inductor's caches (compiled graphs, autotuning) in one folder: the second compile of the same
# model reads them (the trainer's run after the ladder shows what a cached compile costs).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/kfp-ddp-inductor-cache}
has() { [[ ",$PHASES," == *",$1,"* ]]; }

# The trainer's own imports first: a machine without one of them (docstring_parser was missing on
# a lent GPU machine once) fails here in seconds, naming it, not after the first phase.
if ! missing=$("$PY" -c 'import trainer.train, benchmarks.gpu_decode_stages' 2>&1); then
  echo "gpu_figures.sh: the trainer cannot be imported with $PY: ${missing##*$'\n'}" >&2
  echo "install the missing package (pyproject.toml lists them) or put it on PYTHONPATH" >&2
  exit 2
fi

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  "$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda)'
  nproc
} 2>&1 | tee "$OUT/machine.txt"

if has stages; then
  echo "== the --decode gpu path stage by stage (benchmarks/gpu_decode_stages.py)"
  timeout 120 "$PY" benchmarks/gpu_decode_stages.py --json "$OUT/stages.json" 2>&1 \
    | tee "$OUT/stages.log"
fi

if has steps; then
  echo "== step ladder (benchmarks/resnet50_step.py)"
  timeout $((STEP_BUDGET_S + 60)) "$PY" benchmarks/resnet50_step.py --budget-s "$STEP_BUDGET_S" \
    --rungs "$STEP_RUNGS" --batches "$STEP_BATCHES" \
    --json "$OUT/steps.json" 2>&1 | tee "$OUT/steps.log" | grep -v "^W[0-9]"
fi

RESNET50=(--model resnet50 --batch-size 256 --image-size 224 --precision bf16 --channels-last
  --steps 60 --warmup 20 --procs 1)
if has throughput; then
  echo "== the seed guide's loop vs ours, synthetic and JPEG (benchmarks/trainer_throughput.py)"
  timeout 210 "$PY" benchmarks/trainer_throughput.py "${RESNET50[@]}" --jpeg-images 8192 \
    --json "$OUT/throughput.json" 2>&1 | tee "$OUT/throughput.log" | tail -n 4
fi

if has compiled; then
  echo "== ours with --compile (synthetic)"
  timeout 160 "$PY" benchmarks/trainer_throughput.py "${RESNET50[@]}" --data synthetic --compile \
    --json "$OUT/compiled.json" 2>&1 | tee "$OUT/compiled.log" | tail -n 2
fi

if has both-compiled; then
  echo "== ours with --compile, synthetic and JPEG (--decode auto: gpu), with the guide's loop"
  timeout 300 "$PY" benchmarks/trainer_throughput.py "${RESNET50[@]}" --data synthetic,jpeg \
    --compile --jpeg-images 8192 --json "$OUT/both-compiled.json" 2>&1 \
    | tee "$OUT/both-compiled.log" | tail -n 3
fi

if has jpeg-compiled; then
  echo "== ours with --compile (JPEG, --decode auto: gpu)"
  timeout 200 "$PY" benchmarks/trainer_throughput.py "${RESNET50[@]}" --data jpeg --compile \
    --jpeg-images 8192 --json "$OUT/jpeg-compiled.json" 2>&1 | tee "$OUT/jpeg-compiled.log" \
    | tail -n 2
fi

if has autotune && [[ -n "$DEADLINE_S" ]]; then
  left=$((DEADLINE_S - SECONDS - 40))
  ((left < AUTOTUNE_BUDGET_S)) && AUTOTUNE_BUDGET_S=$left
fi
if has autotune && ((AUTOTUNE_BUDGET_S < 60)); then
  echo "== max-autotune skipped: ${AUTOTUNE_BUDGET_S} s left of DEADLINE_S"
elif has autotune; then
  echo "== max-autotune (benchmarks/resnet50_step.py, budget ${AUTOTUNE_BUDGET_S} s)"
  timeout $((AUTOTUNE_BUDGET_S + 30)) "$PY" benchmarks/resnet50_step.py \
    --budget-s "$AUTOTUNE_BUDGET_S" --rungs eager,max-autotune --json "$OUT/autotune.json" 2>&1 \
    | tee "$OUT/autotune.log" | grep -v "^W[0-9]"
fi

echo "== summary"
grep -h "img/s" "$OUT"/{stages,steps,throughput,compiled,both-compiled,jpeg-compiled,autotune}.log 2>/dev/null \
  | grep -v "^W[0-9]" | cut -c1-170
