#!/usr/bin/env bash
# A rank that throws ends the whole job with its message and a non-zero exit within 30 s.
set -u
mkdir -p "$AC_TEST_TMP"
fail() { echo "FAIL: $*"; exit 1; }
for kind in runtime input; do
  start=$(date +%s)
  timeout 30 $MPIEXEC -n 2 "$AC_ABORT_PROBE" $kind >"$AC_TEST_TMP/out_$kind" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  cat "$AC_TEST_TMP/out_$kind"
  [ $rc -ne 124 ] || fail "$kind: the job hung (killed by timeout after 30 s)"
  [ $rc -ne 0 ] || fail "$kind: exit code 0"
  if [ $kind = runtime ]; then
    grep -q "\[rank 1/2\] autocompress: error: probe failure on rank 1" "$AC_TEST_TMP/out_$kind" || fail "runtime: message missing"
    [ $rc -eq 1 ] || fail "runtime: exit code $rc, want 1"
  else
    grep -q "probe.cfg: tp: probe input error on rank 1" "$AC_TEST_TMP/out_$kind" || fail "input: message missing"
    [ $rc -eq 2 ] || fail "input: exit code $rc, want 2"
  fi
  echo "$kind: exit $rc after ${elapsed}s"
done
echo "PASS"
