# `autocompress run` (the whole job) preempted twice under a real Slurm cluster
# (scripts/slurm_cluster.sh): slurm/distill_1node.sbatch with AC_MODE=run on 2 ranks
# (srun --mpi=pmix, TP 2), a tiny config (tiny-teacher.json pretrained for 4 steps, a slice
# of the fortunes corpus, seconds-long stages). The test sends the preemption signal (USR1 to
# the batch shell, as --signal=B:USR1@300 does) once during the search and once during the
# distillation: each time the stage checkpoints, rank 0 requeues the job, the run exits 75;
# the next run skips the stages done earlier ("[run] stage K/N NAME: done earlier"), continues
# the interrupted stage from its own checkpoint, and the third run finishes (exit 0) with
# report.md and the safetensors export in OUT. Exit 77 (not root, packages missing) = SKIP.
set -uo pipefail
rm -rf "$AC_TEST_TMP"
source "$AC_SOURCE_DIR/tests/launcher/run_common.sh"   # PY, make_teacher, write_cfg
source "$AC_SOURCE_DIR/tests/slurm/slurm_test_lib.sh"  # SKIP checks, T, CL, fail
OUT=$T/run
cd "$T" || exit 1

# The teacher and data (plain mpiexec: these are inputs, not what is tested), and the run
# config of the launcher.run test, with a search and a distillation long enough (a few tenths
# of a second a step here) for a signal to land inside them, and the autocompress method only
# (10 stages; what is tested is the stages' stop, requeue and resume under Slurm, which the
# minitron path shares; launcher.run covers `method = both`). The overrides go through the
# template's AC_ARGS.
make_teacher
write_cfg "$T/run.cfg"
ARGS="--method autocompress --set search.steps=24 --set distill.steps=16 --set distill.eval-interval=8"
# shellcheck disable=SC2086
"$AC_BIN" run --config "$T/run.cfg" --out "$OUT" $ARGS --check >"$T/check.log" 2>&1 || fail "run --check"

cluster_up
id=$(sbatch --parsable --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --time=15 \
       --output="$T/job-%j.out" \
       --export="ALL,OMP_NUM_THREADS=1,AC_BIN=$AC_BIN,AC_MODE=run,CONFIG=$T/run.cfg,OUT=$OUT,AC_ARGS=$ARGS" \
       "$AC_SOURCE_DIR/slurm/distill_1node.sbatch") || fail "sbatch"
out=$T/job-$id.out

# preempt_when FILE WHAT: waits (up to 240 s) until FILE exists, i.e. the stage has saved its
# first checkpoint and runs on, then sends the preemption signal to the batch shell.
preempt_when() {
  local i
  for ((i = 0; i < 2400; i++)); do [ -e "$1" ] && break; sleep 0.1; done
  [ -e "$1" ] || fail "no $1 after 240 s (job state: $(squeue -h -t all -j "$id" -o %T))"
  scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id ($2)"
  echo "$(date -u +%T) preempted during $2 (${SECONDS}s into the test)"
}
preempt_when "$OUT/search/search/latest" search
preempt_when "$OUT/distill-autocompress/checkpoints/latest" distill-autocompress
st=$(ac_slurm_wait_job "$id" 300) || fail "job $id still '$st' after 300s"
[ "$st" = COMPLETED ] || fail "job $id ended $st"

# The job's log holds the three runs, each starting with "=== ... job ID run N".
$PY - "$out" "$id" "$OUT" <<'PYEOF' || fail "the job's log"
import re, sys
text, job, out = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
runs = re.split(r"(?m)^(?==== \S+ job \d+ run \d+ )", text)
runs = [r for r in runs if r.startswith("=== ")]
assert len(runs) == 3, f"{len(runs)} runs in the log, want 3"
def has(r, i, pattern):
    assert re.search(pattern, r, re.M), f"run {i + 1} lacks /{pattern}/"
def lacks(r, i, pattern):
    assert not re.search(pattern, r, re.M), f"run {i + 1} has /{pattern}/"
for i, (stopped_in, done) in enumerate((("search", []), ("distill-autocompress", ["teacher", "data", "importance"]))):
    r = runs[i]
    has(r, i, rf"^stop signal received \(SIGUSR1\) at step \d+: saving")
    has(r, i, rf"^requeueing: scontrol requeue {job}$")
    has(r, i, rf"^\[run\] {stopped_in} stopped on a signal \(exit 75\)")
    # After `scontrol requeue` Slurm ends the step itself (SIGTERM, SIGKILL after KillWait): the
    # run ends with 75 or with that cancellation, in both cases after the checkpoint.
    has(r, i, r"srun exited with 75|DUE TO JOB REQUEUE")
    for s in done:
        has(r, i, rf"^\[run\] stage \d+/10 {s}: done earlier")
# Run 2: the search continues from its checkpoint; run 3: distill-autocompress does.
has(runs[1], 1, rf"^=== resuming {re.escape(out)}: 3 stage\(s\) done earlier, continuing search")
has(runs[1], 1, r"^\[run\] stage 4/10 search: continuing")
has(runs[1], 1, rf"^resumed the search from {re.escape(out)}/search/search/step_\d+\.h5 at step [1-9]")
has(runs[1], 1, r"^\[run\] stage 5/10 distill-autocompress: starting")
r = runs[2]
has(r, 2, rf"^=== resuming {re.escape(out)}: 4 stage\(s\) done earlier, continuing distill-autocompress")
for k, s in enumerate(["teacher", "data", "importance", "search"]):
    has(r, 2, rf"^\[run\] stage {k + 1}/10 {s}: done earlier")
has(r, 2, r"^\[run\] stage 5/10 distill-autocompress: continuing")
has(r, 2, rf"^resumed from {re.escape(out)}/distill-autocompress/checkpoints/step_\d+\.h5 at step [1-9]")
for s in ["eval", "scorecard", "samples", "export-autocompress", "report"]:
    has(r, 2, rf"^\[run\] stage \d+/10 {s}: starting")
lacks(r, 2, r"stop signal received")
has(r, 2, r"^\[run\] finished in .*: 6 stages run, 4 done earlier")
has(r, 2, r"srun exited with 0$")
PYEOF
for f in report.md export/autocompress/hf/config.json manifest.json; do
  [ -s "$OUT/$f" ] || fail "the run left no $f"
done
# Every stage done once; the resumed trainings logged each step once and reached the end.
$PY - "$OUT" <<'PYEOF' || fail "run outputs"
import json, sys
out = sys.argv[1]
m = json.load(open(f"{out}/manifest.json"))
assert [s["status"] for s in m["stages"]] == ["skipped"] * 4 + ["done"] * 6, m["stages"]
for d, want in (("search", 24), ("distill-autocompress", 16)):
    recs = [json.loads(l) for l in open(f"{out}/{d}/metrics.jsonl") if l.strip()]
    steps = [r["step"] for r in recs if "kd_loss" in r]  # training records (not eval_*)
    assert steps and steps == sorted(set(steps)) and steps[-1] == want, (d, steps)
PYEOF
mapfile -t at < <(grep -o 'received (SIGUSR1) at step [0-9]*' "$out" | grep -o '[0-9]*$')
echo "OK: SIGUSR1 at search step ${at[0]:-?} and at distill step ${at[1]:-?}, requeued twice, both resumed;" \
     "finished with report.md and the export (${SECONDS}s)"
