#!/usr/bin/env bash
# The AutoCompress-vs-Minitron grid (scripts/run_grid.py, configs/experiments/) on one GPU
# (H200 class), sized for a device session: >= 5M KD tokens per student, the eight benchmarks in
# full, within GPU_GRID_BUDGET_S (default 540 s) of wall time. NOT RUN YET on a GPU (none lent
# since it was written); its tiny form runs on the CPU in ctest launcher.gpu_grid.
#
#   scripts/gpu_grid.sh [--results FILE] [--tiny] [run_grid.py options: --targets, --seeds, ...]
#
# Run after scripts/gpu_check.sh, which builds the CUDA launcher (AC_BIN, default
# build-gpu-check/build/autocompress). Every stage runs with --device auto (cuda here) and bf16.
# When the budget is spent, run_grid.py gets SIGTERM: the running cell checkpoints and stops
# (exit 75), and a later call continues it. Either way the small files of every cell (manifests,
# stage records, metrics, eval / scorecard JSON, reports; no checkpoints) are packed into ONE
# results file (default gpu_grid_results.tar.gz) that gives the page on any machine:
#   tar xzf gpu_grid_results.tar.gz && python3 scripts/run_grid.py --report-only --out gpu-grid \
#       --results docs/results-gpu.md [--targets ... --seeds ... as run]
# --tiny: the CPU dry run of the tests (the tiny sizes of the caller's configs, f32, no budget).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS=gpu_grid_results.tar.gz
TINY=0
PASS=()
while [ $# -gt 0 ]; do
  case $1 in
    --results) RESULTS=$2; shift 2 ;;
    --tiny) TINY=1; shift ;;
    *) PASS+=("$1"); shift ;;
  esac
done
RESULTS=$(realpath -m "$RESULTS")
OUT=${GPU_GRID_OUT:-$ROOT/gpu-grid}
BUDGET=${GPU_GRID_BUDGET_S:-540}
AC_BIN=${AC_BIN:-$ROOT/build-gpu-check/build/autocompress}
PY=${PYTHON:-python3}
[ -x "$AC_BIN" ] || { echo "gpu_grid: error: $AC_BIN: no launcher (scripts/gpu_check.sh builds it; or set AC_BIN)" >&2; exit 2; }

# Sizes: the GPU's, or (--tiny) the tests' -- the same keys either way, so the CPU test checks
# every key the GPU run sets. KD tokens per student = steps x micro-batch x seq-len (DP 1).
if [ "$TINY" = 0 ]; then
  KD_TOKENS=${GPU_GRID_KD_TOKENS:-5000000}; SEQ=2048; MB=16; CALIB=256; SEARCH_STEPS=200; SEARCH_SEQ=1024
  SCORE=64; EVAL_SAMPLES=64; TASKS=core8; LIMIT=0
else
  KD_TOKENS=256; SEQ=32; MB=2; CALIB=8; SEARCH_STEPS=4; SEARCH_SEQ=32; SCORE=2; EVAL_SAMPLES=2; TASKS=arc_easy,piqa; LIMIT=4
  BUDGET=0
fi
STEPS=$(( (KD_TOKENS + SEQ * MB - 1) / (SEQ * MB) ))
# Both methods score each candidate after the same short KD: micro-batch 2 x SEARCH_SEQ for both
# here (the CPU configs give the search 64-token and Minitron 128-token samples, so 40 and 20 steps).
SCORE_KD=$(( TINY ? 2 : 40 ))
SETS=(--set distill.steps=$STEPS --set distill.seq-len=$SEQ --set distill.micro-batch=$MB
      --set distill.eval-interval=$(( STEPS / 4 > 0 ? STEPS / 4 : 1 )) --set distill.save-interval=$(( STEPS / 4 > 0 ? STEPS / 4 : 1 ))
      --set importance.calib-samples=$CALIB --set importance.seq-len=$SEQ
      --set search.steps=$SEARCH_STEPS --set search.seq-len=$SEARCH_SEQ
      --set minitron.score-samples=$SCORE --set minitron.seq-len=$SEARCH_SEQ
      --set search.score-kd-steps=$SCORE_KD --set minitron.score-kd-steps=$SCORE_KD
      --set eval.samples=$EVAL_SAMPLES --set eval.seq-len=$SEQ --set eval.tasks=$TASKS --set eval.limit=$LIMIT)
echo "gpu_grid: $STEPS KD steps x $MB x $SEQ = $((STEPS * MB * SEQ)) tokens per student, tasks $TASKS (limit $LIMIT: 0 = all), budget ${BUDGET} s"

mkdir -p "$OUT"
GRID=("$PY" "$ROOT/scripts/run_grid.py" --ac "$AC_BIN" --out "$OUT" --results "$OUT/results.md" "${SETS[@]}" "${PASS[@]}")
echo "gpu_grid: ${GRID[*]}"
if [ "$BUDGET" -gt 0 ]; then
  timeout -s TERM -k 60 "$BUDGET" "${GRID[@]}"
else
  "${GRID[@]}"
fi
rc=$?
[ "$rc" = 124 ] && rc=75  # the budget ran out: cells checkpointed, rerun to continue

# One results file: the small files of every cell, no checkpoints or tokenized data.
( cd "$(dirname "$OUT")" && find "$(basename "$OUT")" -type f \
    \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.csv' -o -name '*.log' -o -name '*.cmd' -o -name '*.png' \) \
    -size -20M -print0 | tar czf "$RESULTS.tmp" --null -T - ) && mv "$RESULTS.tmp" "$RESULTS" ||
  { echo "gpu_grid: error: could not write $RESULTS" >&2; exit 1; }
echo "gpu_grid: results in $RESULTS ($(du -h "$RESULTS" | cut -f1)); run_grid.py exit $rc"
exit "$rc"
