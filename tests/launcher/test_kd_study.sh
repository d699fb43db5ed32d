#!/usr/bin/env bash
# scripts/kd_study.py on the tiny teacher (issue 32): one cell (seed 1), each student distilled
# in ONE run of 4 steps with a checkpoint kept at step 2; every point (the pruned student, step 2,
# step 4) scored on two benchmark tasks (--limit 4) and on loss / KL:
#  - the points are checkpoints of that one run (step numbers asserted; no other step_N.h5);
#  - both methods got the same KD tokens at each point (from metrics.jsonl);
#  - the page has a row per method and point with every column filled, the difference table,
#    and a valid PNG; a rerun scores nothing again (the point files are untouched);
#  - a rerun or --report-only with other scoring settings (--limit, --eval-samples) exits 2
#    naming the point file and the option, rescoring nothing.
source "$AC_SOURCE_DIR/tests/launcher/run_common.sh"
rm -rf "$T/scfg" "$T/study" "$T/study.md" "$T/study.png"
make_teacher
mkdir -p "$T/scfg"
write_cfg "$T/scfg/a.cfg"
sed -i 's/^tp = 2$/tp = 1/' "$T/scfg/a.cfg"
STUDY=($PY "$AC_SOURCE_DIR/scripts/kd_study.py" --configs "$T/scfg" --target a --seeds 1 --steps 4 --points 2
  --limit 4 --tasks arc_easy,piqa --eval-samples 2 --eval-seq-len 64 --out "$T/study" --results "$T/study.md"
  --ac "$AC_BIN" --set search.steps=4)
timeout 600 "${STUDY[@]}" >"$T/study1.log" 2>&1 || { cat "$T/study1.log"; for f in "$T"/study/*.log; do tail -30 "$f"; done; fail "kd_study"; }

R=$T/study/a-s1
for m in autocompress minitron; do
  got=$(cd "$R/distill-$m/checkpoints" && ls step_*.h5 | sort -V | tr '\n' ' ')
  [ "$got" = "step_2.h5 step_4.h5 " ] || fail "$m: checkpoints of the one run: $got"
  for p in 0 2 4; do [ -f "$R/study/$m-$p.json" ] || fail "$m: point $p not scored"; done
done

$PY - "$R/study" "$T/study.md" "$T/study.png" <<'PYEOF' || { cat "$T/study.md"; fail "study page"; }
import json, sys
d, page, png = sys.argv[1:]
recs = {(m, p): json.load(open(f"{d}/{m}-{p}.json")) for m in ("autocompress", "minitron") for p in (0, 2, 4)}
for (m, p), r in recs.items():
    assert r["step"] == p and r["checkpoint"].endswith("student" if p == 0 else f"step_{p}.h5"), r["checkpoint"]
    t = r["tasks"]
    assert sorted(x["task"] for x in t["per_task"]) == ["arc_easy", "piqa"], t["per_task"]
    assert 0 <= t["mean"] <= 1 and all(x["documents"] == 4 for x in t["per_task"]), t
    assert r["lm"]["loss"] > 0 and r["lm"]["kl_to_teacher"] >= 0, r["lm"]
# Same KD tokens for both methods at each point: 2 and 4 steps x micro-batch 2 x seq-len 32.
for p, want in ((0, 0), (2, 128), (4, 256)):
    assert recs[("autocompress", p)]["tokens"] == recs[("minitron", p)]["tokens"] == want, (p, want)
text = open(page).read()
rows = [l for l in text.splitlines() if l.startswith("| AutoCompress |") or l.startswith("| Minitron |")]
assert len(rows) == 6, rows
for r in rows:
    cells = [c.strip() for c in r.strip("|").split("|")]
    assert all(c and c != "-" for c in cells), f"an empty column in {r}"
assert "AutoCompress − Minitron" in text and "one seed" in text
# The page's command reproduces the study: its overrides and paths included.
cmd = next(l for l in text.splitlines() if l.startswith("Command: "))
assert "--set search.steps=4" in cmd and "--seeds 1" in cmd and "--limit 4" in cmd and "--out " in cmd, cmd
b = open(png, "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n" and len(b) > 10000, "not a PNG"
PYEOF

# A rerun scores nothing again.
before=$(stat -c %Y "$R"/study/*.json | sort | tr '\n' ' ')
timeout 120 "${STUDY[@]}" >"$T/study2.log" 2>&1 || { cat "$T/study2.log"; fail "kd_study rerun"; }
after=$(stat -c %Y "$R"/study/*.json | sort | tr '\n' ' ')
[ "$before" = "$after" ] || fail "a rerun rescored a point"
grep -q "run complete" "$T/study2.log" || { cat "$T/study2.log"; fail "the rerun reran the cell"; }
# Points scored one way are not reused, nor reported, as scored another way: exit 2 naming the
# file and the option, nothing rescored.
OTHER=("${STUDY[@]}")
for i in "${!OTHER[@]}"; do [ "${OTHER[$i]}" = "--limit" ] && OTHER[$((i + 1))]=3; done
rc=0
timeout 120 "${OTHER[@]}" >"$T/study3.log" 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat "$T/study3.log"; fail "another --limit: exit $rc, expected 2"; }
grep -q "scored with --limit 4, this run asks 3" "$T/study3.log" || { cat "$T/study3.log"; fail "no message naming --limit"; }
[ "$before" = "$(stat -c %Y "$R"/study/*.json | sort | tr '\n' ' ')" ] || fail "another --limit rescored a point"
for i in "${!OTHER[@]}"; do [ "${OTHER[$i]}" = "--limit" ] && OTHER[$((i + 1))]=4; done
OTHER+=(--report-only --eval-samples 3)
rc=0
timeout 120 "${OTHER[@]}" >"$T/study4.log" 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "scored with --eval-samples 2, this run asks 3" "$T/study4.log" || { cat "$T/study4.log"; fail "--report-only with another --eval-samples: exit $rc"; }
echo "PASS launcher.kd_study"
