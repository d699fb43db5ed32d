# Preemption of a real distillation job under a real Slurm cluster (scripts/slurm_cluster.sh):
# slurm/distill_1node.sbatch runs `autocompress distill` on 2 ranks (srun --mpi=pmix); the
# test sends the preemption signal (USR1 to the batch shell, as --signal=B:USR1@300 does),
# the ranks checkpoint and exit 75, rank 0 requeues the job, the second run resumes from
# `latest` and ends with the same losses as an uninterrupted run (bitwise: same layout).
# Exit 77 (not root, packages missing) = SKIP.
set -uo pipefail
source "$AC_SOURCE_DIR/tests/slurm/slurm_test_lib.sh"  # SKIP checks, T, CL, fail
rm -rf "$T"; mkdir -p "$T"; cd "$T" || exit 1
PY=/usr/bin/python3

# Data and a small teacher (plain mpiexec: these are inputs, not what is tested).
"$AC_BIN" data preprocess --input "$AC_SOURCE_DIR/tests/fixtures/data/corpus/fortunes_sample.jsonl" \
  --tokenizer "$AC_SOURCE_DIR/tests/fixtures/data/tokenizer/gpt2-4k.tokenizer.json" --output "$T/fortunes" \
  >preprocess.log 2>&1 || fail "data preprocess"
common="--data $T/fortunes --seq-len 32 --micro-batch 2 --dtype f32 --log-interval 1 --eval-iters 1"
timeout 300 $MPIEXEC -n 2 "$AC_BIN" pretrain --arch "$AC_SOURCE_DIR/configs/models/tiny-teacher.json" $common \
  --steps 4 --eval-interval 0 --out "$T/teacher" >teacher.log 2>&1 || fail "teacher pretraining"

printf '%s\n' \
  "student = $AC_SOURCE_DIR/configs/models/tiny-student.json" \
  "data = $T/fortunes" \
  "seq-len = 32" "micro-batch = 2" "dtype = f32" "steps = 14" "lr = 2e-3" "warmup = 2" \
  "log-interval = 1" "eval-interval = 7" "eval-iters = 1" "save-interval = 0" "ce-weight = 0.1" >distill.cfg

# The uninterrupted reference.
timeout 300 $MPIEXEC -n 2 "$AC_BIN" distill --config distill.cfg --teacher "$T/teacher/checkpoints" \
  --out "$T/ref" >ref.log 2>&1 || fail "reference run"

cluster_up
id=$(sbatch --parsable --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --time=10 \
       --output="$T/job-%j.out" \
       --export="ALL,OMP_NUM_THREADS=1,AC_BIN=$AC_BIN,CONFIG=$T/distill.cfg,TEACHER=$T/teacher/checkpoints,OUT=$T/run" \
       "$AC_SOURCE_DIR/slurm/distill_1node.sbatch") || fail "sbatch"
# Preempt once the run is a few steps in (nothing saved yet: save-interval 0).
for _ in $(seq 600); do
  [ -f "$T/run/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$T/run/metrics.jsonl")" -ge 3 ] && break
  sleep 0.2
done
[ -f "$T/run/metrics.jsonl" ] || fail "the job never logged a step"
scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id"
st=$(ac_slurm_wait_job "$id" 180) || fail "job $id still '$st' after 180s"
[ "$st" = COMPLETED ] || fail "job $id ended $st"
out=$T/job-$id.out
grep -q "stop signal received (SIGUSR1)" "$out" || fail "the trainer did not see the signal"
# After `scontrol requeue` Slurm ends the step itself (SIGTERM, then SIGKILL after KillWait):
# the first run ends with 75 or with that cancellation, in both cases after the checkpoint.
grep -Eq "srun exited with 75|DUE TO JOB REQUEUE" "$out" || fail "first run did not end for the requeue"
grep -q "requeueing: scontrol requeue $id" "$out" || fail "rank 0 did not requeue"
grep -q "resumed from $T/run/checkpoints/step_" "$out" || fail "second run did not resume"
grep -q "srun exited with 0" "$out" || fail "second run did not finish"
$PY "$AC_SOURCE_DIR/tests/distill/compare_metrics.py" "$T/ref/metrics.jsonl" "$T/run/metrics.jsonl" --exact ||
  fail "losses after preemption + requeue differ from the uninterrupted run"
echo "OK: $(grep -o 'received (SIGUSR1) at step [0-9]*' "$out"), requeued, resumed, same losses as the uninterrupted run"
