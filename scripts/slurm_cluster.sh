#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, from Debian's packages (slurmctld, slurmd,
# slurm-client, munge; `srun --mpi=pmix` through Slurm's mpi_pmix plugin and libpmix).
#
#   scripts/slurm_cluster.sh start  [--dir DIR] [--gpus N] [--timeout S]
#   scripts/slurm_cluster.sh stop   [--dir DIR]
#   scripts/slurm_cluster.sh status [--dir DIR]
#   scripts/slurm_cluster.sh env    [--dir DIR]     # prints `export SLURM_CONF=...`
#
# Everything lives under DIR (default: $AC_SLURM_DIR or /tmp/autocompress-slurm): its own
# munged (key and socket in DIR/munge), slurm.conf (DIR/etc), controller state, slurmd spool,
# logs (DIR/log) and pid files (DIR/run). Nothing under /etc is touched, so several clusters
# (other DIRs) can run side by side: the ports are picked free at start. Client commands find
# the cluster through SLURM_CONF: `source DIR/env.sh` or `eval "$(slurm_cluster.sh env)"`.
#
# Needs root (SlurmUser=root, munged as root). `start` first cleans up whatever a previous
# (possibly crashed) run with the same DIR left behind; `stop` cancels the jobs, shuts the
# daemons down (scontrol shutdown, then munged) and checks that nothing is left running.
#
# Sourcing this file defines the functions only (safe under `set -euo pipefail`) (ac_slurm_start DIR [--gpus N] [--timeout S],
# ac_slurm_stop DIR, ac_slurm_status DIR, ac_slurm_use DIR, ac_slurm_wait_job ID TIMEOUT,
# ac_slurm_have_packages), for tests that drive a cluster themselves.
#
# Exit codes: 0 ok; 1 failure (the message and the daemon logs say why); 2 bad usage;
# 3 (status) not running; 77 not root or the packages are missing (tests map it to SKIP).

AC_SLURM_DEFAULT_DIR=${AC_SLURM_DIR:-/tmp/autocompress-slurm}
# Seconds a requeued job waits before it may start again (Slurm: AuthInfo cred_expire,
# default 120; it is also the lifetime of a step's launch credential).
AC_SLURM_CRED_EXPIRE=${AC_SLURM_CRED_EXPIRE:-10}

_ac_slurm_log() { echo "slurm_cluster: $*" >&2; }

