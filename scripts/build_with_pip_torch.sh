#!/usr/bin/env bash
# Builds autocompress against the LibTorch 2.x inside a pip `torch` wheel (what clusters
# use: CUDA LibTorch), to check that the code compiles and links against it, by hand and with
# any wheel. CI runs scripts/check_cuda_build.sh instead (a pinned wheel, -O0, the binary only).
#
#   scripts/build_with_pip_torch.sh [TORCH_SPEC] [BUILD_DIR]
#     TORCH_SPEC  pip requirement, default "torch" (newest); e.g. "torch==2.5.1"
#     BUILD_DIR   default build-torch2
#   WHEEL_DIR=dir  use a wheel already downloaded there instead of downloading
#   TARGETS="a b"  build only these targets (default: everything)
#
# Only the wheel itself is unpacked (no CUDA pip dependencies: several GB); the CUDA
# toolkit under /usr/local/cuda provides headers and libraries for compiling, and the
# CUDA libraries that only the wheel's own shared objects need are left unresolved at link
# time. So this checks compile + link; running needs a machine with the full CUDA stack
# (`pip install torch` with its dependencies, or a cluster's LibTorch).
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${1:-torch}
BUILD_DIR=${2:-build-torch2}
WHEEL_DIR=${WHEEL_DIR:-$BUILD_DIR/wheel}
mkdir -p "$WHEEL_DIR" "$BUILD_DIR"
if ! ls "$WHEEL_DIR"/torch-*.whl >/dev/null 2>&1; then
  python3 -m pip download --no-deps --only-binary=:all: -d "$WHEEL_DIR" "$SPEC"
fi
WHEEL=$(ls -t "$WHEEL_DIR"/torch-*.whl | head -n1)
UNPACK="$BUILD_DIR/torch-unpacked"
if [ ! -f "$UNPACK/.done-$(basename "$WHEEL")" ]; then
  rm -rf "$UNPACK" && mkdir -p "$UNPACK"
  python3 -m zipfile -e "$WHEEL" "$UNPACK"
  touch "$UNPACK/.done-$(basename "$WHEEL")"
fi
TORCH_DIR=$(cd "$UNPACK/torch/share/cmake/Torch" && pwd)
echo "LibTorch from $(basename "$WHEEL"): $TORCH_DIR"
CUDA_ARGS=()
if [ -x /usr/local/cuda/bin/nvcc ]; then
  CUDA_ARGS=(-DCUDAToolkit_ROOT=/usr/local/cuda -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
# A fresh cache: find_library results from another LibTorch must not survive.
rm -f "$BUILD_DIR/build/CMakeCache.txt"
cmake -S . -B "$BUILD_DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTorch_DIR="$TORCH_DIR" -DCaffe2_DIR="$(cd "$TORCH_DIR/../Caffe2" && pwd)" "${CUDA_ARGS[@]}" \
  -DCMAKE_LIBRARY_PATH="$(cd "$UNPACK/torch/lib" && pwd)" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--unresolved-symbols=ignore-in-shared-libs" \
  -DAC_BUILD_TESTS=ON -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST
TARGET_ARGS=()
for t in ${TARGETS:-}; do TARGET_ARGS+=(--target "$t"); done
cmake --build "$BUILD_DIR/build" -j "${JOBS:-$(nproc)}" "${TARGET_ARGS[@]}"
grep -E "AC_TORCH_HAS_CUDA|AC_HAVE_NCCL" "$BUILD_DIR/build/generated/autocompress/build_info.h"
# What was linked must be the wheel's LibTorch, not a system one (e.g. Debian's).
grep -E "^TORCH_LIBRARY:" "$BUILD_DIR/build/CMakeCache.txt"
grep -q "^TORCH_LIBRARY:FILEPATH=.*torch-unpacked" "$BUILD_DIR/build/CMakeCache.txt" ||
  { echo "FAIL: not linked against the wheel's LibTorch"; exit 1; }
# Caffe2's config (torch_cpu & co.) must come from the wheel too, not a system LibTorch.
grep -E "^Caffe2_DIR" "$BUILD_DIR/build/CMakeCache.txt"
echo "OK: built against $(basename "$WHEEL")"
