# Sourced by the shell benchmarks that reuse the tests' setup scripts: the environment those
# scripts expect from ctest (source dir, binary, mpiexec, a scratch folder, one OpenMP thread).
# Needs ROOT (the source tree).
export AC_SOURCE_DIR=$ROOT AC_BIN=${AC_BIN:-$ROOT/build/autocompress}
export MPIEXEC=${MPIEXEC:-mpiexec --oversubscribe $([ "$(id -u)" = 0 ] && echo --allow-run-as-root)}
export AC_TEST_TMP=${AC_TEST_TMP:-$(mktemp -d)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
