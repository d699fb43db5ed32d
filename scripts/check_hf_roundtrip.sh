#!/usr/bin/env bash
# By hand (needs python3 with torch + transformers): every config fixture goes
#   Hugging Face dir -> `checkpoint import` (2 ranks, TP 2) -> HDF5 -> `export --format
#   safetensors --dtype f32` -> transformers' from_pretrained
# and transformers' logits are compared with the golden ones (max abs diff <= 1e-4).
#
#   scripts/check_hf_roundtrip.sh [BUILD_DIR (build)] [WORK_DIR (BUILD_DIR/hf-roundtrip)]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
WORK=${2:-$BUILD/hf-roundtrip}
MPIEXEC=(mpiexec --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIEXEC+=(--allow-run-as-root)
NAMES=(llama qwen3 qwen3_moe nemotron_h nemotron_h_latent)
rm -rf "$WORK"
for n in "${NAMES[@]}"; do
  OMP_NUM_THREADS=1 "${MPIEXEC[@]}" -n 2 "$BUILD/autocompress" checkpoint import \
      --hf "$ROOT/tests/fixtures/model/$n" --out "$WORK/ckpt/$n" --tp 2 --dtype f32
  "$BUILD/autocompress" export --checkpoint "$WORK/ckpt/$n" --format safetensors --dtype f32 --out "$WORK/hf/$n"
done
python3 "$ROOT/scripts/make_model_fixtures.py" --check-export "$WORK/hf" --only "${NAMES[@]}"
