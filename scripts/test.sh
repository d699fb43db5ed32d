#!/usr/bin/env bash
# One-command test: configure, build (binary at build/autocompress) and run the whole suite
# through ctest, MPI tests included. Extra arguments go to ctest (e.g. -R dist).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
else
  cmake -S . -B "$BUILD_DIR" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
# MPI tests oversubscribe the cores; run them one at a time so they do not starve each other.
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 600 "$@"
