#!/usr/bin/env bash
# `autocompress prune` and `autocompress minitron` end to end at 2 ranks on a briefly
# pretrained tiny teacher, with importance scores from `autocompress importance`: a pruned
# student at TP 2 verifies against its ArchSpec; Minitron writes arch.json, the student and
# the candidate table; bad input exits 2 naming the file and field, and leaves nothing.
# Skipped (77) in a build without the importance subcommand (issue 14's other half).
source "$AC_SOURCE_DIR/tests/distill/train_common.sh"
"$AC_BIN" importance --help >/dev/null 2>&1 || { echo "SKIP: this build has no 'autocompress importance'"; exit 77; }
rm -rf "$T/teacher" "$T/student" "$T/student1" "$T/bad" "$T/mini" "$T/mini2" "$T"/*.json "$T"/*.h5
make_data
TEACHER_ARCH=$AC_SOURCE_DIR/configs/models/tiny-teacher.json
timeout 300 $MPIEXEC -n 2 "$AC_BIN" pretrain --arch "$TEACHER_ARCH" $TRAIN_COMMON --steps 4 --eval-interval 0 \
  --save-interval 0 --out "$T/teacher" >"$T/teacher.log" 2>&1 || { cat "$T/teacher.log"; fail "teacher pretraining"; }
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" importance --teacher "$T/teacher/checkpoints" --data "$T/fortunes" \
  --calib-samples 8 --seq-len 32 --out "$T/imp.h5"

# Student: every width axis shrunk, one layer dropped.
$PY - "$TEACHER_ARCH" "$T/student.json" "$T/bad.json" <<'PYEOF'
import json, sys
a = json.load(open(sys.argv[1]))
d = a["defaults"]
a["hidden_size"] = 96
d["mamba"]["num_heads"] = 2; d["mamba"]["head_dim"] = 24
d["attention"]["num_heads"] = 2
d["mlp"]["ffn_size"] = 256
d["moe"].update(num_experts=2, expert_ffn=64, shared_ffn=64)
a["dtype"] = "float32"
a["pattern"] = "M-*.ME"
json.dump(a, open(sys.argv[2], "w"))
d["attention"]["num_kv_heads"] = 4; d["attention"]["num_heads"] = 4
json.dump(a, open(sys.argv[3], "w"))
PYEOF
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" prune --teacher "$T/teacher/checkpoints" --importance "$T/imp.h5" \
  --arch "$T/student.json" --out "$T/student" --tp 2
expect_out "at TP 2 x DP 1"
[ -f "$T/student/latest" ] && [ -f "$T/student/manifest.json" ] || fail "prune left no latest/manifest.json"
expect_rc 0 "$AC_BIN" checkpoint verify "$T/student"
expect_out "shapes match the ArchSpec"
expect_rc 0 "$AC_BIN" checkpoint inspect "$T/student"
expect_out "model/layers.0.mamba.in_proj.weight"

# Not a sub-architecture: exit 2 naming the file and field, nothing written.
expect_rc 2 $MPIEXEC -n 2 "$AC_BIN" prune --teacher "$T/teacher/checkpoints" --importance "$T/imp.h5" \
  --arch "$T/bad.json" --out "$T/bad" --tp 2
expect_out "bad.json: layers\[2\].attention.num_kv_heads"
[ ! -e "$T/bad" ] || fail "a refused prune left $T/bad"
head -c 3000 "$T/imp.h5" >"$T/truncated.h5"
expect_rc 2 "$AC_BIN" prune --teacher "$T/teacher/checkpoints" --importance "$T/truncated.h5" --arch "$T/student.json" --out "$T/bad"
expect_out "truncated.h5"
[ ! -e "$T/bad" ] || fail "a refused prune left $T/bad"

# Minitron under a parameter budget of 80% of the teacher.
TOTAL=$("$AC_BIN" model info --arch "$TEACHER_ARCH" --json | $PY -c "import json,sys; print(int(json.load(sys.stdin)['params']['total'] * 0.8))")
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" minitron --teacher "$T/teacher/checkpoints" --importance "$T/imp.h5" \
  --target-params "$TOTAL" --data "$T/fortunes" --score-samples 4 --seq-len 32 --top-k 3 --out "$T/mini" --tp 2
expect_out "ETA"
expect_out "\[minitron\] chose"
for f in arch.json candidates.csv candidates.json manifest.json student/latest; do
  [ -f "$T/mini/$f" ] || fail "minitron left no $f"
done
expect_rc 0 "$AC_BIN" checkpoint verify "$T/mini/student"
$PY - "$T/mini/candidates.json" "$TOTAL" <<'PYEOF' || fail "candidate table"
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["candidates"]
assert rows and all(r["params"] <= int(sys.argv[2]) for r in rows), rows
assert sum(r["chosen"] for r in rows) == 1
assert sum(r["score"] is not None for r in rows) == min(3, len(rows))
PYEOF
expect_rc 2 $MPIEXEC -n 2 "$AC_BIN" minitron --teacher "$T/teacher/checkpoints" --importance "$T/imp.h5" \
  --target-params 1000 --data "$T/fortunes" --out "$T/mini2"
expect_out "\-\-target-params: 1000: below the smallest reachable candidate: the smallest reachable is"
[ ! -e "$T/mini2" ] || fail "an impossible budget left $T/mini2"
echo PASS
