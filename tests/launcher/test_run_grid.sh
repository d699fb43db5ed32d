#!/usr/bin/env bash
# scripts/run_grid.py on a tiny grid (issue 18): two targets of the tiny teacher (a: h100, TPOT
# <= 0.8x; b: rtx5080, TPOT <= 0.85x), seconds-long stages, one process each (tp 1):
#  - `--targets a,b --seeds 1` runs a-s1 and b-s1; `--targets a --seeds 1,2` skips a-s1 and runs
#    a-s2; `--targets a,b --seeds 1,2 --report-only` writes the page without running b-s2;
#  - the page has both targets and both methods, a's numbers as mean ± spread over 2 seeds,
#    every column of the method rows filled, the AutoCompress-minus-Minitron rows, the budget
#    met by both students and the same KD tokens, steps and seed for both (from their
#    manifests), b-s2 listed as not run, and a valid PNG plot;
#  - with `[eval] tasks` (two tiny zero-shot tasks): the mean accuracy and retention columns of
#    every method row filled, the AutoCompress − Minitron accuracy row with its verdict, the
#    per-task table with every cell filled, the teacher scored once per cell (teacher-tasks);
#  - rerunning the grid reruns no cell (every cell "skipped", in seconds);
#  - `--eval-limit 3` scores the teacher once and the students again on 3 documents per task, the
#    page's accuracy columns from those files, and a rerun scores nothing again;
#  - configs that differ outside the target exit 2 naming the key.
source "$AC_SOURCE_DIR/tests/launcher/run_common.sh"
rm -rf "$T/cfg" "$T/grid" "$T/results".* "$T"/grid*.log
make_teacher
make_tasks "$T/tasks"
mkdir -p "$T/cfg"
write_cfg "$T/cfg/a.cfg"
write_cfg "$T/cfg/b.cfg"
sed -i 's/^tp = 2$/tp = 1/' "$T/cfg/a.cfg" "$T/cfg/b.cfg"
sed -i "s|^\[eval\]\$|[eval]\ntasks = tiny_arc,tiny_wino,tiny_lambada\nlimit = 6\ntasks-dir = $T/tasks|" "$T/cfg/a.cfg" "$T/cfg/b.cfg"
sed -i 's/^hardware = h100$/hardware = rtx5080/; s/^target-tpot-ms-ratio = 0.8$/target-tpot-ms-ratio = 0.85/' "$T/cfg/b.cfg"
GRID=($PY "$AC_SOURCE_DIR/scripts/run_grid.py" --configs "$T/cfg" --out "$T/grid" --results "$T/results.md"
  --ac "$AC_BIN" --set distill.steps=4 --set search.steps=4)
