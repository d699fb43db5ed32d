#!/usr/bin/env bash
# CRC32 checks of partly read slices at TP 2 (issue 35), on a real file. A checkpoint written by
# one rank (each dataset one slice, with the CRC32 of every block of its tile grid) is evaluated
# at TP 2, where each rank reads only its part of each weight. A bit flipped with h5py in a block
# that only one rank reads (rows of the vocab-parallel embedding, columns of a row-parallel
# down_proj) stops the job: exit 2, one error message, from that rank, naming the file, the
# dataset and the block. --skip-checksums reads the damaged file anyway; a file without tile
# CRCs (as written before them) still loads at TP 2 and gives the same loss.
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
PY=/usr/bin/python3
rm -rf "${T:?}"/*
$PY -c "import h5py" 2>/dev/null || { echo "h5py is not installed: skipped"; exit 77; }
TOK=$AC_SOURCE_DIR/tests/fixtures/data/tokenizer/gpt2-4k.tokenizer.json
expect_rc 0 "$AC_BIN" data preprocess --input "$AC_SOURCE_DIR/tests/fixtures/data/corpus/fortunes_sample.jsonl" \
  --tokenizer "$TOK" --output "$T/fortunes" --quiet
expect_rc 0 "$AC_BIN" pretrain --arch "$AC_SOURCE_DIR/configs/models/tiny-teacher.json" --data "$T/fortunes" --seq-len 32 \
  --micro-batch 2 --steps 1 --eval-interval 0 --save-interval 0 --dtype f32 --out "$T/run"
CLEAN=$T/run/checkpoints
STEP=$(cat "$CLEAN/latest")
EVAL=(eval --data "$T/fortunes" --seq-len 32 --samples 4 --dtype f32 --tp 2 --json --quiet)
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" "${EVAL[@]}" --model "$CLEAN"
LOSS=$(grep -o '"loss":[^,]*' "$AC_TEST_TMP/out")
[ -n "$LOSS" ] || fail "no loss from the clean checkpoint"

# damage NAME DATASET ROW COL RANK: $T/NAME, a copy of the checkpoint with one bit of
# DATASET[ROW, COL] flipped by h5py; checks that the block of the tile grid holding it lies in
# the part RANK reads at TP 2 (rows of a [vocab, hidden] embedding, columns of a [hidden, ffn]
# down_proj, each split in halves) and sets BLOCK to the block's "[row, col] of shape [r, c]".
damage() {
  cp -r "$CLEAN" "$T/$1"
  BLOCK=$($PY - "$T/$1/$STEP" "$2" "$3" "$4" "$5" <<'PYEOF'
import json, sys
import h5py, numpy as np
path, name, row, col, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with h5py.File(path, "r+") as f:
    d = f[name]
    assert d.dtype == np.float32 and d.ndim == 2, (d.dtype, d.shape)
    v = np.array(d[row, col], dtype=np.float32)
    v.view(np.uint32)[...] ^= np.uint32(1 << 20)
    d[row, col] = v
    (s,) = json.loads(d.attrs["crc32_slices"])  # written by one rank: one slice
    t = s["tile"]
    b = [row // t[0] * t[0], col // t[1] * t[1]]
    shape = [min(t[k], d.shape[k] - b[k]) for k in range(2)]
    dim = 0 if name.endswith("embed.weight") else 1  # the dimension TP splits
    half = d.shape[dim] // 2
    lo, hi = (0, half) if rank == 0 else (half, d.shape[dim])
    assert lo <= b[dim] and b[dim] + shape[dim] <= hi, ("the block is not in rank %d's half" % rank, b, shape)
print("[%d, %d] of shape [%d, %d]" % (b[0], b[1], shape[0], shape[1]))
PYEOF
  ) || fail "h5py could not flip a bit of $2 in $T/$1"
}
# stopped NAME DATASET RANK: evaluating $T/NAME at TP 2 ends with exit 2 and one error message,
# from RANK, naming the file, DATASET and $BLOCK.
stopped() {
  expect_rc 2 $MPIEXEC -n 2 "$AC_BIN" "${EVAL[@]}" --model "$T/$1"
  expect_out "\[rank $3/2] autocompress: error: $T/$1/$STEP: $2: checksum mismatch in the block at offset ${BLOCK//[/\\[}"
  [ "$(grep -c 'autocompress: error:' "$AC_TEST_TMP/out")" = 1 ] || { cat "$AC_TEST_TMP/out"; fail "$1: not one error message"; }
}
damage embed model/embed.weight 3000 5 1
stopped embed model/embed.weight 1
damage down model/layers.1.mlp.down_proj.weight 10 20 0
stopped down model/layers.1.mlp.down_proj.weight 0
# --skip-checksums: the damaged file is read as it is.
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" "${EVAL[@]}" --model "$T/embed" --skip-checksums
# A file from before the tile CRCs (crc32_slices without them): still loaded at TP 2; only the
# slices a rank reads whole are checked then.
cp -r "$CLEAN" "$T/old"
$PY - "$T/old/$STEP" <<'PYEOF' || fail "h5py could not rewrite crc32_slices"
import json, sys
import h5py
with h5py.File(sys.argv[1], "r+") as f:
    def strip(name, d):
        if isinstance(d, h5py.Dataset) and "crc32_slices" in d.attrs:
            s = json.loads(d.attrs["crc32_slices"])
            assert all("tile" in x for x in s if x["shape"]), (name, s)
            d.attrs["crc32_slices"] = json.dumps([{k: v for k, v in x.items() if not k.startswith("tile")} for x in s])
    f.visititems(strip)
PYEOF
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" "${EVAL[@]}" --model "$T/old"
[ "$(grep -o '"loss":[^,]*' "$AC_TEST_TMP/out")" = "$LOSS" ] || fail "the file without tile CRCs gives another loss"
expect_rc 0 "$AC_BIN" checkpoint verify "$T/old"
echo PASS