# 0 when every program the cluster needs is installed.
ac_slurm_have_packages() {
  local p missing=()
  for p in munged munge unmunge slurmctld slurmd sinfo sbatch srun scontrol squeue scancel; do
    command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] || missing+=("$p")
  done
  if [ ${#missing[@]} -ne 0 ]; then
    _ac_slurm_log "missing programs: ${missing[*]} (run scripts/setup.sh: munge slurmctld slurmd slurm-client libpmix-dev)"
    return 1
  fi
  local f found=""
  for f in /usr/lib/*/slurm-wlm/mpi_pmix.so /usr/lib/slurm/mpi_pmix.so /usr/lib64/slurm/mpi_pmix.so; do
    [ -e "$f" ] && found=$f
  done
  if [ -z "$found" ]; then
    _ac_slurm_log "Slurm's mpi_pmix plugin is missing (slurm-wlm-basic-plugins)"
    return 1
  fi
  return 0
}

_ac_slurm_sbin() { command -v "$1" 2>/dev/null || echo "/usr/sbin/$1"; }

# Points this shell's Slurm client commands at the cluster in DIR.
ac_slurm_use() {
  local dir; dir=$(realpath -m "$1")
  export SLURM_CONF="$dir/etc/slurm.conf"
}

# Two free TCP ports (controller, slurmd). Racy by nature; good enough for a scratch cluster.
_ac_slurm_free_ports() {
  if command -v python3 >/dev/null 2>&1; then
    python3 - <<'EOF' 2>/dev/null && return 0
import socket
socks = []
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
  fi
  # Fallback: the first pair above 16817 nobody listens on (per /proc/net/tcp*).
  local p used
  used=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk 'NR>1 && $4=="0A" {split($2,a,":"); print strtonum("0x" a[2])}')
  for ((p = 16817; p < 17800; p += 2)); do
    if ! grep -qx "$p" <<<"$used" && ! grep -qx "$((p + 1))" <<<"$used"; then
      echo "$p $((p + 1))"; return 0
    fi
  done
  return 1
}

# Is PID alive (not a zombie) and running program NAME (comm)? Guards against reused pids.
_ac_slurm_pid_is() {
  local pid=$1 name=$2 comm stat
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat:0:1}" != Z ] && [[ "$comm" == "$name"* ]]
}

_ac_slurm_pidfile_pid() { if [ -r "$1" ]; then tr -dc '0-9' <"$1"; fi; return 0; }

# Stops the process recorded in PIDFILE if it still runs NAME: TERM, wait, KILL.
_ac_slurm_kill_pidfile() {
  local pidfile=$1 name=$2 pid i
  pid=$(_ac_slurm_pidfile_pid "$pidfile")
  if _ac_slurm_pid_is "$pid" "$name"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do _ac_slurm_pid_is "$pid" "$name" || break; sleep 0.1; done
    if _ac_slurm_pid_is "$pid" "$name"; then
      _ac_slurm_log "$name (pid $pid) ignored SIGTERM; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  fi
  rm -f "$pidfile"
}

# slurmstepd processes that belong to the cluster in DIR (their working directory is DIR/log
# and they hold DIR/log/slurmd.log open).
_ac_slurm_stepd_pids() {
  local dir=$1 pid fd
  for pid in $(pgrep -x slurmstepd 2>/dev/null); do
    if [[ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" == "$dir/"* ]]; then echo "$pid"; continue; fi
    for fd in /proc/"$pid"/fd/*; do
      if [[ "$(readlink "$fd" 2>/dev/null)" == "$dir/"* ]]; then echo "$pid"; break; fi
    done
  done
}

# SIGKILL PID and every process below it (children first listed, then killed top-down so
# none is re-parented away before it is seen).
_ac_slurm_kill_tree() {
  local pid=$1 child
  kill -STOP "$pid" 2>/dev/null || true
  for child in $(pgrep -P "$pid" 2>/dev/null); do _ac_slurm_kill_tree "$child"; done
  kill -KILL "$pid" 2>/dev/null || true
}

ac_slurm_status() {
  local dir; dir=$(realpath -m "${1:-$AC_SLURM_DEFAULT_DIR}")
  local ok=0 name pid
  for name in munged slurmctld slurmd; do
    pid=$(_ac_slurm_pidfile_pid "$dir/run/$name.pid")
    if _ac_slurm_pid_is "$pid" "$name"; then
      echo "$name: running (pid $pid)"
    else
      echo "$name: not running"; ok=3
    fi
  done
  if [ $ok -eq 0 ]; then
    echo "SLURM_CONF=$dir/etc/slurm.conf"
    SLURM_CONF="$dir/etc/slurm.conf" sinfo 2>&1
    SLURM_CONF="$dir/etc/slurm.conf" squeue 2>&1
  fi
  return $ok
}

ac_slurm_stop() {
  local dir; dir=$(realpath -m "${1:-$AC_SLURM_DEFAULT_DIR}")
  [ -d "$dir" ] || return 0
  local conf="$dir/etc/slurm.conf" i pid ctld
  ctld=$(_ac_slurm_pidfile_pid "$dir/run/slurmctld.pid")
  if [ -r "$conf" ] && _ac_slurm_pid_is "$ctld" slurmctld; then
    # Jobs first (slurmstepd outlives slurmd otherwise), then the daemons.
    local jobs
    jobs=$(SLURM_CONF="$conf" timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
      # shellcheck disable=SC2086
      SLURM_CONF="$conf" timeout 10 scancel $jobs 2>/dev/null
      for ((i = 0; i < 100; i++)); do
        [ -z "$(SLURM_CONF="$conf" timeout 10 squeue -h -o %A 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
    SLURM_CONF="$conf" timeout 10 scontrol shutdown >/dev/null 2>&1
    for ((i = 0; i < 100; i++)); do
      _ac_slurm_pid_is "$ctld" slurmctld || _ac_slurm_pid_is "$(_ac_slurm_pidfile_pid "$dir/run/slurmd.pid")" slurmd || break
      sleep 0.1
    done
  fi
  # Whatever is still there (a crashed run, a daemon that did not answer).
  _ac_slurm_kill_pidfile "$dir/run/slurmd.pid" slurmd
  _ac_slurm_kill_pidfile "$dir/run/slurmctld.pid" slurmctld
  for pid in $(_ac_slurm_stepd_pids "$dir"); do
    _ac_slurm_log "killing leftover slurmstepd (pid $pid) and the job processes under it"
    _ac_slurm_kill_tree "$pid"
  done
  _ac_slurm_kill_pidfile "$dir/run/munged.pid" munged
  rm -f "$dir/munge/munge.socket.2" "$dir/munge/munge.socket.2.lock"
  return 0
}

_ac_slurm_dump_logs() {
  local dir=$1 f
  for f in "$dir/log/slurmctld.log" "$dir/log/slurmd.log" "$dir/munge/munged.log"; do
    [ -r "$f" ] || continue
    echo "---- last lines of $f" >&2
    tail -n 25 "$f" >&2
  done
}

ac_slurm_start() {
  local dir; dir=$(realpath -m "${1:-$AC_SLURM_DEFAULT_DIR}")
  shift || true
  local gpus=0 timeout=30
  while [ $# -gt 0 ]; do
    case "$1" in
      --gpus) gpus=$2; shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      *) _ac_slurm_log "unknown start option: $1"; return 2 ;;
    esac
  done
  if ! [[ "$gpus" =~ ^[0-9]+$ && "$timeout" =~ ^[0-9]+$ ]]; then
    _ac_slurm_log "--gpus and --timeout take whole numbers"; return 2
  fi
  # munged's socket (and slurmstepd's, under the spool) must fit a sockaddr_un (108 bytes).
  if [ ${#dir} -gt 80 ]; then
    _ac_slurm_log "--dir path too long for Unix sockets (${#dir} > 80 characters): $dir"; return 2
  fi
  if [ "$(id -u)" -ne 0 ]; then
    _ac_slurm_log "needs root (SlurmUser=root, munged as root)"; return 77
  fi
  ac_slurm_have_packages || return 77

  # A previous run with this DIR (crashed or not) goes first.
  ac_slurm_stop "$dir"
  rm -rf "${dir:?}/etc" "${dir:?}/dev" "${dir:?}/state" "${dir:?}/spool" "${dir:?}/log" "${dir:?}/run" \
    "${dir:?}/munge" "${dir:?}/env.sh"
  mkdir -p "$dir/etc" "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/munge" || return 1
  # munged refuses directories others can write to and keys others can read.
  chmod 755 "$dir" "$dir/etc" "$dir/log" "$dir/run"
  chmod 700 "$dir/state" "$dir/spool"
  chmod 755 "$dir/munge"

  local host cpus ports ctld_port slurmd_port
  host=$(hostname -s)
  # (nproc alone honours OMP_NUM_THREADS, which ctest sets to 1)
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  ports=$(_ac_slurm_free_ports) || { _ac_slurm_log "no free ports"; return 1; }
  read -r ctld_port slurmd_port <<<"$ports"

  # munge: own key, socket, pid and log under DIR.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1 count=1024 status=none || return 1
  chmod 400 "$dir/munge/munge.key"
  local sock="$dir/munge/munge.socket.2"
  if ! "$(_ac_slurm_sbin munged)" --force --socket="$sock" --key-file="$dir/munge/munge.key" \
      --log-file="$dir/munge/munged.log" --pid-file="$dir/run/munged.pid" \
      --seed-file="$dir/munge/munged.seed" >"$dir/log/munged.out" 2>&1; then
    _ac_slurm_log "munged did not start:"; cat "$dir/log/munged.out" >&2
    _ac_slurm_dump_logs "$dir"; return 1
  fi
  if ! munge --socket="$sock" -n 2>/dev/null | unmunge --socket="$sock" >/dev/null 2>&1; then
    _ac_slurm_log "munge round trip failed"; _ac_slurm_dump_logs "$dir"; ac_slurm_stop "$dir"; return 1
  fi

  local gres_node="" gres_types=""
  if [ "$gpus" -gt 0 ]; then
    # Stand-in GPUs so --gpus-per-node jobs (the templates) schedule here. Slurm drops
    # file-less GPUs and wants character devices: DIR/dev/gpuN are symlinks to /dev/null
    # (nothing opens them with task/none). Jobs see CUDA_VISIBLE_DEVICES=0..N-1.
    mkdir -p "$dir/dev"
    local g
    for ((g = 0; g < gpus; g++)); do ln -s /dev/null "$dir/dev/gpu$g"; done
    gres_types="GresTypes=gpu"
    gres_node="Gres=gpu:$gpus"
    echo "NodeName=$host Name=gpu File=$dir/dev/gpu[0-$((gpus - 1))]" >"$dir/etc/gres.conf"
  fi

  local mpi_default=pmix
  cat >"$dir/etc/slurm.conf" <<EOF
# Generated by scripts/slurm_cluster.sh: a single-node scratch cluster under $dir
ClusterName=autocompress
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock,cred_expire=$AC_SLURM_CRED_EXPIRE
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=$mpi_default
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Schedule often: a requeued job becomes eligible after cred_expire seconds, and the default
# intervals (60 s main loop, 30 s backfill) would add up to a minute on top.
SchedulerParameters=sched_interval=1,bf_interval=1
MailProg=/bin/true
ReturnToService=2
# Preemption: every job may be requeued; exit code 75 (EX_TEMPFAIL, what the trainer returns
# after its preemption checkpoint) puts the job back in the queue.
JobRequeue=1
RequeueExit=75
KillWait=10
MinJobAge=600
$gres_types
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN $gres_node
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  echo "export SLURM_CONF=$dir/etc/slurm.conf" >"$dir/env.sh"

  local conf="$dir/etc/slurm.conf"
  if ! SLURM_CONF="$conf" "$(_ac_slurm_sbin slurmctld)" -f "$conf" -c >"$dir/log/slurmctld.out" 2>&1; then
    _ac_slurm_log "slurmctld did not start:"; cat "$dir/log/slurmctld.out" >&2
    _ac_slurm_dump_logs "$dir"; ac_slurm_stop "$dir"; return 1
  fi
  if ! SLURM_CONF="$conf" "$(_ac_slurm_sbin slurmd)" -f "$conf" >"$dir/log/slurmd.out" 2>&1; then
    _ac_slurm_log "slurmd did not start:"; cat "$dir/log/slurmd.out" >&2
    _ac_slurm_dump_logs "$dir"; ac_slurm_stop "$dir"; return 1
  fi

  local t0=$SECONDS state=""
  while [ $((SECONDS - t0)) -lt "$timeout" ]; do
    state=$(SLURM_CONF="$conf" timeout 5 sinfo -h -n "$host" -o %T 2>/dev/null | head -n1)
    [ "$state" = "idle" ] && break
    sleep 0.5
  done
  if [ "$state" != "idle" ]; then
    _ac_slurm_log "node $host not idle after ${timeout}s (state: '${state:-none}')"
    SLURM_CONF="$conf" timeout 5 sinfo -R >&2 2>&1
    _ac_slurm_dump_logs "$dir"
    ac_slurm_stop "$dir"
    return 1
  fi
  _ac_slurm_log "up in $((SECONDS - t0))s: node $host idle, $cpus CPUs, gpus $gpus, ports $ctld_port/$slurmd_port; export SLURM_CONF=$conf"
  return 0
}

# Waits until job ID has left the queue for good (not pending, not running, not requeued).
# Prints its last state; 1 on timeout.
ac_slurm_wait_job() {
  local id=$1 timeout=${2:-60} t0=$SECONDS st=""
  while [ $((SECONDS - t0)) -lt "$timeout" ]; do
    st=$(timeout 5 squeue -h -t all -j "$id" -o %T 2>/dev/null | head -n1)
    case "$st" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        echo "$st"; return 0 ;;
      "") echo "GONE"; return 0 ;;
    esac
    sleep 0.5
  done
  echo "$st"
  return 1
}

# Run as a script (not sourced): the command line.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  cmd=${1:-}
  [ $# -gt 0 ] && shift
  dir=$AC_SLURM_DEFAULT_DIR
  rest=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --dir) dir=$2; shift 2 ;;
      --dir=*) dir=${1#--dir=}; shift ;;
      *) rest+=("$1"); shift ;;
    esac
  done
  case "$cmd" in
    start) ac_slurm_start "$dir" "${rest[@]}" ;;
    stop) ac_slurm_stop "$dir" ;;
    status) ac_slurm_status "$dir" ;;
    env) echo "export SLURM_CONF=$(realpath -m "$dir")/etc/slurm.conf" ;;
    *) echo "usage: $0 start|stop|status|env [--dir DIR] [--gpus N] [--timeout S]" >&2; exit 2 ;;
  esac
  exit $?
fi
