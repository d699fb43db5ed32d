#!/usr/bin/env bash
# Expert parallelism in the trainer at 4 ranks (issue 20): a MoE teacher pretrained at EP 2, a
# MoE student distilled at EP 1, EP 2 (x expert DP 2), TP 2 x EP 2 with the experts' FFN
# over TP (ETP 2) and with whole experts (ETP 1, without and with sequence parallelism): the
# same losses and gradient norms within fp32 reduction order. Checkpoints
# stay logical: EP 2's step 3 resumes at EP 1 and EP 4, EP 1's at EP 2 (with full activation
# recomputation), and each continuation equals the uninterrupted run. plan's per-GPU memory for EP 2 matches the measured peak.
# Bad layouts exit 2 on every rank before any model is built, leaving no checkpoint.
source "$AC_SOURCE_DIR/tests/distill/train_common.sh"
make_data
rm -rf "$T"/ep_* "$T"/bad* "$T"/*.json
$PY - "$AC_SOURCE_DIR/configs/models" "$T" <<'PYEOF'
import json, sys
src, out = sys.argv[1], sys.argv[2]
t = json.load(open(f"{src}/tiny-teacher.json"))
t["dtype"] = "float32"
json.dump(t, open(f"{out}/teacher.json", "w"), indent=1)
s = json.loads(json.dumps(t))  # a smaller MoE student: 4 experts, narrower experts and MLP
s["name"] = "tiny-moe-student"
s["defaults"]["moe"]["expert_ffn"] = 64
s["defaults"]["moe"]["shared_ffn"] = 64
s["defaults"]["mlp"]["ffn_size"] = 192
json.dump(s, open(f"{out}/student.json", "w"), indent=1)
s5 = json.loads(json.dumps(s))
s5["defaults"]["moe"]["num_experts"] = 5
json.dump(s5, open(f"{out}/student5.json", "w"), indent=1)
d = json.load(open(f"{src}/tiny-student.json"))
json.dump(d, open(f"{out}/dense.json", "w"), indent=1)
PYEOF
N4="timeout 300 $MPIEXEC -n 4 $AC_BIN"
$N4 pretrain --arch "$T/teacher.json" $TRAIN_COMMON --steps 3 --eval-interval 0 --save-interval 0 --ep 2 \
  --out "$T/ep_teacher" >"$T/ep_teacher.log" 2>&1 || { cat "$T/ep_teacher.log"; fail "teacher pretraining at EP 2"; }
grep -q "experts over EP 2" "$T/ep_teacher.log" || { cat "$T/ep_teacher.log"; fail "no EP in the header"; }

DISTILL="distill --student $T/student.json --teacher $T/ep_teacher/checkpoints $TRAIN_COMMON --steps 6 --eval-interval 3 --save-interval 3 --ce-weight 0.1"
run() {  # run NAME ARGS...: a 4-rank distillation into $T/NAME
  local name=$1; shift
  $N4 $DISTILL "$@" --out "$T/$name" >"$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "distill $name ($*)"; }
}
# Losses and the gradient norm (which an expert gradient off by a factor would move) match
# to 1e-4; the runs differ only in fp32 reduction order (measured: 2e-5 at most, the KD term).
same() { $CMP "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" --rtol 1e-4 --keys loss,kd_loss,ce_loss,eval_loss,grad_norm; }
run ep_1
run ep_2 --ep 2
same ep_1 ep_2 || fail "EP 2 differs from EP 1"
# TP 2 x DP 2 with 2 micro-steps (the same global batch as DP 4), experts' FFN over TP: plan's
# default ETP = TP.
run ep_etp --tp 2 --ep 2 --etp 2 --grad-accum 2
same ep_1 ep_etp || fail "TP 2 x EP 2, ETP 2 differs from EP 1"
# TP 2 x EP 2 with whole experts (ETP 1), without and with SP (teacher and student dispatch
# from the sequence slice over the joint TP x EP group; issue 34): each equals EP 1.
run ep_tp --tp 2 --ep 2 --grad-accum 2
same ep_1 ep_tp || fail "TP 2 x EP 2, ETP 1 differs from EP 1"
run ep_tp_sp --tp 2 --ep 2 --grad-accum 2 --sequence-parallel
grep -q "sequence parallel" "$T/ep_tp_sp.log" || { cat "$T/ep_tp_sp.log"; fail "no SP in the header"; }
same ep_tp ep_tp_sp || fail "TP 2 x EP 2, ETP 1: SP differs from the same layout without it"
same ep_1 ep_tp_sp || fail "TP 2 x EP 2, ETP 1 with SP differs from EP 1"
$CMP "$T/ep_1/metrics.jsonl" --decreasing kd_loss || fail "KD loss did not fall"

# Resume across EP layouts from step 3 (the run's own metrics up to there, as after a stop).
resume() {  # resume FROM NAME ARGS...
  local from=$1 name=$2; shift 2
  mkdir -p "$T/$name/checkpoints"
  cp "$T/$from/checkpoints/step_3.h5" "$T/$name/checkpoints/"
  echo step_3.h5 >"$T/$name/checkpoints/latest"
  cp "$T/$from/metrics.jsonl" "$T/$name/"
  run "$name" "$@"
  grep -q "resumed from .*step_3.h5 at step 3" "$T/$name.log" || { cat "$T/$name.log"; fail "$name did not resume"; }
  same "$from" "$name" || fail "$name: continuation differs from $from"
}
resume ep_2 ep_2to1
resume ep_2 ep_2to4 --ep 4
# EP 1 -> EP 2, with full activation recomputation (each layer's forward again in the
# backward, all-to-alls included) from there on.
resume ep_1 ep_1to2 --ep 2 --recompute full
grep -q "recompute full" "$T/ep_1to2.log" || { cat "$T/ep_1to2.log"; fail "no recompute in the header"; }

# plan's per-GPU memory for the EP 2 run (the trainer's TP 1 x EP 2 is plan's EP 2 x ETP 1).
expect_rc 0 "$AC_BIN" plan --teacher "$T/teacher.json" --student "$T/student.json" --cluster 1x4xh100 --tp 1 --dp 4 --ep 2 \
  --etp 1 --zero 1 --seq-len 32 --micro-batch 2 --recompute none --attention eager --grad-dtype fp32 --reserve-gib 0 \
  --json "$T/ep_2.plan.json"
$PY - "$T" <<'PYEOF' || fail "plan vs measured at EP 2"
import json, sys
T = sys.argv[1]
measured = max(json.loads(l)["peak_tensor_bytes"] for l in open(f"{T}/ep_2/metrics.jsonl") if "peak_tensor_bytes" in l)
plan = json.load(open(f"{T}/ep_2.plan.json"))["total_bytes"]
print(f"EP 2: measured peak {measured / 2**20:.1f} MiB, plan {plan / 2**20:.1f} MiB (plan / measured {plan / measured:.3f})")
assert abs(plan / measured - 1) <= 0.15, (plan, measured)
PYEOF

# Bad layouts: exit 2 naming the option, every rank stopped, no checkpoint written.
bad() {  # bad NP WANT_TEXT ARGS...
  local np=$1 want=$2; shift 2
  expect_rc 2 timeout 120 $MPIEXEC -n "$np" "$AC_BIN" "$@" --out "$T/bad"
  expect_out "$want"
  [ ! -e "$T/bad/checkpoints/latest" ] || fail "a refused layout wrote a checkpoint: $*"
}
bad 2 "ep: expert-parallel size 3 does not divide the data-parallel size 2" $DISTILL --ep 3
bad 2 "ep: expert-parallel size 2 does not divide the data-parallel size 1" $DISTILL --tp 2 --ep 2
bad 2 "5 experts do not split evenly over TP x EP = 1 x 2" ${DISTILL/student.json/student5.json} --ep 2
bad 2 "--etp: 3: must be 1" $DISTILL --tp 2 --etp 3
bad 2 "--ep: 2: the model has no MoE layers" pretrain --arch "$T/dense.json" $TRAIN_COMMON --steps 1 --ep 2
echo OK
