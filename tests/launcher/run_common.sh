# Shared by the `autocompress run` tests and bench/bench_run.sh: a briefly pretrained tiny
# Nemotron-H teacher (configs/models/tiny-teacher.json, GPT-2 BPE cut to 4,096 ids: gpt2-4k.tokenizer.json) on a tokenized slice
# of the fortunes corpus, and write_cfg FILE [top-level lines...]: a run config with
# seconds-long stages (h100 / local-eager / in-game, TPOT <= 0.8x the teacher's, TP 2, f32).
source "$AC_SOURCE_DIR/tests/distill/train_common.sh"
make_teacher() {
  make_data
  [ -f "$T/teacher/checkpoints/latest" ] && return 0
  timeout 300 $MPIEXEC -n 2 "$AC_BIN" pretrain --arch "$AC_SOURCE_DIR/configs/models/tiny-teacher.json" $TRAIN_COMMON \
  --steps 4 --eval-interval 0 --save-interval 0 --out "$T/teacher" >"$T/teacher.log" 2>&1 ||
  { cat "$T/teacher.log"; fail "teacher pretraining"; }
}

# write_cfg FILE [extra top-level lines...]
write_cfg() {
  local f=$1; shift
  {
    echo "method = both"
    echo "hardware = h100"
    echo "engine = local-eager"
    echo "workload = in-game"
    echo "target-tpot-ms-ratio = 0.8"
    echo "tp = 2"
    echo "dtype = f32"
    for l in "$@"; do echo "$l"; done
    cat <<EOF
[teacher]
checkpoint = $T/teacher/checkpoints
tokenizer = $AC_SOURCE_DIR/tests/fixtures/data/tokenizer/gpt2-4k.tokenizer.json
[data]
prefix = $T/fortunes
[importance]
calib-samples = 8
seq-len = 32
no-depth-loss = true
[search]
steps = 16
seq-len = 32
micro-batch = 2
candidates = 2
score-batches = 1
log-interval = 2
save-interval = 2
[minitron]
top-k = 2
score-samples = 2
seq-len = 32
[distill]
steps = 12
seq-len = 32
micro-batch = 2
lr = 2e-3
warmup = 2
log-interval = 1
eval-interval = 6
eval-iters = 1
save-interval = 2
[eval]
seq-len = 64
samples = 4
last-word-docs = 8
[scorecard]
requests-count = 2
max-prompt-tokens = 16
max-output-tokens = 4
eval-samples = 2
eval-seq-len = 64
last-word-docs = 4
[samples]
prompts = The old man|A computer is
max-new-tokens = 6
[export]
dtype = f32
EOF
  } >"$f"
}
