#!/usr/bin/env bash
# Importance collection tokens/s against the plain teacher forward (same layout, same
# micro-batch, same samples), in one run: `autocompress bench importance` on the
# configs/models/tiny-hybrid.json teacher (Mamba-2, attention, MLP, latent MoE; one
# pretraining step from random init) and random tokens. Goal: ratio >= 0.8.
#   bench/bench_importance.sh [BUILD_DIR=build] [NP=1] [TP=1] [extra bench options...]
# e.g. bench/bench_importance.sh build 2 2 --dtype f32
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
NP=${2:-1}
TP=${3:-1}
shift $(( $# < 3 ? $# : 3 ))
AC_BIN=$BUILD/autocompress
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

python3 - "$T/tokens" <<'PYEOF'
import struct, sys
import numpy as np
rng = np.random.default_rng(1)
docs = [rng.integers(0, 1024, size=1500, dtype=np.uint16) for _ in range(64)]
with open(sys.argv[1] + ".bin", "wb") as f:
    for d in docs: f.write(d.tobytes())
lens = np.array([len(d) for d in docs], dtype=np.int32)
offs = np.concatenate([[0], np.cumsum(lens[:-1].astype(np.int64) * 2)]).astype(np.int64)
with open(sys.argv[1] + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
    f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
    f.write(lens.tobytes() + offs.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())
PYEOF
"$AC_BIN" pretrain --arch "$ROOT/configs/models/tiny-hybrid.json" --data "$T/tokens" --split 1,1,0 --steps 1 \
  --warmup 0 --seq-len 128 --micro-batch 1 --dtype f32 --eval-interval 0 --out "$T/teacher" >"$T/pretrain.log" 2>&1 ||
  { cat "$T/pretrain.log"; exit 1; }
MPI=()
if [ "$NP" -gt 1 ]; then
  MPI=(mpiexec --oversubscribe --bind-to none -n "$NP")
  [ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
fi
set -x
"${MPI[@]}" "$AC_BIN" bench importance --teacher "$T/teacher/checkpoints" --data "$T/tokens" --split 1,1,0 \
  --calib-samples 16 --seq-len 256 --micro-batch 4 --tp "$TP" --repeats 5 "$@"
