#!/usr/bin/env bash
# `autocompress plan`: the per-GPU table and JSON for Nemotron 3 Super 120B -> 74B, exit 2
# naming what does not fit (with the layouts that do), and exit 2 naming the field on bad input.
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
M=$AC_SOURCE_DIR/configs/models
SUPER="--teacher $M/nemotron-3-super.json --student $M/nemotron-3-super-74b.json"

# A layout that fits: TP 8, experts over EP 4 x ETP 8, ZeRO-1 on 8 x 8 H100.
expect_rc 0 "$AC_BIN" plan $SUPER --cluster 8x8xh100 --tp 8 --ep 4 --zero 1 --json "$T/plan.json"
expect_out "layout: TP 8 x DP 8, EP 4 x ETP 8, ZeRO-1; EDP 2"
expect_out "teacher weights"
expect_out "student optimizer states"
expect_out "fits, free"
expect_out "EP      4 inter-node"
expect_out "step estimate: compute"
python3 - "$T/plan.json" <<'PY' || fail "plan json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "autocompress.plan" and j["fits"] is True, j["fits"]
assert j["layout"] == {"tp": 8, "dp": 8, "ep": 4, "etp": 8, "edp": 2, "teacher_ep": 4, "teacher_edp": 2, "zero": 1}, j["layout"]
# peak = what is live throughout + the largest phase; every item is counted in its phases
always = sum(m["bytes"] for m in j["memory"] if m["live"] == "always")
ph = j["phase_bytes"]
for name, key in (("forward", "forward"), ("KD backward", "kd_backward"), ("backward", "backward"), ("step", "step")):
    live = sum(m["bytes"] for m in j["memory"] if name in m["live"].split(", "))
    assert abs(live - ph[key]) < 1, (name, live, ph[key])
assert abs(always - j["always_bytes"]) < 1 and abs(always + max(ph.values()) - j["total_bytes"]) < 1, (always, ph, j["total_bytes"])
assert j["peak_phase"] == "backward", j["peak_phase"]  # at 8K tokens: activations + gradients
assert j["total_bytes"] < sum(m["bytes"] for m in j["memory"])
assert j["total_bytes"] <= j["usable_bytes"] == 80e9 - 2 * 2**30, j["usable_bytes"]
# the teacher's 123.6B parameters: experts (~95%) 32-way, the rest 8-way -> ~5B on one GPU
assert abs(j["params"]["teacher"] / 1e9 - 123.611) < 0.001
assert 4.5e9 < j["params"]["teacher_per_gpu"] < 5.5e9, j["params"]
groups = {c["group"] for c in j["communication"]}
assert {"TP", "EP", "ETP", "DP", "EDP"} <= groups, groups
assert j["step"]["step_s"] > j["step"]["compute_s"] > 0
print("plan json ok")
PY

# The issue's claim: TP 8 x DP with ZeRO-1 alone does not fit; exit 2 names the overflow
# and lists layouts that fit (all with EP > 1).
expect_rc 2 "$AC_BIN" plan $SUPER --cluster 8x8xh100 --tp 8 --zero 1 --json "$T/nofit.json"
expect_out "DOES NOT FIT, over by"
expect_out "does not fit: TP 8 x DP 8, EP 1 x ETP 8, ZeRO-1 needs"
expect_out "more than the usable 72.51 GiB of a h100"
expect_out "Layouts of 8x8xh100 that fit, least sharded first:"
expect_out "  TP 8 x DP 8, EP 4 x ETP 8, ZeRO-1"
python3 -c "import json,sys; j=json.load(open('$T/nofit.json')); assert j['fits'] is False and j['fitting_layouts'], j['fitting_layouts']" \
  || fail "nofit json"
# One node: nothing fits at all.
expect_rc 2 "$AC_BIN" plan $SUPER --cluster 1x8xh100
expect_out "No layout of 1x8xh100 fits"
expect_out "the fewest nodes of this kind that fit: 8x8xh100 with"
# No layout given: the least-sharded layout that fits is chosen.
expect_rc 0 "$AC_BIN" plan $SUPER --cluster 4x8xb200
expect_out "the least-sharded layout that fits on 4x8xb200 is TP 4 x DP 8, EP 4 x ETP 1"
# Importance and search stages need no student.
expect_rc 0 "$AC_BIN" plan --teacher "$M/nemotron-3-super.json" --cluster 1x8xb200 --stage importance --tp 8
expect_out "plan: importance on 1x8xb200"
expect_no_out "student weights"

# Bad input: exit 2 naming the field.
expect_rc 2 "$AC_BIN" plan $SUPER --cluster 8x8
expect_out "--cluster: 8x8: expected NODESxGPUSxKIND"
expect_rc 2 "$AC_BIN" plan $SUPER --cluster 2x8xtpu9
expect_out "--cluster: 2x8xtpu9: KIND: --hardware: tpu9: unknown hardware id"
expect_rc 2 "$AC_BIN" plan $SUPER --cluster 8x8xh100 --tp 8 --ep 8
expect_out "--ep: 8: does not divide the 300 experts of student layers\[1\]"
expect_rc 2 "$AC_BIN" plan $SUPER --cluster 1x6xh100 --tp 3 --etp 1
expect_out "--tp: 3: does not divide the 128 Mamba heads of teacher layers\[0\]"
expect_rc 2 "$AC_BIN" plan $SUPER --cluster 8x8xh100 --tp 8 --dp 4
expect_out "--dp: 4: must be GPUs / TP = 64 / 8 = 8"
expect_rc 2 "$AC_BIN" plan $SUPER --cluster 8x8xh100 --recompute some
expect_out "--recompute: some: expected none, selective or full"
expect_rc 2 "$AC_BIN" plan --teacher "$M/nemotron-3-super.json" --cluster 8x8xh100
expect_out "missing --student"
echo PASS
