#!/usr/bin/env bash
# `run` with `hardware = cpu-local` keeps the machine's profile as the run directory first used
# it (RUN/hardware/cpu-local.json): a recalibration of the cached profile between an interrupted
# run and its resume (a spot check, a busy profile redone) must not change the resolved budget
# and redo finished stages (the nineteenth session's grid lost a finished cell that way).
#  - --check writes no copy; the first run writes one equal to the cached profile, names it,
#    and every stage call uses it;
#  - the cached profile changed (decode-step times doubled, as a slower machine's recalibration
#    would give): the rerun keeps the copy, the same budget and every stage done earlier;
#  - the copy deleted: the budget follows the changed cached profile.
source "$AC_SOURCE_DIR/tests/launcher/run_common.sh"
rm -rf "$T/cache" "$T/pin" "$T/pin.cfg"
make_teacher
timeout 120 "$AC_BIN" cost calibrate --quick --dtype f32 --cache-dir "$T/cache" >"$T/cal.log" 2>&1 || { cat "$T/cal.log"; fail "quick calibration"; }
write_cfg "$T/pin.cfg"
sed -i "s/^tp = 2$/tp = 1/; s/^hardware = h100$/hardware = cpu-local/; s/^target-tpot-ms-ratio = 0.8$/target-tpot-ms-ratio = 0.95/" "$T/pin.cfg"
RUN=(env AC_CACHE_DIR="$T/cache" timeout 400 "$AC_BIN" run --config "$T/pin.cfg" --out "$T/pin")
budget() { grep '^\[run\] budget ' "$1" || fail "no budget line in $1"; }

"${RUN[@]}" --check >"$T/pin0.log" 2>&1 || { cat "$T/pin0.log"; fail "run --check"; }
[ -e "$T/pin/hardware" ] && fail "--check wrote the profile copy"
"${RUN[@]}" >"$T/pin1.log" 2>&1 || { cat "$T/pin1.log"; fail "first run"; }
cached=$(grep -l '"dtype": "float32"' "$T"/cache/hardware/cpu-local-*.json)  # the config's dtype f32
[ "$(echo "$cached" | wc -l)" = 1 ] || fail "expected one f32 profile in the cache: $cached"
cmp -s "$T/pin/hardware/cpu-local.json" "$cached" || fail "the copy differs from the cached profile"
grep -q "^\[run\] hardware: $T/pin/hardware/cpu-local.json" "$T/pin1.log" || { head -20 "$T/pin1.log"; fail "the run does not name its copy"; }
$PY - "$T/pin/manifest.json" <<'PYEOF' || fail "stage calls do not use the copy"
import json, sys
plan = json.load(open(sys.argv[1]))["plan"]
hw = [c[c.index("--hardware") + 1] for s in plan for c in (x.split() if isinstance(x, str) else x.get("argv", []) for x in s["calls"])
      if "--hardware" in c]
assert hw and all(h.endswith("pin/hardware/cpu-local.json") or h == "hardware/cpu-local.json" for h in hw), hw
PYEOF

# The machine's cached profile is recalibrated slower; the resumed run keeps its copy.
$PY - "$cached" <<'PYEOF' || fail "editing the cached profile"
import json, sys
d = json.load(open(sys.argv[1]))
d["decode_step"] = {k: 2 * v for k, v in d["decode_step"].items()}
d["kernel_overhead_s"] *= 2
json.dump(d, open(sys.argv[1], "w"), indent=2)
PYEOF
"${RUN[@]}" >"$T/pin2.log" 2>&1 || { cat "$T/pin2.log"; fail "rerun"; }
[ "$(budget "$T/pin1.log")" = "$(budget "$T/pin2.log")" ] || fail "the budget moved: $(budget "$T/pin1.log") / $(budget "$T/pin2.log")"
grep -q "inputs or options changed" "$T/pin2.log" && { grep "changed" "$T/pin2.log"; fail "a finished stage was redone"; }
[ "$(grep -c 'done earlier' "$T/pin2.log")" -ge 13 ] || { cat "$T/pin2.log"; fail "stages not skipped"; }

# Without the copy the budget follows the machine's current (changed) profile.
rm "$T/pin/hardware/cpu-local.json"
"${RUN[@]}" --check >"$T/pin3.log" 2>&1 || { cat "$T/pin3.log"; fail "run --check without the copy"; }
grep -q "calibrat" "$T/pin3.log" || [ "$(budget "$T/pin1.log")" != "$(budget "$T/pin3.log")" ] ||
  fail "without the copy the budget did not follow the cached profile: $(budget "$T/pin3.log")"
echo "PASS launcher.run_pinned_hardware"
