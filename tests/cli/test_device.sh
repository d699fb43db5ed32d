#!/usr/bin/env bash
# `--device auto|cpu|cuda`: one resolver for every stage. Here (no GPU; a CPU LibTorch or a
# CUDA one that sees no device) `auto` is the CPU with its reason in the progress header and
# the manifest, and `--device cuda` stops every rank with exit 2 and the reason before any
# model is built; nothing hangs.
source "$(dirname "$0")/lib.sh"
T=$AC_TEST_TMP
rm -rf "$T/cuda" "$T/auto"
ARCH="$AC_SOURCE_DIR/configs/models/tiny-teacher.json"
"$AC_BIN" data preprocess --input "$AC_SOURCE_DIR/tests/fixtures/data/corpus/fortunes_sample.jsonl" \
  --tokenizer "$AC_SOURCE_DIR/tests/fixtures/data/tokenizer/gpt2-4k.tokenizer.json" --output "$T/fortunes" \
  >"$T/preprocess.log" 2>&1 || { cat "$T/preprocess.log"; fail "data preprocess"; }
SMALL="--arch $ARCH --data $T/fortunes --seq-len 16 --micro-batch 1 --warmup 0 --log-interval 1 --eval-interval 0 --dtype f32"

# Which reason applies to this build: no CUDA in its LibTorch, or no GPU visible to it.
"$AC_BIN" env --json >"$T/env.json" 2>&1 || { cat "$T/env.json"; fail "env --json"; }
if python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["build"]["libtorch"]["cuda"] else 1)' "$T/env.json"; then
  reason="no GPU visible"
else
  reason="this build has no CUDA"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ "$reason" = "no GPU visible" ]; then
  echo "SKIP: a GPU is visible here; the refusal is tested where there is none"
  exit 0
fi

# --device cuda at np 2: exit 2 from the job, the reason named, both ranks gone, no model built.
expect_rc 2 $MPIEXEC -n 2 "$AC_BIN" pretrain $SMALL --steps 1 --out "$T/cuda" --device cuda
expect_out "--device: cuda: $reason"
[ -e "$T/cuda/checkpoints" ] && fail "a checkpoint directory was made before the device was refused"
pgrep -f "autocompress pretrain .*$T/cuda" >/dev/null && fail "a rank is still running"
# The other stages use the same resolver (single rank: refused before anything is read).
expect_rc 2 "$AC_BIN" cost calibrate --device cuda --quick --out "$T/cuda.json" --memory-bytes 1e9
expect_out "--device: cuda: $reason"
[ -e "$T/cuda.json" ] && fail "cost calibrate wrote a profile after refusing the device"
expect_rc 2 "$AC_BIN" cost validate --device cuda --hardware cpu-local --limit 1
expect_out "--device: cuda: $reason"
# `env` reports what --device resolves to, and why; `env --device cuda` is refused the same way.
expect_rc 0 "$AC_BIN" env --device auto
expect_out "device cpu (auto: $reason"
expect_rc 0 "$AC_BIN" env --device cpu --json
expect_out '"device_reason": "--device cpu"'
expect_rc 2 "$AC_BIN" env --device cuda
expect_out "--device: cuda: $reason"
expect_rc 2 "$AC_BIN" pretrain $SMALL --steps 1 --out "$T/cuda" --device tpu
expect_out "--device: tpu: expected auto, cpu or cuda"

# --device auto: the CPU, with its reason in the header and the manifest; collectives over MPI.
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" pretrain $SMALL --steps 1 --out "$T/auto" --device auto
expect_out "device: cpu (auto: $reason"
expect_out "collectives mpi"
python3 - "$T/auto/manifest.json" "$reason" <<'PYEOF' || fail "manifest lacks the device"
import json, sys
m = json.load(open(sys.argv[1]))
lay = m["layout"]
assert lay["device"] == "cpu", lay
assert lay["device_reason"].startswith("auto: " + sys.argv[2]), lay
assert lay["backend"] == "mpi", lay
assert m["world"]["device"] == "cpu", m["world"]
PYEOF
echo PASS
