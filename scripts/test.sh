#!/usr/bin/env bash
# One-command test: configure, build (binary at build/autocompress) and run the whole suite
# through ctest, MPI tests included. Extra arguments go to ctest (e.g. -R dist).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
# AC_UNITY_BUILD=ON (CI sets it): the libraries and the launcher compiled in batches, a third
# less build time on a fresh 2-core machine (CMakeLists.txt); unset, the cache's choice stands.
UNITY=(${AC_UNITY_BUILD:+-DAC_UNITY_BUILD=$AC_UNITY_BUILD})
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${UNITY[@]}"
else
  cmake -S . -B "$BUILD_DIR" "${UNITY[@]}" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
# Tests run side by side, one per core (CTEST_JOBS to change it). An MPI test reserves a core
# per rank (its PROCESSORS), so a 2-rank test on 2 cores runs alone; the shell tests, which
# start short MPI jobs between files, Python and process start-up, reserve one, and the
# Slurm tests share one lock. The long tests start first (tests/test_costs.txt).
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 600 -j "${CTEST_JOBS:-$JOBS}" "$@"