grid() {  # grid LOG ARGS...: runs the grid, fails on a non-zero exit
  local log=$1; shift
  timeout 300 "${GRID[@]}" "$@" >"$T/$log" 2>&1 || { cat "$T/$log"; for f in "$T"/grid/*.log; do tail -20 "$f"; done; fail "run_grid $*"; }
}
grid grid1.log --targets a,b --seeds 1
grep -q "a-s1: running" "$T/grid1.log" && grep -q "b-s1: running" "$T/grid1.log" || { cat "$T/grid1.log"; fail "cells not run"; }
grid grid2.log --targets a --seeds 1,2
grep -q "a-s1: skipped" "$T/grid2.log" && grep -q "a-s2: running" "$T/grid2.log" || { cat "$T/grid2.log"; fail "a-s1 not skipped or a-s2 not run"; }
grid grid3.log --targets a,b --seeds 1,2 --report-only
grep -q "running" "$T/grid3.log" && { cat "$T/grid3.log"; fail "--report-only ran a cell"; }
[ -d "$T/grid/b-s2" ] && fail "--report-only made b-s2"

$PY - "$T/results.md" "$T/results.png" <<'PYEOF' || { cat "$T/results.md"; fail "results.md"; }
import re, sys
text = open(sys.argv[1]).read()
def section(name):
    m = re.search(r"^## %s: .*?(?=^## |\Z)" % name, text, re.S | re.M)
    assert m, f"no section for target {name}"
    return m.group(0)
assert re.search(r"\| `b-s2` \| not run \|", text), "b-s2 not listed as not run"
assert "| `a-s1` | complete |" in text and "| `a-s2` | complete |" in text and "| `b-s1` | complete |" in text
for name, seeds in (("a", 2), ("b", 1)):
    s = section(name)
    rows = [l for l in s.splitlines() if l.startswith("| AutoCompress |") or l.startswith("| Minitron |")]
    assert len(rows) == 2, f"{name}: method rows {rows}"
    header = next(l for l in s.splitlines() if l.startswith("| method |"))
    assert "mean accuracy %" in header and "retention vs teacher" in header, header
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert all(c and c != "-" for c in cells), f"{name}: an empty column in {r}"
        assert len(cells) == len(header.strip("|").split("|")), (header, r)
        acc, ret = float(cells[-2].split()[0]), float(cells[-1].split()[0])
        assert 0 <= acc <= 100 and 0 < ret < 5, f"{name}: accuracy {acc}, retention {ret}"
        assert cells[3] == "yes", f"{name}: budget not met: {r}"
        assert ("±" in r) == (seeds > 1), f"{name}: mean ± spread expected iff 2 seeds: {r}"
    assert "AutoCompress − Minitron" in s, f"{name}: no difference table"
    diff = [l for l in s.splitlines() if l.startswith("| eval loss | lower is better |")]
    assert diff and ("±" in diff[0]) == (seeds > 1), f"{name}: difference row {diff}"
    if seeds == 1:
        assert "one seed: no spread" in diff[0], diff
    else:
        assert "spread" in diff[0], diff
    acc = [l for l in s.splitlines() if l.startswith("| mean benchmark accuracy (points) | higher is better |")]
    acc = acc and [c.strip() for c in acc[0].strip("|").split("|")]
    assert acc and all(c and (c != "-" or (seeds == 1 and i in (4, 5))) for i, c in enumerate(acc)), f"{name}: accuracy row {acc}"
    assert ("±" in acc[2]) == (seeds > 1) and acc[6].startswith("one seed: no spread") == (seeds == 1), acc
    # every student kept its per-document scores: the verdict weighs the documents' paired error too
    assert re.search(r"; (within|beyond) twice the documents' paired standard error \([0-9.]+\)$", acc[6]), acc[6]
    # the reading note of a target where AutoCompress is not ahead in accuracy (by more than the
    # spread): the difference per seed with the documents' standard error and the task that moved it
    ahead = float(acc[2].split()[0]) > 0 and (seeds == 1 or acc[6].startswith("AutoCompress better"))
    note = re.search(r"^- \*\*%s: AutoCompress is not ahead of Minitron in mean accuracy.*$" % name, text, re.M)
    assert bool(note) != ahead, f"{name}: accuracy {acc}, note {note and note.group(0)}"
    assert not note or ("paired standard error of it ~" in note.group(0) and "most from tiny_" in note.group(0)), note.group(0)
    tasks = [l for l in s.splitlines() if re.match(r"\| (tiny_arc|tiny_wino|tiny_lambada|\*\*mean\*\*) \|", l)]
    assert len(tasks) == 4, f"{name}: per-task rows {tasks}"
    for l in tasks:
        cells = [c.strip() for c in l.strip("|").split("|")]
        assert all(c and (c != "-" or i == 1) for i, c in enumerate(cells)), f"{name}: an empty per-task cell in {l}"
    assert [c.strip() for c in tasks[0].strip("|").split("|")][1] == "25", tasks[0]  # 4 choices: chance 25%
cmds = [l for l in text.splitlines() if re.match(r"\| `[ab]-s\d` \| `", l)]
assert len(cmds) == 3, f"command rows: {cmds}"
for l in cmds:
    assert "run --config" in l and "--seed" in l, l
    cells = [c.strip() for c in l.strip("|").split("|")]
    assert cells[3] == "yes", f"the methods did not get the same KD tokens, steps and seed: {l}"
    assert "4 × 2 × 32 × DP 1 = 256; seen: 256 / 256" in cells[2], l
summary = re.search(r"^## Summary.*?(?=^## )", text, re.S | re.M).group(0)
assert "mean accuracy" in summary, "no accuracy verdict in the summary"
assert "![" in text and "results.png" in text, "no plot link"
png = open(sys.argv[2], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000, "results.png is not a PNG"
PYEOF

# A rerun reruns no cell.
start=$(date +%s)
grid grid4.log --targets a,b --seeds 1
grid grid5.log --targets a --seeds 1,2
took=$(($(date +%s) - start))
[ "$(grep -c ': skipped (all 14 stages done)' "$T/grid4.log" "$T/grid5.log" | awk -F: '{s += $2} END {print s}')" = 4 ] &&
  ! grep -q ": running\|: continuing" "$T/grid4.log" "$T/grid5.log" ||
  { cat "$T/grid4.log" "$T/grid5.log"; fail "a rerun reran a cell"; }
[ "$took" -lt 60 ] || fail "two reruns of done cells took ${took}s"

# --eval-limit 3: no cell rerun; the teacher scored once and a's four students again on the first
# 3 documents per task; the page's accuracy columns are those files'; a rerun rescored nothing.
grid grid6.log --targets a --seeds 1,2 --eval-limit 3
! grep -q ": running\|: continuing" "$T/grid6.log" && [ "$(grep -c ': done in' "$T/grid6.log")" = 5 ] ||
  { cat "$T/grid6.log"; fail "--eval-limit: cells rerun or not 5 scorings"; }
$PY - "$T/grid" "$T/results.md" "$AC_SOURCE_DIR/scripts" <<'PYEOF' || { cat "$T/results.md"; fail "--eval-limit page"; }
import json, re, sys
out, text = sys.argv[1], open(sys.argv[2]).read()
teacher = json.load(open(f"{out}/teacher-limit3/eval.json"))["tasks"]
assert teacher["limit"] == 3, teacher["limit"]
assert "the first 3 documents by doc_id" in text and "the first 6 documents" not in text
rows = {l.split("|")[1].strip(): [c.strip() for c in l.strip("|").split("|")] for l in text.splitlines()
        if l.startswith("| AutoCompress |") or l.startswith("| Minitron |") or l.startswith("| teacher |")}
for m, title in (("autocompress", "AutoCompress"), ("minitron", "Minitron")):
    ev = [json.load(open(f"{out}/a-s{s}/eval-limit3/{m}/eval.json"))["tasks"] for s in (1, 2)]
    assert all(e["limit"] == 3 and e["tasks"] == teacher["tasks"] for e in ev), ev
    want = 100 * sum(e["mean"] for e in ev) / 2
    got = float(rows[title][-2].split()[0])
    assert abs(got - want) < 0.05, (title, got, want)
assert abs(float(rows["teacher"][-2].split()[0]) - 100 * teacher["mean"]) < 0.05, rows["teacher"]
# The per-document scores are kept beside each rescoring, and the page's paired standard error
# reads them: recounted by each task's primary metric (multiple choice and the gold continuation
# of tiny_lambada) they give eval.json's accuracies, and the paired difference is the means'.
sys.path.insert(0, sys.argv[3])
import run_grid
for s in (1, 2):
    dirs = [f"{out}/a-s{s}/eval-limit3/{m}" for m in ("autocompress", "minitron")]
    blocks = [json.load(open(f"{d}/eval.json"))["tasks"] for d in dirs]
    for d, b in zip(dirs, blocks):
        hits = run_grid.doc_correct(f"{d}/requests.jsonl", b)
        assert hits and sorted(hits) == sorted(b["tasks"]) and all(len(h) == 3 for h in hits.values()), (d, hits)
    diff, se = run_grid.paired_difference(dirs[0], blocks[0], dirs[1], blocks[1])
    assert abs(diff - (blocks[0]["mean"] - blocks[1]["mean"])) < 1e-9 and se >= 0, (diff, se, blocks)
PYEOF
grid grid7.log --targets a --seeds 1,2 --eval-limit 3
[ "$(grep -c 'skipped (scored)' "$T/grid7.log")" = 5 ] || { cat "$T/grid7.log"; fail "--eval-limit rerun rescored"; }
expect_rc 2 "${GRID[@]}" --targets a --eval-limit 0
expect_out "--eval-limit: expected a positive number of documents"

# Configs that differ outside the target: exit 2 naming the key.
write_cfg "$T/cfg/c.cfg" && sed -i 's/^tp = 2$/tp = 1/; s/^steps = 12$/steps = 13/' "$T/cfg/c.cfg"
sed -i "s|^\\[eval\\]\$|[eval]\\ntasks = tiny_arc,tiny_wino,tiny_lambada\\nlimit = 6\\ntasks-dir = $T/tasks|" "$T/cfg/c.cfg"
expect_rc 2 "${GRID[@]}" --targets a,c --dry-run
expect_out "configs differ outside the target: \[distill\] steps"
rm -f "$T/cfg/c.cfg"
echo "PASS launcher.run_grid (rerun of done cells ${took}s)"
