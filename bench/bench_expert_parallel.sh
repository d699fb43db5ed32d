#!/usr/bin/env bash
# Expert parallelism (issue 20): a KD step at EP 2 against EP 1 on the same 2 ranks (DP 2),
# alternated in one session. A MoE teacher and student (hidden 256, 8 experts of FFN 512, top-2,
# sequence 256, micro-batch 2, f32, random init, the fortunes test corpus); tokens/s is the
# median of each run's logged steps after the first two. Prints both and the ratio EP 2 / EP 1.
# At EP 2 each rank holds half the experts (half their weights, gradients and optimizer state)
# and pays two all-to-alls per MoE layer per pass; at EP 1 it holds all of them.
#   bench/bench_expert_parallel.sh [REPEATS]   # default 2
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/bench/bench_env.sh"
REPEATS=${1:-2}
source "$ROOT/tests/distill/train_common.sh"
set +u
make_data
$PY - "$ROOT/configs/models" "$T" <<'PYEOF'
import json, sys
t = json.load(open(f"{sys.argv[1]}/tiny-teacher.json"))
t["dtype"] = "float32"
t["hidden_size"] = 256
t["defaults"]["moe"].update(num_experts=8, expert_ffn=512, shared_ffn=256)
json.dump(t, open(f"{sys.argv[2]}/bench_teacher.json", "w"), indent=1)
s = json.loads(json.dumps(t))
s["defaults"]["moe"].update(expert_ffn=384)
json.dump(s, open(f"{sys.argv[2]}/bench_student.json", "w"), indent=1)
PYEOF
rm -rf "$T/bench_teacher"
$MPIEXEC -n 2 "$AC_BIN" pretrain --arch "$T/bench_teacher.json" --data "$T/fortunes" --seq-len 64 --micro-batch 2 --steps 1 \
  --eval-interval 0 --save-interval 0 --dtype f32 --out "$T/bench_teacher" >"$T/bench_teacher.log" 2>&1 ||
  { cat "$T/bench_teacher.log"; exit 1; }
side() {  # side EP: prints the median tokens/s of one run
  rm -rf "$T/bench_ep$1"
  $MPIEXEC -n 2 "$AC_BIN" distill --student "$T/bench_student.json" --teacher "$T/bench_teacher/checkpoints" \
    --data "$T/fortunes" --seq-len 256 --micro-batch 2 --steps 8 --log-interval 1 --eval-interval 0 --save-interval 0 \
    --dtype f32 --ep "$1" --out "$T/bench_ep$1" >"$T/bench_ep$1.log" 2>&1 || { cat "$T/bench_ep$1.log"; exit 1; }
  $PY -c "
import json, statistics, sys
v = [json.loads(l)['tokens_per_s'] for l in open('$T/bench_ep$1/metrics.jsonl') if 'tokens_per_s' in l][2:]
print(statistics.median(v))"
}
ep1=() ep2=()
for ((i = 0; i < REPEATS; i++)); do
  ep1+=("$(side 1)")
  ep2+=("$(side 2)")
  echo "repeat $i: EP 1 ${ep1[-1]} tok/s, EP 2 ${ep2[-1]} tok/s"
done
$PY - "${ep1[*]}" "${ep2[*]}" <<'PYEOF'
import statistics, sys
a = statistics.median(map(float, sys.argv[1].split()))
b = statistics.median(map(float, sys.argv[2].split()))
print(f"KD step, 2 ranks: EP 1 {a:.0f} tok/s, EP 2 {b:.0f} tok/s, ratio EP 2 / EP 1 = {b / a:.3f}")
PYEOF
