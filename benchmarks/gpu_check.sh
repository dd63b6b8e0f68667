#!/usr/bin/env bash
# GPU path of pardiag, on a machine with one GPU or more (issue #15 item 7), in at most
# GPU_CHECK_LIMIT_S seconds (default 480 = 8 minutes):
#   1. nvidia-smi -L and nvidia-smi topo -m, captured;
#   2. world size 1 on NCCL: examples/train_ddp.py, examples/train_fsdp2.py and the
#      Transformers Trainer example, profiled;
#   3. 2 ranks on one GPU with gloo (EXAMPLES_BACKEND=gloo): examples/train_ddp.py, profiled;
#   4. each run checked by benchmarks/_gpu_check.py (records on NCCL kernels, CUDA peaks in the
#      metadata, nvidia-smi topo in the metadata, GPU kernels in the traces) and reported;
#   5. the profiler's overhead inside and outside its window (benchmarks/overhead.py, DDP,
#      2 ranks on the GPU with gloo, 1 repetition): recorded, not judged.
# Everything goes to OUT_DIR (default gpu_check_results/): topo.txt, runs/, reports/, logs/,
# overhead.txt and summary.txt (one PASS/FAIL line per check). Exit 0 when every check passed,
# 1 when one failed, 2 on bad arguments or without a GPU.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
OUT=gpu_check_results
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  -*) echo "gpu_check: unknown option $1 (usage: bash benchmarks/gpu_check.sh [OUT_DIR])" >&2; exit 2 ;;
  "") ;;
  *) OUT=$1 ;;
esac
if [ $# -gt 1 ]; then
  echo "gpu_check: one argument at most, got $# (usage: bash benchmarks/gpu_check.sh [OUT_DIR])" >&2
  exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
LIMIT=${GPU_CHECK_LIMIT_S:-480}
case "$LIMIT" in ''|*[!0-9]*) echo "gpu_check: GPU_CHECK_LIMIT_S must be whole seconds, got '$LIMIT'" >&2; exit 2 ;; esac
DEADLINE=$(( $(date +%s) + LIMIT ))

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: no GPU here: nvidia-smi is not installed; run this on a machine with an NVIDIA GPU" >&2
  exit 2
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no GPU here: $PY has no CUDA torch (torch.cuda.is_available() is false)" >&2
  exit 2
fi
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "gpu_check: $OUT exists and is not empty; give another OUT_DIR" >&2
  exit 2
fi
mkdir -p "$OUT/runs" "$OUT/reports" "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
cd "$REPO"

note() { echo "$*" | tee -a "$SUMMARY"; }
# step NAME CMD...: run CMD (output to logs/NAME.log) within what is left of the time limit
step() {
  local name=$1; shift
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -le 5 ]; then note "FAIL $name: not run, the $LIMIT s limit is spent"; return 1; fi
  local rc=0
  timeout -k 15 "$left" "$@" > "$OUT/logs/$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] && return 0
  note "FAIL $name: exit $rc (see logs/$name.log)"
  return 1
}

nvidia-smi -L > "$OUT/gpus.txt" 2>&1 || true
if nvidia-smi topo -m > "$OUT/topo.txt" 2>&1 && grep -q GPU0 "$OUT/topo.txt"; then
  note "PASS nvidia-smi topo -m captured ($(wc -l < "$OUT/topo.txt") lines)"
else
  note "FAIL nvidia-smi topo -m: see topo.txt"
fi

# name | launch env | nproc | script | expected backend | check flags | script args
RUNS=(
  "w1_nccl_ddp||1|examples/train_ddp.py|nccl||--steps 10"
  "w1_nccl_fsdp2||1|examples/train_fsdp2.py|nccl|--expect-comm-kernels|--steps 10"
  "w1_nccl_hf_trainer||1|examples/frameworks/train_hf_trainer.py|nccl||--steps 8"
  "w2_gloo_ddp|EXAMPLES_BACKEND=gloo|2|examples/train_ddp.py|gloo||--steps 10"
)
for spec in "${RUNS[@]}"; do
  IFS='|' read -r name envs nproc script backend flags sargs <<< "$spec"
  # shellcheck disable=SC2086  # envs, flags and sargs are word lists
  if step "$name" env $envs "$PY" -m pardiag profile "$script" --nproc-per-node "$nproc" \
        --out "$OUT/runs/$name" -- $sargs; then
    # shellcheck disable=SC2086
    "$PY" benchmarks/_gpu_check.py "$OUT/runs/$name" --backend "$backend" $flags \
      | tee -a "$SUMMARY" || true
    step "report_$name" "$PY" -m pardiag report "$OUT/runs/$name" \
      -o "$OUT/reports/$name.html" --json "$OUT/reports/$name.json" \
      && note "PASS $name: report built (reports/$name.html)"
  fi
done

if step overhead env EXAMPLES_BACKEND=gloo "$PY" benchmarks/overhead.py --only ddp \
    --repeat 1 --steps 30; then
  cp "$OUT/logs/overhead.log" "$OUT/overhead.txt"
  note "PASS overhead measured (overhead.txt; DDP, 2 ranks on one GPU with gloo, 1 repetition):"
  sed 's/^/    /' "$OUT/overhead.txt" | tee -a "$SUMMARY"
fi

fails=$(grep -c '^FAIL' "$SUMMARY" || true)
passes=$(grep -c '^PASS' "$SUMMARY" || true)
echo "gpu_check: $passes passed, $fails failed in $(( $(date +%s) - DEADLINE + LIMIT )) s; results in $OUT"
[ "$fails" -eq 0 ]
