#!/usr/bin/env bash
# shellcheck disable=SC2015  # `A && B || fail`: fail exits
# A real single-node Slurm cluster (scripts/slurm_cluster.sh) runs autocompress under
# `srun --mpi=pmix`, requeues a job that exits 75 after SIGUSR1, and runs the distill
# template (slurm/distill_1node.sbatch) through a preemption with a stand-in trainer, and in
# run mode reruns srun once when srun said 0 but a stage was left started.
# Skips (exit 77) only when not root or when the Slurm/munge packages are missing.
# Gets AC_BIN, AC_SOURCE_DIR and AC_TEST_TMP from ctest (tests/CMakeLists.txt).
set -uo pipefail
: "${AC_BIN:?}" "${AC_SOURCE_DIR:?}" "${AC_TEST_TMP:?}"

# shellcheck source=../../scripts/slurm_cluster.sh
source "$AC_SOURCE_DIR/scripts/slurm_cluster.sh"

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the Slurm cluster test needs root (SlurmUser=root)"; exit 77
fi
if ! ac_slurm_have_packages; then
  echo "SKIP: Slurm/munge packages missing (scripts/setup.sh installs them)"; exit 77
fi

T=$AC_TEST_TMP
CL=$T/cluster
rm -rf "$T"
mkdir -p "$T"
cd "$T" || exit 1

