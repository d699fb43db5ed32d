#!/usr/bin/env bash
# Benchmark of issue 17: the orchestration overhead of `autocompress run` against the same
# stages invoked one by one, in the same session and alternated (goal: run / one-by-one <= 1.05).
#   bench/bench_run.sh [REPEATS]          # default 2; at 2 ranks (TP 2) on the tiny test setup
# One-by-one replays the manifest's plan of a finished run: each call as its own
# `mpiexec -n 2 autocompress ...` (one-process calls as one process), each shell step with bash,
# in the plan's order. Both sides start from the same finished teacher and data, with an empty
# run directory. Prints each side's wall time per repeat, the medians and their ratio, and the
# run's own wall time per stage.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/bench/bench_env.sh"
REPEATS=${1:-2}
source "$ROOT/tests/launcher/run_common.sh"
make_teacher
write_cfg "$T/bench.cfg"
now() { date +%s.%N; }
run_side() {
  rm -rf "$T/R"
  local t0; t0=$(now)
  $MPIEXEC -n 2 "$AC_BIN" run --config "$T/bench.cfg" --out "$T/R" >"$T/run.log" 2>&1 || { cat "$T/run.log"; exit 1; }
  echo "$(now) - $t0" | bc
}
replay_side() {  # the plan of $T/R's manifest, call by call, into $T/P
  rm -rf "$T/P"
  /usr/bin/python3 - "$T/R/manifest.json" "$T/R" "$T/P" >"$T/replay.sh" <<'PY'
import json, shlex, sys
m, run, other = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
print("set -e")
for stage in m["plan"]:
    d = stage["dir"]
    if d:
        print(f"mkdir -p {shlex.quote(other + '/' + d)}")
    for sh in stage["shell"]:
        print(sh.replace(run, other) + " >>\"$LOG\" 2>&1")
    for call in stage["calls"]:
        call = call.replace(run, other)
        one = stage["name"] in ("scorecard", "samples") or stage["name"].startswith("export") or " data preprocess " in call
        launcher = '"$AC_BIN"' if one else '$MPIEXEC -n 2 "$AC_BIN"'
        print(launcher + " " + call[len("autocompress "):] + " >>\"$LOG\" 2>&1")
PY
  local t0; t0=$(now)
  LOG=$T/replay.log bash "$T/replay.sh" || { tail -30 "$T/replay.log"; exit 1; }
  echo "$(now) - $t0" | bc
}
runs=() replays=()
for ((i = 1; i <= REPEATS; i++)); do
  r=$(run_side); p=$(replay_side)
  runs+=("$r"); replays+=("$p")
  printf 'repeat %d: run %.1f s, one by one %.1f s\n' "$i" "$r" "$p"
done
/usr/bin/python3 - "$T/R/manifest.json" "${runs[*]}" "${replays[*]}" <<'PY'
import json, statistics, sys
m = json.load(open(sys.argv[1]))
r = statistics.median(map(float, sys.argv[2].split()))
p = statistics.median(map(float, sys.argv[3].split()))
print(f"median: run {r:.1f} s, the same stages one by one {p:.1f} s: ratio {r / p:.3f} (goal <= 1.05)")
print("run's wall time per stage (last repeat):")
for s in m["stages"]:
    print(f"  {s['name']:22s} {s['wall_s']:7.1f} s")
PY
