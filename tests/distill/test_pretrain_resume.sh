# The trainer survives preemption: a SIGKILL at a random step, then a resume from `latest`,
# gives the uninterrupted run's loss curve bitwise (same layout); SIGUSR1 makes every rank
# save and exit 75 (Slurm's requeue code); the resumed run ends where the uninterrupted one does.
source "$AC_SOURCE_DIR/tests/distill/train_common.sh"
rm -rf "$T/a" "$T/b" "$T/c"
make_data
RUN="$MPIEXEC -n 2 $AC_BIN pretrain --arch $AC_SOURCE_DIR/configs/models/tiny-teacher.json $TRAIN_COMMON --steps 12 --eval-interval 6 --save-interval 3"

# 1. Uninterrupted.
timeout 300 $RUN --out "$T/a" >"$T/a.log" 2>&1 || { cat "$T/a.log"; fail "uninterrupted run"; }
grep -q "step 12/12" "$T/a.log" || { cat "$T/a.log"; fail "no progress line for step 12"; }
grep -q "ETA" "$T/a.log" || fail "progress line without ETA"
[ -f "$T/a/manifest.json" ] || fail "no manifest"
$PY -c "import h5py,sys; f=h5py.File('$T/a/checkpoints/step_12.h5'); assert 'optimizer/exp_avg/embed.weight' in f or any(k.startswith('exp_avg') for k in f['optimizer']), list(f['optimizer'])" \
  || fail "checkpoint has no optimizer state readable by h5py"

# 2. SIGKILL at a random step after the first checkpoint, then resume.
kill_at=$((4 + RANDOM % 6))
run_bg "$T/b.log" $RUN --out "$T/b"
wait_step "$T/b/metrics.jsonl" "$kill_at" 120
kill_session "$BG" || fail "processes outlived SIGKILL for 5 s: $SURVIVORS"
echo "killed at step >= $kill_at"
timeout 300 $RUN --out "$T/b" >"$T/b2.log" 2>&1 || { cat "$T/b2.log"; fail "resume after SIGKILL"; }
grep -q "resumed from" "$T/b2.log" || { cat "$T/b2.log"; fail "did not resume"; }
$CMP "$T/a/metrics.jsonl" "$T/b/metrics.jsonl" --exact || fail "loss curve after SIGKILL + resume differs"

# 3. SIGUSR1 (as Slurm sends before preemption): every rank saves, exit 75, then resume.
run_bg "$T/c.log" $RUN --out "$T/c"
wait_step "$T/c/metrics.jsonl" 4 120
kill -USR1 -- -"$BG"
wait "$BG"; rc=$?
[ "$rc" = 75 ] || { cat "$T/c.log"; fail "exit code $rc after SIGUSR1, want 75"; }
grep -q "stop signal received" "$T/c.log" || { cat "$T/c.log"; fail "no signal message"; }
timeout 300 $RUN --out "$T/c" >"$T/c2.log" 2>&1 || { cat "$T/c2.log"; fail "resume after SIGUSR1"; }
$CMP "$T/a/metrics.jsonl" "$T/c/metrics.jsonl" --exact || fail "loss curve after SIGUSR1 + resume differs"
# 4. Resume under another layout: the 12-step run continued to 14 steps at TP 2 x DP 1
#    (2 micro-steps: the same global batch) and at TP 1 x DP 2; the ZeRO-1 state was written
#    as logical tensors by its DP owners, so either layout can load it.
for v in d e; do rm -rf "$T/$v"; mkdir -p "$T/$v"; cp -r "$T/a/checkpoints" "$T/$v/"; cp "$T/a/metrics.jsonl" "$T/$v/"; done
RUN14="$MPIEXEC -n 2 $AC_BIN pretrain --arch $AC_SOURCE_DIR/configs/models/tiny-teacher.json $TRAIN_COMMON --steps 14 --eval-interval 7 --save-interval 0"
timeout 300 $RUN14 --tp 2 --grad-accum 2 --out "$T/d" >"$T/d.log" 2>&1 || { cat "$T/d.log"; fail "resume at TP 2"; }
timeout 300 $RUN14 --out "$T/e" >"$T/e.log" 2>&1 || { cat "$T/e.log"; fail "resume at TP 1 x DP 2"; }
grep -q "resumed from .*step_12.h5" "$T/d.log" || { cat "$T/d.log"; fail "TP 2 run did not resume from step 12"; }
$CMP "$T/d/metrics.jsonl" "$T/e/metrics.jsonl" --rtol 2e-4 || fail "resume at TP 2 differs from TP 1"
echo "OK"
