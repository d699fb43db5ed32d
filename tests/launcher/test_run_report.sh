#!/usr/bin/env bash
# scripts/run_report.py on a run directory made from tests/fixtures/run (the small JSON
# outputs of a real tiny run, see its README) plus a stand-in teacher checkpoint that holds the
# teacher's arch_spec attribute: report.md has every section, each PNG is a valid PNG, the
# per-layer picture shows the skipped layers; a run with one method or without the scorecard
# and samples stages still reports and says what is absent (stale plots removed); a malformed
# search_report.json or metrics.jsonl exits 2 with one message naming the file and leaves the
# previous report.md as it was.
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
rm -rf "$T"/*
FIX=$AC_SOURCE_DIR/tests/fixtures/run
REPORT=$AC_SOURCE_DIR/scripts/run_report.py
SYS_PY=/usr/bin/python3  # Debian's python3: h5py and matplotlib from scripts/setup.sh
# The script is run as the launcher runs it, with the python3 on PATH (it reruns itself under
# /usr/bin/python3 when that one lacks matplotlib).

# make_run DIR: the fixture run plus RUN/teacher/step_30.h5 (only the arch_spec attribute of
# the real teacher checkpoint, as autocompress writes it) and a small export/.
make_run() {
  local d=$1
  mkdir -p "$d" && cp -r "$FIX"/. "$d"/ && rm -f "$d/README.md" "$d/teacher/arch_spec.json"
  $SYS_PY - "$FIX/teacher/arch_spec.json" "$d/teacher/step_30.h5" <<'PY' || fail "stand-in teacher checkpoint"
import json, sys
import h5py
spec = json.dumps(json.load(open(sys.argv[1])), separators=(",", ":"))
with h5py.File(sys.argv[2], "w") as f:
    f.attrs["format"] = "autocompress-checkpoint"
    f.attrs["arch_spec"] = spec
PY
  echo step_30.h5 >"$d/teacher/latest"
  for m in autocompress minitron; do
    mkdir -p "$d/export/$m/hf" "$d/export/$m/hdf5"
    echo '{}' >"$d/export/$m/hf/config.json"
    echo step_20.h5 >"$d/export/$m/hdf5/latest"
  done
}

# check_pngs DIR NAME...: each DIR/plots/NAME is a PNG with a positive width and height.
check_pngs() {
  local d=$1; shift
  $SYS_PY - "$d/plots" "$@" <<'PY' || fail "plots"
import struct, sys
d = sys.argv[1]
for name in sys.argv[2:]:
    b = open(f"{d}/{name}", "rb").read(33)
    assert b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR", (name, b[:16])
    w, h = struct.unpack(">II", b[16:24])
    assert w > 0 and h > 0, (name, w, h)
    print(f"{name}: PNG {w}x{h}")
PY
}

# 1. The whole run: both methods, every stage.
R=$T/run
make_run "$R"
expect_rc 0 python3 "$REPORT" "$R"
expect_out "wrote $R/report.md and 4 plots"
[ -f "$R/report.md" ] && [ ! -e "$R/report.md.tmp" ] || fail "no report.md (or its tmp left)"
for s in "## What is absent" "## Summary" "## Stages" "## Binding constraint" "## KD loss" "## Constraints during the search" \
         "## Per-layer architecture" "## Quality vs latency and memory" "## Scorecard" "## Eval" "## Samples" "## Exports" \
         "](plots/kd_loss.png)" "](plots/constraints.png)" "](plots/layers.png)" "](plots/pareto.png)" \
         'the binding constraint is **`--target-tpot-ms-ratio`**' "| distill-minitron | skipped |" \
         "| tpot_ms | ≤ 0.8 | 0.7535 | 94.2% |" "### Scorecard: cpu-local, engine local-eager" \
         "| AutoCompress | 6.827M | 8.376 | 8.517 | 0.01397 | 9.336 (0.88x) |" "| A fortune: |" "| autocompress | hf |" "Nothing: every stage's output is here."; do
  grep -qF -- "$s" "$R/report.md" || { cat "$R/report.md"; fail "report.md lacks '$s'"; }
done
check_pngs "$R" kd_loss.png constraints.png layers.png pareto.png
# The per-layer picture: AutoCompress removed the Mamba layers 0 and 4, Minitron dropped the MoE layer 5.
grep -qF "| 0 | mamba 4x32 | **skipped** | mamba 4x32 |" "$R/report.md" || fail "layer 0 not shown skipped"
grep -qF "| 5 | moe 4x128 +128 | moe 4x128 +128 | **skipped** |" "$R/report.md" || fail "layer 5 not shown skipped"
$SYS_PY - "$R/plots/layers.json" <<'PY' || fail "layers.json"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["layers"] == 6 and p["teacher"]["kinds"] == ["M", "-", "*", "-", "M", "E"], p["teacher"]
ac, mt = p["students"]["autocompress"], p["students"]["minitron"]
assert ac["skipped"] == [0, 4] and mt["skipped"] == [5], (ac["skipped"], mt["skipped"])
assert ac["kept"]["mamba"] == [0.0, None, None, None, 0.0, None], ac["kept"]["mamba"]
assert ac["kept"]["attn_heads"][2] == 0.5 and ac["kept"]["ffn"][1] == 1.0, ac["kept"]
assert mt["kept"]["experts"][5] == 0.0 and mt["kept"]["mamba"][0] == 1.0, mt["kept"]
print("layers.json ok")
PY

# 2. One method (method = autocompress): no Minitron outputs at all, and none expected.
R1=$T/only-ac
make_run "$R1"
rm -rf "$R1/minitron" "$R1/distill-minitron" "$R1/eval/minitron" "$R1/eval/minitron-pruned" "$R1/export/minitron"
rm -rf "$R1/eval/teacher"  # the teacher has no eval.json: every model's quality then comes from the scorecard
$SYS_PY - "$R1" <<'PY' || fail "editing the manifest"
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
m["config"]["method"] = "autocompress"
m["stages"] = [s for s in m["stages"] if "minitron" not in s["name"]]
s = json.load(open(sys.argv[1] + "/scorecard/scorecard.json"))
s["rows"] = [r for r in s["rows"] if "minitron" not in r["candidate"]]
x = json.load(open(sys.argv[1] + "/samples/samples.json"))
for e in x:
    del e["outputs"]["minitron"]
for name, obj in (("manifest.json", m), ("scorecard/scorecard.json", s), ("samples/samples.json", x)):
    json.dump(obj, open(f"{sys.argv[1]}/{name}", "w"))
PY
expect_rc 0 python3 "$REPORT" "$R1"
grep -qF "Methods: AutoCompress (method = autocompress)." "$R1/report.md" || fail "one-method header"
grep -qF "| layer | teacher (hidden 128) | AutoCompress (hidden 128) |" "$R1/report.md" || fail "one-method layer table"
grep -qF "| AutoCompress | 6.827M | 8.385 | - | 0.01428 |" "$R1/report.md" || fail "summary from the scorecard's quality"
grep -qF "eval loss and KL from the scorecard's quality columns." "$R1/report.md" || fail "Pareto quality source"
grep -qF -- '- `eval/teacher/eval.json`: its eval row.' "$R1/report.md" || fail "missing teacher eval not said"
! grep -q "Minitron" "$R1/report.md" || { grep -n Minitron "$R1/report.md"; fail "a Minitron line in a one-method report"; }
check_pngs "$R1" kd_loss.png constraints.png layers.png pareto.png

# 3. Stages missing (scorecard, samples, distill-minitron), reported over the first report's directory.
rm -rf "$R/scorecard" "$R/samples" "$R/distill-minitron"
expect_rc 0 python3 "$REPORT" "$R"
for s in '- `scorecard/scorecard.json`: the scorecard' '- `samples/samples.json`: the samples stage' \
         '- `distill-minitron/metrics.jsonl`: Minitron distillation metrics' \
         'No `scorecard/scorecard.json`: no measured latency or memory, no Pareto plot.' \
         'No generated samples (`samples/samples.json`).'; do
  grep -qF -- "$s" "$R/report.md" || { cat "$R/report.md"; fail "report.md lacks '$s'"; }
done
[ ! -e "$R/plots/pareto.png" ] || fail "a stale pareto.png was left"
check_pngs "$R" kd_loss.png constraints.png layers.png

# 4. Malformed inputs: exit 2, one line naming the file; the previous report stays.
cp "$R/report.md" "$T/report.before"
printf '{"format": "autocompress.search_report", "binding": ' >"$R/search/search_report.json"
expect_rc 2 python3 "$REPORT" "$R"
expect_out "^run_report: $R/search/search_report.json: malformed JSON: "
[ "$(wc -l <"$T/out")" = 1 ] || { cat "$T/out"; fail "more than one line for a malformed file"; }
cmp -s "$R/report.md" "$T/report.before" || fail "a failed report replaced report.md"
cp "$FIX/search/search_report.json" "$R/search/"
echo '{"step": 21, "kd_loss": 0.1' >>"$R1/search/metrics.jsonl"
expect_rc 2 python3 "$REPORT" "$R1"
expect_out "^run_report: $R1/search/metrics.jsonl: line 21: malformed JSON: "
expect_rc 2 python3 "$REPORT" "$T/no-such-run"
expect_out "no-such-run: not a run directory"
echo PASS
