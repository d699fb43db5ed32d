#!/usr/bin/env bash
# The CPU allocator's block reuse (dist/tensor_memory.h): the same `cost validate` measurements
# (TTFT of 256-, 1024- and 2048-token prompts, one-sequence decode) with reuse on (the default
# cap) and off (AC_CPU_CACHE_MB=0: every large block is glibc's fresh mmap), the same binary,
# alternated REPEATS times in one session. Latency is process CPU time at one thread (what
# `cost validate` measures), so other jobs on the machine disturb it less than wall time.
# Prints, per regime, the median over architectures of off / on (> 1: reuse is faster), and
# the peak resident memory of each side.
#   bench/bench_allocator.sh [REPEATS] [ARCHS]   # default 2, dense-256-4L,dense-512-3L,hybrid-M*M-,moe-16x1
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/bench/bench_env.sh"
REPEATS=${1:-2}
ARCHS=${2:-dense-256-4L,dense-512-3L,hybrid-M*M-,moe-16x1}
PROFILE=$ROOT/configs/hardware/cpu-avx512bf16-example.json  # predictions are not used here
T=$AC_TEST_TMP
side() {  # side NAME CAP_MB REPEAT
  /usr/bin/time -f "%M" -o "$T/$1-$3.rss" env AC_CPU_CACHE_MB="$2" "$AC_BIN" cost validate --hardware "$PROFILE" \
    --archs "$ARCHS" --prompt-tokens 256 --prompts 1024,2048 --concurrency 1 --decode-steps 8 --repeats 3 --sweeps 1 \
    --out "$T/$1-$3.json" >"$T/$1-$3.log" 2>&1 || { cat "$T/$1-$3.log"; exit 1; }
}
cap=$("$AC_BIN" env --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["build"]["cpu_tensor_cache"]["limit_bytes"] >> 20)')
echo "reuse on: AC_CPU_CACHE_MB=$cap (the default here); off: AC_CPU_CACHE_MB=0; $REPEATS x alternated; archs $ARCHS"
for r in $(seq 1 "$REPEATS"); do
  side off 0 "$r"
  side on "$cap" "$r"
done
python3 - "$T" "$REPEATS" <<'PYEOF'
import json, statistics, sys
from collections import defaultdict
t, n = sys.argv[1], int(sys.argv[2])
ratio, ms = defaultdict(list), defaultdict(lambda: defaultdict(list))
for r in range(1, n + 1):
    off = json.load(open(f"{t}/off-{r}.json"))["regime_rows"]
    on = json.load(open(f"{t}/on-{r}.json"))["regime_rows"]
    for a, b in zip(off, on):
        assert (a["name"], a["regime"]) == (b["name"], b["regime"])
        ratio[a["regime"]].append(a["seconds"]["measured"] / b["seconds"]["measured"])
        ms[a["regime"]]["off"].append(a["seconds"]["measured"] * 1e3)
        ms[a["regime"]]["on"].append(b["seconds"]["measured"] * 1e3)
print(f"{'regime':14s} {'off ms':>9s} {'on ms':>9s}  off/on median (min-max over archs and repeats)")
for k, v in ratio.items():
    print(f"{k:14s} {statistics.median(ms[k]['off']):9.1f} {statistics.median(ms[k]['on']):9.1f}  "
          f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
rss = {s: max(int(open(f"{t}/{s}-{r}.rss").read().split()[-1]) for r in range(1, n + 1)) for s in ("off", "on")}
print(f"peak RSS: off {rss['off'] / 1024:.0f} MiB, on {rss['on'] / 1024:.0f} MiB")
PYEOF
