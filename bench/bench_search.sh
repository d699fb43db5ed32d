#!/usr/bin/env bash
# Benchmark of issue 15: a search step against a plain KD forward + backward of the
# teacher-sized model at the same batch and layout, in the same run (alternated, medians).
#   [AC_BENCH_TARGET='--target-params-ratio 0.6'] bench/bench_search.sh TEACHER_CKPT IMPORTANCE DATA [STEPS] [SEQ] [MICRO_BATCH]
# The baseline is `autocompress distill` with the teacher's own architecture as the student,
# started from the teacher (KD forward of both + backward into every weight + ZeRO-1 AdamW
# update); the search step is the teacher forward, the masked forward, the backward into the
# architecture logits, the cost model and its Lagrangian. Tokens/s from each run's
# metrics.jsonl, skipping the first logged interval (warm-up). Prints the ratio of step times
# (search / KD; goal <= 1.3) and the cost model's share of a search step (goal < 1%).
set -euo pipefail
BIN=${AC_BIN:-build/autocompress}
TEACHER=$1 IMP=$2 DATA=$3 STEPS=${4:-6} SEQ=${5:-64} MB=${6:-2}
# The search's budget (AC_BENCH_TARGET; a tiny teacher cannot reach 0.6 of its TPOT on h100).
read -r -a TARGET <<<"${AC_BENCH_TARGET:---target-tpot-ms-ratio 0.6}"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BIN" checkpoint inspect "$TEACHER" --json | python3 -c "import json,sys; json.dump(json.load(sys.stdin)['attributes']['arch_spec'], open('$T/arch.json','w'))"
med() { python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
rows = rows[1:] or rows
print(statistics.median(r["tokens_per_s"] for r in rows), statistics.median(r.get("cost_model_share", 0) for r in rows))
PY
}
kd=() se=() share=()
for rep in 1 2; do
  rm -rf "$T/kd" "$T/se"
  "$BIN" distill --student "$T/arch.json" --student-init "$TEACHER" --teacher "$TEACHER" --data "$DATA" \
    --seq-len "$SEQ" --micro-batch "$MB" --steps "$STEPS" --log-interval 1 --eval-interval 0 --save-interval 0 \
    --warmup 1 --out "$T/kd" >"$T/kd.log" 2>&1 || { cat "$T/kd.log"; exit 1; }
  "$BIN" search --teacher "$TEACHER" --importance "$IMP" --data "$DATA" --hardware h100 --engine vllm \
    --workload batched-serving "${TARGET[@]}" --seq-len "$SEQ" --micro-batch "$MB" --steps "$STEPS" \
    --log-interval 1 --save-interval 0 --candidates 1 --out "$T/se" >"$T/se.log" 2>&1 || { cat "$T/se.log"; exit 1; }
  read -r a _ < <(med "$T/kd/metrics.jsonl")
  read -r b c < <(med "$T/se/metrics.jsonl")
  kd+=("$a"); se+=("$b"); share+=("$c")
  echo "repeat $rep: KD fwd+bwd $a tok/s, search $b tok/s, cost model $(python3 -c "print(f'{100*$c:.3f}')")% of a search step"
done
python3 - "${kd[*]}" "${se[*]}" "${share[*]}" <<'PY'
import statistics, sys
kd, se, sh = ([float(x) for x in a.split()] for a in sys.argv[1:])
r = statistics.median(k / s for k, s in zip(kd, se))
print(f"search step / KD step time: {r:.3f} (goal <= 1.3); cost model share {100*statistics.median(sh):.3f}% (goal < 1%)")
PY
