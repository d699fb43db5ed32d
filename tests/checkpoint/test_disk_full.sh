#!/usr/bin/env bash
# A checkpoint write that runs out of disk (a 3 MiB tmpfs) fails with a clear message and a
# non-zero exit; the previous checkpoint and `latest` stay intact. Needs root to mount.
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
mnt="$T/small"
mkdir -p "$mnt"
umount "$mnt" 2>/dev/null
if ! mount -t tmpfs -o size=3m tmpfs "$mnt" 2>/dev/null; then echo "SKIP: cannot mount a tmpfs here"; exit 77; fi
trap 'umount "$mnt" 2>/dev/null' EXIT
for np in 1 2; do
  rm -rf "$mnt"/*
  expect_rc 0 $MPIEXEC -n $np "$AC_CKPT_PROBE" "$mnt/ckpt" 1 1 1
  timeout 60 $MPIEXEC -n $np "$AC_CKPT_PROBE" "$mnt/ckpt" 8 1 2 >"$T/out" 2>&1
  rc=$?
  cat "$T/out"
  [ $rc -ne 0 ] || fail "np $np: a write that cannot fit exited 0"
  [ $rc -ne 124 ] || fail "np $np: hung"
  grep -q "step_2.h5.tmp" "$T/out" || fail "np $np: message does not name the file"
  [ "$(cat "$mnt/ckpt/latest")" = "step_1.h5" ] || fail "np $np: latest moved"
  expect_rc 0 "$AC_BIN" checkpoint verify "$mnt/ckpt"
  echo "np $np: disk full -> exit $rc, step_1 intact"
done
echo PASS
