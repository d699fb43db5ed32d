#!/usr/bin/env bash
# `autocompress run` end to end at 2 ranks (TP 2) on a briefly pretrained tiny Nemotron-H
# teacher (configs/models/tiny-teacher.json) and a slice of the fortunes corpus, with
# seconds-long stages:
#  - every stage runs; the report and its PNGs exist; each exported student meets the target by
#    the exact cost model and, imported back, gives the distilled checkpoint's eval loss;
#  - the same command again skips every stage; changing distill.steps reruns distill and what
#    follows, not importance or the searches;
#  - SIGKILL of every process of the run (its session) during the search and again during
#    distillation: nothing outlives it; rerunning the same command
#    finishes, skips the stages already done, and ends with the same eval loss (bitwise);
#  - bad configs (unknown stage key, unknown section, an unreachable target, a teacher that does
#    not exist, EP or sequence parallelism the layout cannot run) exit 2 naming it before any
#    stage starts; [search] / [distill] sequence-parallel reach those stages' calls.
source "$AC_SOURCE_DIR/tests/launcher/run_common.sh"
rm -rf "$T/teacher" "$T/A" "$T/A-back" "$T/B" "$T/bad"* "$T"/*.cfg
make_teacher
write_cfg "$T/run.cfg"
RUN=(timeout 600 $MPIEXEC -n 2 "$AC_BIN" run --config "$T/run.cfg")

# ---- the whole run
"${RUN[@]}" --out "$T/A" >"$T/A.log" 2>&1 || { cat "$T/A.log"; fail "run A"; }
for s in teacher data importance search minitron distill-autocompress distill-minitron eval scorecard samples \
  export-autocompress export-minitron report; do
  grep -q "\[run\] stage .* $s: starting" "$T/A.log" || { cat "$T/A.log"; fail "stage $s did not run"; }
done
for f in manifest.json report.md plots/kd_loss.png plots/layers.png plots/pareto.png plots/constraints.png \
  samples/samples.json scorecard/scorecard.json eval/teacher/eval.json eval/autocompress/eval.json \
  eval/minitron-pruned/eval.json export/autocompress/hf/config.json export/minitron/hf/config.json \
  export/autocompress/hdf5/latest; do
  [ -s "$T/A/$f" ] || { cat "$T/A.log"; fail "run left no $f"; }
done
$PY - "$T/A" <<'PYEOF' || fail "run outputs"
import json, os, struct, sys
run = sys.argv[1]
m = json.load(open(f"{run}/manifest.json"))
assert [s["status"] for s in m["stages"]] == ["done"] * 13, m["stages"]
assert len(m["budgets"]) == 1 and m["budgets"][0]["as"] == "--target-tpot-ms", m["budgets"]
for png in ("kd_loss", "layers", "pareto", "constraints"):
    b = open(f"{run}/plots/{png}.png", "rb").read(24)
    assert b[:8] == b"\x89PNG\r\n\x1a\n", png
    w, h = struct.unpack(">II", b[16:24])
    assert w > 100 and h > 100, (png, w, h)
rep = open(f"{run}/report.md").read()
for section in ("Stages", "Binding constraint", "Per-layer", "Scorecard", "Samples"):
    assert section.lower() in rep.lower(), section
s = json.load(open(f"{run}/samples/samples.json"))
assert len(s) == 2 and set(s[0]["outputs"]) == {"teacher", "autocompress", "minitron"}, s
PYEOF
# Each export meets the target by the exact cost model.
LIMIT=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['budgets'][0]['limit'])" "$T/A/manifest.json")
for m in autocompress minitron; do
  expect_rc 0 "$AC_BIN" cost predict --arch "$T/A/export/$m/hf/config.json" --hardware h100 --engine local-eager \
    --workload in-game --json
  $PY - "$AC_TEST_TMP/out" "$LIMIT" <<'PYEOF' || fail "$m export over budget"
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])
tpot = j["tpot_s"] * 1e3
assert tpot <= float(sys.argv[2]) * (1 + 1e-9), (tpot, sys.argv[2])
PYEOF
done
# The safetensors export, imported back, gives the distilled checkpoint's eval loss.
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" checkpoint import --hf "$T/A/export/autocompress/hf" --out "$T/A-back" --dtype f32
EV=(eval --data "$T/fortunes" --seq-len 64 --samples 4 --dtype f32 --tp 2 --json --quiet)
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" "${EV[@]}" --model "$T/A-back"
L1=$(grep -o '"loss":[^,]*' "$AC_TEST_TMP/out")
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" "${EV[@]}" --model "$T/A/distill-autocompress/checkpoints"
L2=$(grep -o '"loss":[^,]*' "$AC_TEST_TMP/out")
[ -n "$L1" ] && [ "$L1" = "$L2" ] || fail "exported student's eval $L1, distilled checkpoint's $L2"
cp "$T/A/eval/autocompress/eval.json" "$T/A-eval-autocompress.json"
cp "$T/A/eval/minitron/eval.json" "$T/A-eval-minitron.json"

# ---- the same command again: nothing reruns
"${RUN[@]}" --out "$T/A" >"$T/A2.log" 2>&1 || { cat "$T/A2.log"; fail "run A again"; }
[ "$(grep -c ': done earlier' "$T/A2.log")" = 13 ] || { cat "$T/A2.log"; fail "a rerun ran stages again"; }

# ---- more distillation steps: distill and what follows rerun, importance and the searches do not
"${RUN[@]}" --out "$T/A" --set distill.steps=14 >"$T/A3.log" 2>&1 || { cat "$T/A3.log"; fail "run A with 14 steps"; }
for s in teacher data importance search minitron; do
  grep -q "stage .* $s: done earlier" "$T/A3.log" || { cat "$T/A3.log"; fail "$s reran after a distill change"; }
done
for s in distill-autocompress distill-minitron eval scorecard samples export-autocompress report; do
  grep -q "stage .* $s: starting" "$T/A3.log" || { cat "$T/A3.log"; fail "$s did not rerun after a distill change"; }
done
$PY -c "import json,sys; m=[json.loads(l) for l in open(sys.argv[1])]; assert max(x.get('step',0) for x in m)==14" \
  "$T/A/distill-autocompress/metrics.jsonl" || fail "distill did not run 14 steps"

# ---- SIGKILL during the search, then during distillation; the rerun finishes with the same loss
# Every process of run B (mpirun, both ranks, a stage's shell step) is SIGKILLed at once, and
# none may outlive the kill (kill_session, tests/distill/train_common.sh).
kill_when() {  # kill_when FILE: start run B, SIGKILL its session once FILE exists (plus a random delay)
  run_bg "$T/B.log" "${RUN[@]}" --out "$T/B"
  local i
  for ((i = 0; i < 3000; i++)); do [ -e "$1" ] && break; kill -0 "$BG" 2>/dev/null || break; sleep 0.1; done
  [ -e "$1" ] || { cat "$T/B.log"; fail "run B never wrote $1"; }
  sleep "0.$((RANDOM % 10))"
  kill_session "$BG" || fail "processes of run B outlived SIGKILL for 5 s: $SURVIVORS"
  cat "$T/B.log" >>"$T/B-all.log"
}
kill_when "$T/B/search/search/latest"
kill_when "$T/B/distill-autocompress/checkpoints/latest"
"${RUN[@]}" --out "$T/B" >"$T/B.log" 2>&1 || { cat "$T/B-all.log" "$T/B.log"; fail "run B after two kills"; }
for s in teacher data importance search; do
  grep -q "stage .* $s: done earlier" "$T/B.log" || { cat "$T/B.log"; fail "$s reran after the kills"; }
done
grep -q "resumed from" "$T/B.log" || grep -q "distill-autocompress: done earlier" "$T/B.log" ||
  { cat "$T/B.log"; fail "distill neither resumed nor was done"; }
$PY - "$T/A-eval-autocompress.json" "$T/B/eval/autocompress/eval.json" "$T/A-eval-minitron.json" \
  "$T/B/eval/minitron/eval.json" <<'PYEOF' || fail "killed and resumed run ends elsewhere"
import json, sys
for a, b in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])):
    x, y = json.load(open(a)), json.load(open(b))
    assert x["loss"] == y["loss"], (a, x["loss"], y["loss"])
PYEOF

# ---- bad configs: exit 2 naming the problem, before any stage
bad() {  # bad NAME PATTERN [cfg lines...]: the run exits 2, says PATTERN, and starts no stage
  local name=$1 pattern=$2; shift 2
  expect_rc 2 $MPIEXEC -n 2 "$AC_BIN" run --config "$T/$name.cfg" --out "$T/$name"
  expect_out "$pattern"
  expect_no_out "stage 1/"
  [ ! -d "$T/$name/stages" ] || fail "$name: a stage started"
}
write_cfg "$T/bad1.cfg" && sed -i 's/^\[distill\]$/[distill]\nstepz = 3/' "$T/bad1.cfg"
bad bad1 "\[distill\] stepz"
write_cfg "$T/bad2.cfg" && printf "[distil]\nsteps = 3\n" >>"$T/bad2.cfg"
bad bad2 "\[distil\].*unknown stage section"
write_cfg "$T/bad3.cfg" && sed -i 's/^target-tpot-ms-ratio = 0.8$/target-tpot-ms-ratio = 0.01/' "$T/bad3.cfg"
bad bad3 "target.*no architecture meets it"
write_cfg "$T/bad4.cfg" && sed -i "s#^checkpoint = .*#checkpoint = $T/no-such-teacher#" "$T/bad4.cfg"
bad bad4 "\[teacher\] checkpoint"
# Expert parallelism at TP 2 x DP 1: EP 2 cannot fold onto one DP rank (checked before the search).
write_cfg "$T/bad5.cfg" && sed -i 's/^\[distill\]$/[distill]\nep = 2/' "$T/bad5.cfg"
bad bad5 "\[distill\].*ep: expert-parallel size 2 does not divide the data-parallel size 1"
# Sequence parallelism (issue 34): [search] and [distill] sequence-parallel reach both stages'
# calls; at TP 1, or with a [distill] seq-len TP does not divide, refused before any stage.
write_cfg "$T/sp.cfg"
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" run --config "$T/sp.cfg" --set search.sequence-parallel=true \
  --set distill.sequence-parallel=true --check --out "$T/sp"
expect_out "autocompress search .*--sequence-parallel"
expect_out "autocompress distill .*--sequence-parallel"
write_cfg "$T/bad6.cfg" && sed -i 's/^tp = 2$/tp = 1/; s/^\[search\]$/[search]\nsequence-parallel = true/' "$T/bad6.cfg"
bad bad6 "\[search\].*--sequence-parallel: true: needs tensor parallelism"
write_cfg "$T/bad7.cfg" && sed -i '/^\[distill\]$/,/^\[eval\]$/ s/^seq-len = 32$/seq-len = 31/' "$T/bad7.cfg" &&
  sed -i 's/^\[distill\]$/[distill]\nsequence-parallel = true/' "$T/bad7.cfg"
bad bad7 "\[distill\].*--seq-len: 31: does not split evenly over --tp 2"
echo "PASS"
