# Helpers for the launcher's shell tests.
set -u
mkdir -p "$AC_TEST_TMP"
fail() { echo "FAIL: $*"; exit 1; }
# expect_rc WANT CMD...: runs CMD (stdout+stderr to $AC_TEST_TMP/out), checks the exit code.
# The time limit is a hang guard, not a speed check: generous, because `ctest -j` runs tests
# side by side on few cores (AC_EXPECT_TIMEOUT to change it).
expect_rc() {
  local want=$1; shift
  timeout "${AC_EXPECT_TIMEOUT:-180}" "$@" >"$AC_TEST_TMP/out" 2>&1
  local rc=$?
  if [ "$rc" != "$want" ]; then
    cat "$AC_TEST_TMP/out"
    fail "exit code $rc, want $want: $*"
  fi
}
expect_out() { grep -q -- "$1" "$AC_TEST_TMP/out" || { cat "$AC_TEST_TMP/out"; fail "output lacks '$1'"; }; }
expect_no_out() { if grep -q -- "$1" "$AC_TEST_TMP/out"; then cat "$AC_TEST_TMP/out"; fail "output has '$1'"; fi; }
