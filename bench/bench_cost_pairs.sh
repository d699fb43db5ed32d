#!/usr/bin/env bash
# Reproducibility of the cost model on this machine (issue 37): consecutive pairs of a fresh
# `cost calibrate` into an empty profile cache, then `cost validate` against that profile, and
# one summary line per pair (latency, prefill, decode B=1 with its signed error, batched TPOT,
# memory, the fitted decode-step terms) with the spread of the latency MAPE over the pairs.
# With AC_BIN_BASELINE set, the pairs alternate between that binary (the baseline, e.g. main's)
# and AC_BIN, and the two summaries end with the ratio of their mean latency MAPE.
#   [AC_BIN=build/autocompress] [AC_BIN_BASELINE=OTHER] [AC_CALIBRATE_FLAGS="--dtype float32"] \
#     bench/bench_cost_pairs.sh OUT_DIR [PAIRS=3] [`cost validate` flags...]
# Run it on a quiet machine (the calibration logs "other processes used X of N cores"). Each
# pair leaves OUT_DIR/[candidate|baseline/]pair-K/{calibrate.log,validate.log,validate.json,
# profile/}; a pair whose validate.json exists is kept, so an interrupted run resumes.
set -euo pipefail
BIN=${AC_BIN:-build/autocompress}
OUT=$1 PAIRS=${2:-3}
shift $(($# < 2 ? $# : 2))
HERE=$(dirname "$0")
one_pair() {  # BIN DIR [validate flags]
  local bin=$1 d=$2
  shift 2
  [ -f "$d/validate.json" ] && return 0
  rm -rf "$d" && mkdir -p "$d/profile"
  echo "$d: calibrate ($(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))"
  # shellcheck disable=SC2086  # AC_CALIBRATE_FLAGS: words, e.g. "--dtype float32"
  AC_CACHE_DIR="$d/profile" "$bin" cost calibrate --cache-dir "$d/profile" ${AC_CALIBRATE_FLAGS:-} \
    >"$d/calibrate.log" 2>&1
  echo "$d: validate ($(date -u +%H:%M:%S) UTC)"
  AC_CACHE_DIR="$d/profile" "$bin" cost validate --hardware cpu-local --out "$d/validate.json" "$@" >"$d/validate.log" 2>&1
}
if [ -z "${AC_BIN_BASELINE:-}" ]; then
  for k in $(seq 1 "$PAIRS"); do one_pair "$BIN" "$OUT/pair-$k" "$@"; done
  python3 "$HERE/cost_pairs_summary.py" "$OUT"
else
  for k in $(seq 1 "$PAIRS"); do
    one_pair "$BIN" "$OUT/candidate/pair-$k" "$@"
    one_pair "$AC_BIN_BASELINE" "$OUT/baseline/pair-$k" "$@"
  done
  python3 "$HERE/cost_pairs_summary.py" "$OUT/candidate" "$OUT/baseline"
fi
