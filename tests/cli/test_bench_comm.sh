#!/usr/bin/env bash
# `autocompress bench comm` under 2 ranks, small sizes: a table with both implementations
# and a ratio per row, plus the JSONL and manifest.
source "$(dirname "$0")/lib.sh"
T=$AC_TEST_TMP
rm -rf "$T/bench"
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" bench comm --min-bytes 64KiB --max-bytes 256KiB --seconds 0.05 --out "$T/bench"
expect_out "ratio = ours / raw MPI"
expect_out "all_reduce f32"
expect_out "all_gather bf16"
rows=$(grep -cE '^all_(reduce|gather) ' "$T/out")
[ "$rows" -eq 12 ] || fail "expected 12 rows (2 ops x 2 dtypes x 3 sizes), got $rows"
python3 - "$T" <<'PY' || fail "bench jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/bench/comm_bench.jsonl")]
assert len(rows) == 12
for r in rows:
    assert r["ours_busbw_GBps"] > 0 and r["mpi_busbw_GBps"] > 0, r
    assert abs(r["ratio"] - r["ours_busbw_GBps"] / r["mpi_busbw_GBps"]) < 1e-9
assert json.load(open(sys.argv[1] + "/bench/manifest.json"))["subcommand"] == "bench comm"
print("jsonl ok")
PY
expect_rc 2 "$AC_BIN" bench comm --dtypes f64
expect_out "unknown dtype 'f64'"
echo PASS
