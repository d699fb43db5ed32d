# Shared by the tests that run real jobs on a real Slurm cluster (test_slurm_distill.sh,
# test_slurm_run.sh): the cluster functions (scripts/slurm_cluster.sh), the SKIP checks
# (exit 77: not root, packages missing), T and CL, fail() (shows the job outputs and logs
# under T and the controller's log, then exits 1) and cluster_up. Source it after any other
# helper that defines fail (tests/cli/lib.sh does).
: "${AC_BIN:?}" "${AC_SOURCE_DIR:?}" "${AC_TEST_TMP:?}" "${MPIEXEC:?}"
source "$AC_SOURCE_DIR/scripts/slurm_cluster.sh"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root (SlurmUser=root)"; exit 77; fi
if ! ac_slurm_have_packages; then echo "SKIP: Slurm/munge packages missing (scripts/setup.sh installs them)"; exit 77; fi
T=$AC_TEST_TMP
CL=$T/cluster
fail() {
  echo "FAIL: $*"
  local f
  for f in "$T"/*.out "$T"/*.log "$CL/log/slurmctld.log"; do
    [ -r "$f" ] || continue
    echo "---- $f (last 40 lines)"; tail -n 40 "$f"
  done
  exit 1
}
# cluster_up: starts the cluster in CL with 2 stand-in GPUs, stops it when the test exits, and
# points the client commands (sbatch, squeue, scancel) at it.
cluster_up() {
  trap 'ac_slurm_stop "$CL"' EXIT
  ac_slurm_start "$CL" --gpus 2 --timeout 30 || fail "cluster did not start"
  ac_slurm_use "$CL"
}