fail() {
  echo "FAIL: $*"
  local f
  for f in "$T"/*.out "$CL/log/slurmctld.log" "$CL/log/slurmd.log"; do
    [ -r "$f" ] || continue
    echo "---- $f (last 30 lines)"; tail -n 30 "$f"
  done
  exit 1
}
# Polls until FILE exists (bounded).
wait_file() {
  local f=$1 timeout=$2 t0=$SECONDS
  while [ ! -e "$f" ]; do
    [ $((SECONDS - t0)) -ge "$timeout" ] && return 1
    sleep 0.2
  done
}
# Waits for job ID to finish for good; fails unless it COMPLETED.
wait_completed() {
  local id=$1 timeout=$2 st
  st=$(ac_slurm_wait_job "$id" "$timeout") || fail "job $id still '$st' after ${timeout}s"
  [ "$st" = COMPLETED ] || fail "job $id ended $st"
}

trap 'ac_slurm_stop "$CL"' EXIT
t_start=$SECONDS
# Two stand-in GPUs so the template's --gpus-per-node schedules.
ac_slurm_start "$CL" --gpus 2 --timeout 30 || fail "cluster did not start"
ac_slurm_use "$CL"
echo "cluster up after $((SECONDS - t_start))s"

# ---- 1. two MPI ranks under srun --mpi=pmix -------------------------------------------
cat >env.sbatch <<EOF
#!/bin/bash
#SBATCH --ntasks=2 --time=5 --output=$T/env-%j.out
srun --mpi=pmix -n 2 "$AC_BIN" env
EOF
id=$(sbatch --parsable env.sbatch) || fail "sbatch env.sbatch"
wait_completed "$id" 60
out=$T/env-$id.out
grep -q "World *2 rank(s)" "$out" || fail "autocompress env did not see 2 ranks"
grep -Eq "TP 1 x DP 2 = 2 ranks" "$out" || fail "rank grid is not TP 1 x DP 2"
grep -Eq "^ +0 +0 +0 +0$" "$out" && grep -Eq "^ +1 +0 +1 +1$" "$out" ||
  fail "rank table lacks rank 0 / rank 1 rows"
echo "ok: srun --mpi=pmix -n 2 autocompress env ($((SECONDS - t_start))s)"

# ---- 2. SIGUSR1 to the batch shell -> forwarded to the step -> exit 75 -> requeued -------
cat >requeue.sbatch <<'EOF'
#!/bin/bash
#SBATCH --ntasks=1 --time=5 --requeue --open-mode=append
echo "batch run restart=${SLURM_RESTART_COUNT:-0}"
srun_pid=""
forward() { echo "batch: USR1, forwarding to srun"; kill -USR1 "$srun_pid"; }
trap forward USR1
srun bash "$T/requeue_step.sh" &
srun_pid=$!
while true; do
  wait "$srun_pid"; rc=$?
  kill -0 "$srun_pid" 2>/dev/null && continue
  break
done
echo "batch: srun exited $rc"
exit "$rc"
EOF
cat >requeue_step.sh <<'EOF'
r=${SLURM_RESTART_COUNT:-0}
trap 'echo "usr1 restart=$r" >>"$T/marker"; exit 75' USR1
echo "start restart=$r" >>"$T/marker"
touch "$T/ready.$r"
if [ "$r" -ge 1 ]; then echo "done restart=$r" >>"$T/marker"; exit 0; fi
for _ in $(seq 600); do sleep 0.1; done
echo "no signal came" >>"$T/marker"
exit 1
EOF
export T  # requeue.sbatch and requeue_step.sh read it (sbatch exports the environment)
id=$(sbatch --parsable --output="$T/requeue-%j.out" requeue.sbatch) || fail "sbatch requeue.sbatch"
wait_file "$T/ready.0" 30 || fail "requeue job did not start"
# What --signal=B:USR1@300 does before the time limit: USR1 to the batch shell only.
scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id"
wait_completed "$id" 60
expected=$'start restart=0\nusr1 restart=0\nstart restart=1\ndone restart=1'
[ "$(cat "$T/marker")" = "$expected" ] || fail "marker is not the two runs expected:
$(cat "$T/marker")"
out=$T/requeue-$id.out
grep -q "batch run restart=0" "$out" && grep -q "batch run restart=1" "$out" ||
  fail "output file does not hold both runs (--open-mode=append)"
grep -q "batch: srun exited 75" "$out" || fail "first run did not exit 75"
echo "ok: USR1 -> exit 75 -> requeued, SLURM_RESTART_COUNT=1, finished ($((SECONDS - t_start))s)"

# ---- 3. the distill template through a preemption, with a stand-in trainer ----------------
# fake_trainer.sh follows the trainer's contract: resume from OUT/checkpoints/latest; on
# SIGUSR1/SIGTERM save and exit 75; rank 0 runs `scontrol requeue` first, after SIGUSR1 only
# (after a SIGTERM from scancel it would undo the cancel; docs/slurm.md).
cat >fake_trainer.sh <<'EOF'
#!/bin/bash
mode=$1; shift
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;; --teacher) teacher=$2; shift 2 ;; --out) out=$2; shift 2 ;;
    *) echo "unexpected argument $1"; exit 2 ;;
  esac
done
rank=$SLURM_PROCID r=${SLURM_RESTART_COUNT:-0}
from=fresh
[ -e "$out/checkpoints/latest" ] && from="resume $(cat "$out/checkpoints/latest")"
echo "rank $rank run $r $mode config=$config teacher=$teacher ntasks=$SLURM_NTASKS gpus=${CUDA_VISIBLE_DEVICES:-none} $from" >>"$out/trainer.log"
stop=0
trap 'stop=usr1' USR1
trap '[ $stop = 0 ] && stop=term' TERM
touch "$out/ready.$r.$rank"
for step in $(seq 1 600); do
  if [ $stop != 0 ]; then
    echo "rank $rank run $r checkpoint step $step ($stop)" >>"$out/trainer.log"
    if [ "$rank" = 0 ]; then
      mkdir -p "$out/checkpoints" && echo "step_$step" >"$out/checkpoints/latest"
      if [ $stop = usr1 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "${AC_NO_REQUEUE:-0}" != 1 ]; then
        scontrol requeue "$SLURM_JOB_ID"
      fi
    fi
    exit 75
  fi
  if [ "$r" -ge 1 ]; then echo "rank $rank run $r finished" >>"$out/trainer.log"; exit 0; fi
  sleep 0.1
done
exit 1
EOF
chmod +x fake_trainer.sh
mkdir -p run
id=$(sbatch --parsable --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --time=5 \
       --output="$T/tmpl-%j.out" \
       --export="ALL,AC_BIN=$T/fake_trainer.sh,CONFIG=tiny.cfg,TEACHER=/teacher,OUT=$T/run" \
       "$AC_SOURCE_DIR/slurm/distill_1node.sbatch") || fail "sbatch slurm/distill_1node.sbatch"
wait_file "$T/run/ready.0.0" 30 && wait_file "$T/run/ready.0.1" 10 || fail "template job did not start 2 ranks"
scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id"
wait_completed "$id" 60
log=$T/run/trainer.log
for rank in 0 1; do
  grep -q "rank $rank run 0 distill config=tiny.cfg teacher=/teacher ntasks=2 gpus=0,1 fresh" "$log" &&
    grep -q "rank $rank run 0 checkpoint step [0-9]* (usr1)" "$log" &&
    grep -q "rank $rank run 1 distill .* resume step_" "$log" &&
    grep -q "rank $rank run 1 finished" "$log" || fail "rank $rank did not checkpoint, requeue and resume:
$(cat "$log")"
done
[ "$(grep -c "run 1 finished" "$log")" = 2 ] && ! grep -q "run 2" "$log" || fail "job ran more than twice"
out=$T/tmpl-$id.out
# After rank 0's requeue Slurm cancels the step: the first run ends with srun's 75 or with that
# cancellation (srun then says 143), in both cases after the checkpoint (docs/slurm.md).
grep -q "got SIGUSR1" "$out" && grep -Eq "srun exited with 75|DUE TO JOB REQUEUE" "$out" &&
  grep -q "resuming from $T/run/checkpoints/latest" "$out" && grep -q "srun exited with 0" "$out" ||
  fail "template log does not show the preemption and the resumed run"
# Run mode, a step that never ran: srun exits 0 while OUT/stages still holds a "started" stage
# (after a requeue, Slurm 22.05 once aborted the new step "before step completely launched" and
# srun said 0). The template runs srun again; once every stage is done it stops. A stand-in
# for `autocompress run` leaves its stage started on the first call and done on the second.
cat >fake_run.sh <<'EOF'
#!/usr/bin/env bash
[ "${SLURM_PROCID:-0}" = 0 ] || exit 0  # one rank keeps the count
out=""
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
n=$(($(cat "$out/calls" 2>/dev/null || echo 0) + 1))
echo "$n" >"$out/calls"
mkdir -p "$out/stages"
if [ "$n" -eq 1 ]; then status=started; else status=done; fi
echo "{\"status\": \"$status\"}" >"$out/stages/search.json"
exit 0
EOF
chmod +x fake_run.sh
mkdir -p rrun
id=$(sbatch --parsable --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --time=5 --output="$T/retry-%j.out" \
       --export="ALL,AC_BIN=$T/fake_run.sh,AC_MODE=run,CONFIG=run.cfg,OUT=$T/rrun" \
       "$AC_SOURCE_DIR/slurm/distill_1node.sbatch") || fail "sbatch (run mode)"
wait_completed "$id" 60
out=$T/retry-$id.out
[ "$(cat "$T/rrun/calls")" = 2 ] || fail "run mode: srun ran $(cat "$T/rrun/calls") time(s), want 2 (once more for the started stage)"
[ "$(grep -c "has an unfinished stage (did its step launch?): srun again in 5 s (attempt 2 of 3)" "$out")" = 1 ] &&
  grep -q "srun exited with 0$" "$out" || fail "run mode: the template log does not show one retry:
$(cat "$out")"
echo "ok: run mode: a stage left started by an srun that exited 0 -> srun again once ($((SECONDS - t_start))s)"
# The two templates share their body.
diff <(sed -n '/^# ---- everything below/,$p' "$AC_SOURCE_DIR/slurm/distill_1node.sbatch") \
     <(sed -n '/^# ---- everything below/,$p' "$AC_SOURCE_DIR/slurm/distill_multinode.sbatch") >/dev/null ||
  fail "distill_1node.sbatch and distill_multinode.sbatch bodies differ"
echo "ok: distill template: USR1 -> both ranks checkpoint -> requeued once -> resumed ($((SECONDS - t_start))s)"
echo "PASS ($((SECONDS - t_start))s)"
