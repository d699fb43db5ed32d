#!/usr/bin/env bash
# `autocompress data ...` end to end: preprocess the corpus sample to both formats with 1 and
# 2 workers, inspect, bad inputs (exit 2, message with file and line, no files left), and
# sampling with a cursor saved under DP 2 and resumed under DP 4.
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
rm -rf "$T"/*
FIX=$AC_SOURCE_DIR/tests/fixtures/data
TOK=$FIX/tokenizer/gpt2.tokenizer.json
CORPUS=$FIX/corpus/fortunes_sample.jsonl

expect_rc 0 "$AC_BIN" data preprocess --input "$CORPUS" --tokenizer "$TOK" --output "$T/m1" --workers 1
expect_out "wrote $T/m1.idx, $T/m1.bin: 1521 documents"
expect_rc 0 "$AC_BIN" data preprocess --input "$CORPUS" --tokenizer "$TOK" --output "$T/m2" --workers 2 --quiet
cmp "$T/m1.bin" "$T/m2.bin" || fail "1 and 2 workers differ (.bin)"
cmp "$T/m1.idx" "$T/m2.idx" || fail "1 and 2 workers differ (.idx)"
expect_rc 0 "$AC_BIN" data preprocess --input "$CORPUS" --tokenizer "$TOK" --output "$T/h" --format hdf5 --quiet
[ -f "$T/h.h5" ] || fail "no h.h5"
[ -f "$T/manifest.json" ] || fail "no manifest.json"
expect_rc 0 "$AC_BIN" data inspect "$T/m1" --json
python3 -c "import json; d=json.load(open('$T/out')); assert d['format']=='megatron' and d['dtype']=='uint16' and d['documents']==1521, d" \
  || fail "inspect megatron"
TOKENS=$(python3 -c "import json; print(json.load(open('$T/out'))['tokens'])")
expect_rc 0 "$AC_BIN" data inspect "$T/h.h5" --json
python3 -c "import json; d=json.load(open('$T/out')); assert d['format']=='hdf5' and d['tokens']==$TOKENS, d" || fail "inspect hdf5"

# Bad inputs: exit 2, file and line named, nothing left behind.
mkdir -p "$T/bad"
printf '{"text": "fine"}\n{"text": "bad \xff byte"}\n' > "$T/bad/u.jsonl"
expect_rc 2 "$AC_BIN" data preprocess --input "$T/bad/u.jsonl" --tokenizer "$TOK" --output "$T/bad/out"
expect_out "u.jsonl: line 2: invalid UTF-8"
: > "$T/bad/empty.jsonl"
expect_rc 2 "$AC_BIN" data preprocess --input "$T/bad/empty.jsonl" --tokenizer "$TOK" --output "$T/bad/out" --format hdf5
expect_out "empty.jsonl: input: is empty"
expect_rc 2 "$AC_BIN" data preprocess --input "$CORPUS" --tokenizer "$TOK" --output "$T/bad/out" --max-doc-tokens 20
expect_out "fortunes_sample.jsonl: line [0-9]*: document has"
[ -z "$(ls "$T/bad" | grep -v -e u.jsonl -e empty.jsonl)" ] || fail "partial outputs left: $(ls "$T/bad")"
head -c 100 "$T/m1.idx" > "$T/bad/t.idx"; cp "$T/m1.bin" "$T/bad/t.bin"
expect_rc 2 "$AC_BIN" data inspect "$T/bad/t"
expect_out "t.idx: byte 18: sequence count 1521 does not fit"

# Sampling: DP 2 for 3 steps, cursor saved, DP 4 resumes; equals DP 1 reading throughout.
S="--data 0.7:$T/m1 0.3:$T/h.h5 --seq-len 32 --seed 7 --micro-batch-size 2"
expect_rc 0 "$AC_BIN" data sample $S --dp-size 1 --steps 30 --tokens
grep -o '"sample":[0-9]*,"dataset":[0-9]*,"dataset_sample":[0-9]*,"tokens":\[[0-9,]*\]' "$T/out" > "$T/ref"
expect_rc 0 "$AC_BIN" data sample $S --dp-size 2 --steps 3 --tokens --cursor-out "$T/cursor.json"
grep -o '"sample":[0-9]*,"dataset":[0-9]*,"dataset_sample":[0-9]*,"tokens":\[[0-9,]*\]' "$T/out" > "$T/got"
python3 -c "import json; c=json.load(open('$T/cursor.json')); assert c['consumed_samples']==12, c" || fail "cursor"
expect_rc 0 "$AC_BIN" data sample $S --dp-size 4 --steps 6 --tokens --cursor-in "$T/cursor.json"
grep -o '"sample":[0-9]*,"dataset":[0-9]*,"dataset_sample":[0-9]*,"tokens":\[[0-9,]*\]' "$T/out" >> "$T/got"
cmp "$T/ref" "$T/got" || fail "resume under another DP size changed the sample stream"
# Under mpirun each rank draws its own DP slice: together they are the single-process stream.
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" data sample $S --dp-size 2 --steps 3 --tokens
grep -o '"sample":[0-9]*,"dataset":[0-9]*,"dataset_sample":[0-9]*,"tokens":\[[0-9,]*\]' "$T/out" | sort > "$T/mpi"
head -n 12 "$T/ref" | sort | cmp - "$T/mpi" || fail "2 MPI ranks did not draw the 12 samples of one process"
expect_rc 2 "$AC_BIN" data sample --data "$T/m1" --seq-len 32 --seed 8 --cursor-in "$T/cursor.json"
expect_out "cursor.json: seed"
echo "PASS"
