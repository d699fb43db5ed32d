#!/usr/bin/env bash
# The trainer on cuda:0 (label `gpu`): models, batches, KD loss and ZeRO-1 shards on the GPU;
# a run stopped after its step-4 checkpoint and resumed (weights and optimizer state read back
# into device memory) ends where the uninterrupted run does, bitwise; and the GPU run agrees
# with the same run on the CPU (f32, TF32 off) within a tolerance. Exit 77 (skipped) where
# no GPU is visible.
source "$AC_SOURCE_DIR/tests/distill/train_common.sh"
"$AC_BIN" env --json >"$T/env.json" 2>&1 || { cat "$T/env.json"; fail "env --json"; }
if ! python3 -c 'import json,sys; f=json.load(open(sys.argv[1]))["build"]; sys.exit(0 if f["libtorch"]["cuda"] and f["cuda"]["devices"] > 0 else 1)' "$T/env.json"; then
  echo "SKIP: no GPU visible to this build (autocompress env: $(grep -o '"devices": *[0-9]*' "$T/env.json" | head -1))"
  exit 77
fi
make_data
rm -rf "$T/a" "$T/b" "$T/c"
RUN="$AC_BIN pretrain --arch $AC_SOURCE_DIR/configs/models/tiny-teacher.json $TRAIN_COMMON --steps 8 --save-interval 4 --eval-interval 4"
timeout 300 $RUN --device cuda --out "$T/a" >"$T/a.log" 2>&1 || { cat "$T/a.log"; fail "uninterrupted run on cuda"; }
grep -q "device: cuda:0" "$T/a.log" || { cat "$T/a.log"; fail "the run did not say cuda:0"; }
grep -q "collectives nccl" "$T/a.log" || { cat "$T/a.log"; fail "the run did not choose NCCL"; }
# The first half, then a resume of the same run directory to step 8.
timeout 300 $RUN --device cuda --out "$T/b" --steps 4 >"$T/b1.log" 2>&1 || { cat "$T/b1.log"; fail "first half"; }
timeout 300 $RUN --device cuda --out "$T/b" >"$T/b2.log" 2>&1 || { cat "$T/b2.log"; fail "resume on cuda"; }
grep -q "resumed from" "$T/b2.log" || { cat "$T/b2.log"; fail "did not resume"; }
$CMP "$T/a/metrics.jsonl" "$T/b/metrics.jsonl" --exact || fail "loss curve after resume on cuda differs"
# The CPU path is the same code: the same run there agrees within float32 reduction-order noise.
timeout 300 $RUN --device cpu --out "$T/c" >"$T/c.log" 2>&1 || { cat "$T/c.log"; fail "the same run on the cpu"; }
$CMP "$T/a/metrics.jsonl" "$T/c/metrics.jsonl" --rtol 1e-3 || fail "cuda and cpu runs differ by more than 1e-3"
echo PASS
