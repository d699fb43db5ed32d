#!/usr/bin/env bash
# `checkpoint inspect` / `verify` on a real file, and h5py reading it back (bf16 included).
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
rm -rf "$T/ckpt"
expect_rc 0 $MPIEXEC -n 2 "$AC_CKPT_PROBE" "$T/ckpt" 1 2 7
expect_rc 0 "$AC_BIN" checkpoint inspect "$T/ckpt"
expect_out "step_8.h5"
expect_out "model/w_bf16 *bfloat16 *\[256, 1024\]"
expect_out "tokens_seen *32768"
expect_rc 0 "$AC_BIN" checkpoint inspect "$T/ckpt/step_7.h5" --json
python3 -c "import json; d=json.load(open('$T/out')); assert d['attributes']['step']==7, d['attributes']" || fail "inspect --json"
expect_rc 0 "$AC_BIN" checkpoint verify "$T/ckpt"
expect_out "checksums match"
expect_rc 2 "$AC_BIN" checkpoint verify "$T/nothing-here"
expect_out "nothing-here: file: no such checkpoint"
mkdir -p "$T/empty"
expect_rc 2 "$AC_BIN" checkpoint inspect "$T/empty"
expect_out "empty/latest: latest: no checkpoint pointer"
if /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  /usr/bin/python3 "$AC_SOURCE_DIR/scripts/check_checkpoint_h5py.py" "$T/ckpt/step_8.h5" || fail "h5py check"
else
  echo "h5py not installed: skipped the h5py read-back"
fi
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" bench checkpoint --dir "$T/bench" --bytes 8MiB --repeats 1 --keep-cache
expect_out "ratio = median over repeats of (checkpoint / other)"
expect_out "^write: checkpoint [0-9.]*, plain [0-9.]*, plain write-behind [0-9.]*, safetensors [0-9.]*$"
expect_out "^  ratio to safetensors [0-9]"
expect_out "^read: checkpoint [0-9.]*, plain [0-9.]*$"
expect_out "^checkpoint save phases"
echo PASS
