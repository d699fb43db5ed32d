# Shared setup of the trainer's shell tests: a tokenized slice of the fortunes corpus and
# small runs of the tiny teacher (configs/models/tiny-teacher.json, GPT-2 BPE cut to 4,096 ids: gpt2-4k.tokenizer.json).
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
PY=/usr/bin/python3
CMP="$PY $AC_SOURCE_DIR/tests/distill/compare_metrics.py"
make_data() {
  [ -f "$T/fortunes.idx" ] && return 0
  "$AC_BIN" data preprocess --input "$AC_SOURCE_DIR/tests/fixtures/data/corpus/fortunes_sample.jsonl" \
    --tokenizer "$AC_SOURCE_DIR/tests/fixtures/data/tokenizer/gpt2-4k.tokenizer.json" --output "$T/fortunes" \
    >"$T/preprocess.log" 2>&1 || { cat "$T/preprocess.log"; fail "data preprocess"; }
}
# Small, fast, f32 (bitwise comparisons), logging every step.
TRAIN_COMMON="--data $T/fortunes --seq-len 32 --micro-batch 2 --lr 2e-3 --min-lr 2e-4 --warmup 2 --log-interval 1 --eval-iters 2 --dtype f32"
# run_bg LOG CMD...: starts CMD in the background (a session of its own, $BG its id), sets $BG.
run_bg() {
  local log=$1; shift
  setsid "$@" >"$log" 2>&1 &
  BG=$!
}
# session_pids SID: the live processes of session SID (zombies aside), space-separated.
session_pids() { ps -e -o pid=,sid=,stat= | awk -v s="$1" '$2 == s && $3 !~ /^Z/ {print $1}' | tr '\n' ' ' | sed 's/ $//'; }
# kill_session SID: SIGKILLs every process of run_bg's session SID at once, as a node failure
# would (mpirun puts each rank in a process group of its own: killing the group, -$BG, left
# the ranks running until they noticed mpirun was gone), again every 0.1 s for 5 s for what
# was still starting, then reaps it. Fails, naming them in $SURVIVORS, when any outlived that.
kill_session() {
  local i pids
  for ((i = 0; i < 50; i++)); do
    pids=$(session_pids "$1")
    [ -n "$pids" ] || break
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  wait "$1" 2>/dev/null || true
  SURVIVORS=$(session_pids "$1")
  [ -z "$SURVIVORS" ]
}
# wait_step FILE STEP SECONDS: waits until metrics FILE has a training record at STEP or later.
wait_step() {
  local file=$1 want=$2 limit=$3 i
  for ((i = 0; i < limit * 10; i++)); do
    if [ -f "$file" ] && $PY - "$file" "$want" <<'PYEOF'
import json, sys
steps = [json.loads(l).get("step", 0) for l in open(sys.argv[1]) if l.strip()]
sys.exit(0 if steps and max(steps) >= int(sys.argv[2]) else 1)
PYEOF
    then return 0; fi
    sleep 0.1
  done
  fail "no step $want in $file after ${limit}s"
}
