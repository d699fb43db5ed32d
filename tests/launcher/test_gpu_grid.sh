#!/usr/bin/env bash
# scripts/gpu_grid.sh in its CPU form (--tiny; issue 32): the GPU grid's every --set key applied
# at tiny sizes to one cell of the tiny teacher; ONE results file that holds every cell's small
# files and no checkpoint; `run_grid.py --report-only` on the unpacked file writes the page with
# the cell complete, both methods' rows filled and the benchmark accuracy in them.
source "$AC_SOURCE_DIR/tests/launcher/run_common.sh"
rm -rf "$T/gcfg" "$T/gg" "$T/unpacked" "$T/gg.tgz"
make_teacher
mkdir -p "$T/gcfg" "$T/unpacked"
write_cfg "$T/gcfg/a.cfg"
sed -i 's/^tp = 2$/tp = 1/' "$T/gcfg/a.cfg"
AC_BIN=$AC_BIN GPU_GRID_OUT=$T/gg timeout 500 bash "$AC_SOURCE_DIR/scripts/gpu_grid.sh" --tiny --results "$T/gg.tgz" \
  --configs "$T/gcfg" --targets a --seeds 1 >"$T/gg.log" 2>&1 || { cat "$T/gg.log"; tail -30 "$T"/gg/*.log; fail "gpu_grid.sh --tiny"; }
grep -q "4 KD steps x 2 x 32 = 256 tokens per student" "$T/gg.log" || { cat "$T/gg.log"; fail "KD size line"; }
tar tzf "$T/gg.tgz" >"$T/gg.list" || fail "results file is not a tar.gz"
grep -q '\.h5$' "$T/gg.list" && fail "checkpoints in the results file"
grep -q "^gg/a-s1/manifest.json$" "$T/gg.list" || { cat "$T/gg.list"; fail "no manifest in the results file"; }
tar xzf "$T/gg.tgz" -C "$T/unpacked"
$PY "$AC_SOURCE_DIR/scripts/run_grid.py" --report-only --configs "$T/gcfg" --targets a --seeds 1 --out "$T/unpacked/gg" \
  --results "$T/unpacked/results.md" >"$T/report.log" 2>&1 || { cat "$T/report.log"; fail "report from the results file"; }
$PY - "$T/unpacked/results.md" <<'PYEOF' || { cat "$T/unpacked/results.md"; fail "page from the results file"; }
import sys
text = open(sys.argv[1]).read()
assert "| `a-s1` | complete |" in text, "cell not complete"
rows = [l for l in text.splitlines() if l.startswith("| AutoCompress |") or l.startswith("| Minitron |")]
assert len(rows) >= 2, rows
for r in rows[:2]:
    cells = [c.strip() for c in r.strip("|").split("|")]
    assert all(c and c != "-" for c in cells), f"an empty column in {r}"
assert "accuracy" in text.lower(), "no benchmark accuracy on the page"
PYEOF
# both methods chose after the same short KD of each candidate (equal steps of 2 x the same seq-len)
$PY - "$T/unpacked/gg/a-s1" <<'PYEOF' || fail "candidates not scored after the same short KD"
import json, sys
d = sys.argv[1]
search = json.load(open(f"{d}/search/search_report.json"))["candidates_scored_by"]["kd_steps"]
minitron = json.load(open(f"{d}/minitron/candidates.json"))["score_kd_steps"]
assert search == minitron == 2, (search, minitron)
PYEOF
echo "PASS launcher.gpu_grid"
