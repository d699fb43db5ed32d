#!/usr/bin/env bash
# `autocompress run` killed at random moments (issue 35): one uninterrupted run A, then N
# trials (default 20). Each trial starts the same run in a fresh directory, SIGKILLs every
# process of it (mpirun, both ranks, their shell steps) at a moment drawn uniformly from
# [1 s, A's duration), reruns the same command to the end, and requires the final evals (eval/autocompress and
# eval/minitron: loss) to equal A's bitwise. Also checked: no process of the killed run
# survives the kill; right after it, every JSON file of the run directory (manifest, stage
# markers, latest pointers' targets) is whole (the writers write PATH.tmp and rename); after
# the rerun, no PATH.tmp is left. The run is tests/launcher/test_run.sh's: a tiny Nemotron-H
# teacher, TP 2, f32, seconds-long stages. Results: docs/hardening.md.
#
#   scripts/stress_run_kill.sh [N] [BUILD_DIR]     (BUILD_DIR default: build)
# Prints one line per trial (kill time, the stage it hit, the losses, the checks) and a
# summary; a failing trial's directory and logs are kept under build/test-tmp/stress_run_kill/.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-20}
build=$(cd "${2:-$src/build}" && pwd)
root=""; [ "$(id -u)" = 0 ] && root=--allow-run-as-root
export AC_SOURCE_DIR=$src AC_BIN=$build/autocompress AC_TEST_TMP=$build/test-tmp/stress_run_kill OMP_NUM_THREADS=1
export MPIEXEC="${MPIEXEC:-mpiexec --oversubscribe --bind-to none $root}"
[ -x "$AC_BIN" ] || { echo "stress_run_kill: build $AC_BIN first" >&2; exit 2; }
set +u
source "$src/tests/launcher/run_common.sh"
set -u
make_teacher
write_cfg "$T/run.cfg"
RUN=(timeout 1200 $MPIEXEC -n 2 "$AC_BIN" run --config "$T/run.cfg")
losses() { $PY -c "import json,sys; print(' '.join(repr(json.load(open(f'{sys.argv[1]}/eval/{m}/eval.json'))['loss']) for m in ('autocompress','minitron')))" "$1"; }

rm -rf "$T/A"
t0=$(date +%s.%N)
"${RUN[@]}" --out "$T/A" >"$T/A.log" 2>&1 || { cat "$T/A.log"; fail "the uninterrupted run"; }
dur=$($PY -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$(date +%s.%N)")
want=$(losses "$T/A")
echo "uninterrupted run: ${dur%.*} s, eval losses (autocompress minitron) $want"
# torn RUN_DIR: the JSON files that do not parse and the `latest` pointers whose step file is
# missing (nothing, when every file a kill could interrupt was written whole or not at all).
torn() {
  $PY - "$1" <<'PYEOF'
import json, os, sys
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(d, f)
        if f.endswith(".json"):
            try: json.load(open(p))
            except Exception as e: print(f"{p}: {type(e).__name__}")
        elif f == "latest":
            step = open(p).read().strip()
            if not os.path.isfile(os.path.join(d, step)): print(f"{p}: names {step!r}, which is missing")
PYEOF
}
ok=0
for trial in $(seq 1 "$n"); do
  d="$T/B$trial"; rm -rf "$d"
  at=$($PY -c "import random, sys; print('%.2f' % random.uniform(1, float(sys.argv[1])))" "$dur")
  run_bg "$T/B$trial-killed.log" "${RUN[@]}" --out "$d"
  sleep "$at"
  stage=$(grep -o 'stage [0-9]*/[0-9]* [a-z-]*: [a-z]*' "$T/B$trial-killed.log" | tail -n1 | awk '{print $3}' | tr -d :)
  # A's duration is one sample on a shared machine: a kill drawn late can come after the end.
  grep -q '^\[run\] finished' "$T/B$trial-killed.log" && stage="none: the run had finished"
  problems=()
  # The whole session (kill_session, tests/distill/train_common.sh), not the process group.
  kill_session "$BG" || problems+=("processes outlived SIGKILL for 5 s: $SURVIVORS")
  bad=$(torn "$d")
  [ -z "$bad" ] || problems+=("torn after the kill: $bad")
  t1=$(date +%s)
  if "${RUN[@]}" --out "$d" >"$T/B$trial.log" 2>&1; then
    got=$(losses "$d")
    [ "$got" = "$want" ] || problems+=("eval losses $got, the uninterrupted run's $want")
    left=$(find "$d" -name '*.tmp' | sed "s|^$d/||" | tr '\n' ' ')
    [ -z "$left" ] || problems+=(".tmp left after the rerun: $left")
  else
    got="(none)"; problems+=("the rerun failed: $T/B$trial.log")
  fi
  if (( ${#problems[@]} == 0 )); then
    ok=$((ok + 1)); echo "trial $trial: killed at ${at} s during ${stage:-startup}; rerun $(( $(date +%s) - t1 )) s, eval losses $got: equal"
    rm -rf "$d" "$T/B$trial.log" "$T/B$trial-killed.log"
  else
    echo "trial $trial: killed at ${at} s during ${stage:-startup}: FAILED: ${problems[*]} (kept: $d)"
  fi
done
echo "stress_run_kill: $ok of $n killed-and-rerun runs passed every check and ended with the uninterrupted run's eval losses"
[ "$ok" = "$n" ]
