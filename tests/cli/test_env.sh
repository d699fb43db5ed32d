#!/usr/bin/env bash
# `autocompress env`: versions, a planned grid, the real grid under mpirun, refusals,
# config files with command-line overrides, and the run manifest.
source "$(dirname "$0")/lib.sh"
T=$AC_TEST_TMP

expect_rc 0 "$AC_BIN" env
expect_out "LibTorch"
expect_out "MPI  "
expect_out "HDF5"
expect_out "NCCL"
expect_out "Rank grid: TP 1 x DP 1 = 1 ranks"
# The CPU, its bf16-relevant ISA and the dtype `auto` picks, consistent with /proc/cpuinfo.
expect_out "CPU  "
expect_out "avx512_bf16 \(yes\|no\)"
if grep -qwE "avx512_bf16|amx_bf16" /proc/cpuinfo; then want=bf16; else want=f32; fi
expect_out "dtype *auto -> $want "
# Denormals flushed by default (dist/omp_env.h); AC_KEEP_DENORMALS=1 keeps them.
expect_out "Denormals *flushed to zero (FTZ + DAZ"
expect_rc 0 env AC_KEEP_DENORMALS=1 "$AC_BIN" env
expect_out "Denormals *kept (AC_KEEP_DENORMALS=1"
# The CPU allocator's reuse of freed blocks: its cap, set or switched off by AC_CPU_CACHE_MB,
# and a bad value refused by name before anything runs.
expect_out "Allocator *freed CPU blocks >= 1 MiB kept for reuse, up to [0-9]* MiB (AC_CPU_CACHE_MB)"
expect_rc 0 env AC_CPU_CACHE_MB=96 "$AC_BIN" env
expect_out "Allocator *freed CPU blocks >= 1 MiB kept for reuse, up to 96 MiB"
expect_rc 0 env AC_CPU_CACHE_MB=0 "$AC_BIN" env
expect_out "Allocator *no reuse of freed CPU blocks (AC_CPU_CACHE_MB=0)"
expect_rc 2 env AC_CPU_CACHE_MB=lots "$AC_BIN" env
expect_out "AC_CPU_CACHE_MB: lots: expected MiB of freed CPU blocks to keep"
# The cost profile of this machine that cpu-local would use: none in an empty cache; after a
# calibration into the cache, where it is, when and under what load it was made.
rm -rf "$T/cache"  # a second run in one build dir starts from an empty cache too
expect_rc 0 env AC_CACHE_DIR="$T/cache" "$AC_BIN" env
expect_out "Profile *cpu-local (.*): none for this CPU and build yet; calibrated on first use into $T/cache/hardware/cpu-local-"
expect_rc 0 "$AC_BIN" cost calibrate --quick --cache-dir "$T/cache"
expect_out "other processes used [0-9.]* of [0-9]* cores meanwhile"
expect_out "GEMM line: [0-9.]* us per call + [0-9.]* ns per weight byte + FLOPs at [0-9.]* GFLOP/s"
expect_rc 0 env AC_CACHE_DIR="$T/cache" "$AC_BIN" env
expect_out "Profile *cpu-local (.*): $T/cache/hardware/cpu-local-.*, calibrated 20[0-9-]*T[0-9:]*Z, other processes used [0-9.]* of [0-9]* cores"
# `cost show` says the same of the profile `--hardware cpu-local` uses, with its kernels; a GPU
# profile records no calibration.
expect_rc 0 "$AC_BIN" cost show --cache-dir "$T/cache"
expect_out "profile: cpu-local (.*): $T/cache/hardware/cpu-local-.*, calibrated 20[0-9-]*T[0-9:]*Z, other processes used [0-9.]* of [0-9]* cores meanwhile; .*, kernels [0-9a-f]\{12\}"
expect_rc 0 "$AC_BIN" cost show --hardware h100
expect_out "profile: h100 (.*): no record of the machine that calibrated it"

# Planning a grid without mpirun.
expect_rc 0 "$AC_BIN" env --tp 2 --dp 2
expect_out "Rank grid: TP 2 x DP 2 = 4 ranks"
expect_out "TP groups: \[0 1\] \[2 3\]"
expect_out "DP groups: \[0 2\] \[1 3\]"
expect_rc 2 "$AC_BIN" env --tp 8 --dp 1 --heads 4
expect_out "larger than the 4 attention heads"
# Expert parallelism folded onto DP (Megatron's MoE order), and EP not dividing DP.
expect_rc 0 "$AC_BIN" env --tp 2 --dp 4 --ep 2
expect_out "EP 2 over DP ranks, expert DP 2"
expect_out "EP groups: \[0 2\] \[1 3\] \[4 6\] \[5 7\]"
expect_out "expert-DP groups: \[0 4\] \[1 5\] \[2 6\] \[3 7\]"
expect_rc 2 "$AC_BIN" env --tp 2 --dp 3 --ep 2
expect_out "ep: expert-parallel size 2 does not divide the data-parallel size 3"

# The real grid under mpirun, and its JSON.
expect_rc 0 $MPIEXEC -n 4 "$AC_BIN" env --tp 2
expect_out "Rank grid: TP 2 x DP 2 = 4 ranks"
expect_out "local_rank"
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" env --json
python3 -c "import json,sys; d=json.load(open('$T/out')); assert d['layout']['dp']==2 and d['layout']['tp']==1, d['layout']" \
  || fail "env --json under 2 ranks"
# The allocator's default cap is shared by the ranks on the node: half of one process's at two.
cp "$T/out" "$T/env2.json"
expect_rc 0 "$AC_BIN" env --json
python3 -c "
import json
one = json.load(open('$T/out'))['build']['cpu_tensor_cache']['limit_bytes']
two = json.load(open('$T/env2.json'))['build']['cpu_tensor_cache']['limit_bytes']
assert one > 0 and two == one // 2, (one, two)" || fail "the CPU cache cap per rank"

# A bad layout: 3 ranks with TP = 2 is refused on every rank, exit 2, no hang.
start=$(date +%s)
expect_rc 2 $MPIEXEC -n 3 "$AC_BIN" env --tp 2
expect_out "world size 3 is not divisible by the tensor-parallel size 2"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "bad layout took too long"

# Config file + command-line override + manifest.
cat >"$T/run.cfg" <<CFG
# comment
tp = 2
[env]
dp = 2
[bench.comm]
max-bytes = 1MiB
CFG
rm -rf "$T/run1"
expect_rc 0 "$AC_BIN" env --config "$T/run.cfg" --out "$T/run1"
expect_out "Rank grid: TP 2 x DP 2 = 4 ranks"
expect_rc 0 "$AC_BIN" env --config "$T/run.cfg" --tp 4 --dp 1 --out "$T/run2"
expect_out "Rank grid: TP 4 x DP 1 = 4 ranks"
python3 - "$T" <<'PY' || fail "manifest"
import json, sys
t = sys.argv[1]
m = json.load(open(f"{t}/run2/manifest.json"))
assert m["subcommand"] == "env", m["subcommand"]
assert m["config"]["tp"] == {"value": 4, "source": "cli"}, m["config"]["tp"]
assert m["config"]["dp"] == {"value": 1, "source": "cli"}, m["config"]["dp"]
assert m["config"]["heads"]["source"] == "default"
assert m["config"]["config"]["source"] == "cli"
assert m["layout"]["tp"] == 4 and m["layout"]["dp"] == 1
for k in ("libtorch", "mpi", "hdf5", "nccl", "cuda", "threads", "autocompress", "cpu"):
    assert k in m["build"], k
# The CPU and the dtype `auto` picks on it, as the kernel lists the CPU's features.
flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split(":", 1)[1].split()
native = "avx512_bf16" in flags or "amx_bf16" in flags
assert m["build"]["cpu"]["avx512_bf16"] == ("avx512_bf16" in flags), m["build"]["cpu"]
assert m["build"]["cpu"]["dtype_auto"] == ("bf16" if native else "f32"), m["build"]["cpu"]
m1 = json.load(open(f"{t}/run1/manifest.json"))
assert m1["config"]["tp"] == {"value": 2, "source": "config"}, m1["config"]["tp"]
assert m1["config"]["dp"] == {"value": 2, "source": "config"}, m1["config"]["dp"]
print("manifest ok")
PY
[ ! -e "$T/run2/manifest.json.tmp" ] || fail "temporary manifest left behind"

# Bad config files: unknown key, malformed line, missing file -> exit 2 naming file and key.
printf 'tp = 2\nbogus = 1\n' >"$T/bad.cfg"
expect_rc 2 "$AC_BIN" env --config "$T/bad.cfg"
expect_out "bad.cfg: bogus: unknown option for 'autocompress env' (line 2)"
printf '[env]\nthis line has no equals\n' >"$T/bad2.cfg"
expect_rc 2 "$AC_BIN" env --config "$T/bad2.cfg"
expect_out "bad2.cfg: line 2: expected 'key = value'"
expect_rc 2 "$AC_BIN" env --config "$T/missing.cfg"
expect_out "missing.cfg: --config: cannot open"
printf 'tp = two\n' >"$T/bad3.cfg"
expect_rc 2 "$AC_BIN" env --config "$T/bad3.cfg"
expect_out "tp"
# oneDNN's primitive caches: 16384 entries by default (dist/omp_env.h), a value the user set is kept.
expect_rc 0 env -u ONEDNN_PRIMITIVE_CACHE_CAPACITY -u LRU_CACHE_CAPACITY "$AC_BIN" env
expect_out "ONEDNN_PRIMITIVE_CACHE_CAPACITY 16384, LRU_CACHE_CAPACITY 16384"
expect_rc 0 env -u LRU_CACHE_CAPACITY ONEDNN_PRIMITIVE_CACHE_CAPACITY=7 "$AC_BIN" env
expect_out "ONEDNN_PRIMITIVE_CACHE_CAPACITY 7, LRU_CACHE_CAPACITY 16384"
# OpenMP waiting: GOMP_SPINCOUNT=1000 by default (the launcher re-executes itself with it
# before MPI_Init), a value the user set (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is kept and no
# default is added, AC_NO_REEXEC=1 turns the re-exec off; under mpirun the re-executed ranks
# still form the job. (Not for single-threaded runs: this suite's OMP_NUM_THREADS=1 keeps the default.)
expect_rc 0 env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u AC_NO_REEXEC OMP_NUM_THREADS=2 "$AC_BIN" env
expect_out "OMP_WAIT_POLICY unset, GOMP_SPINCOUNT 1000"
expect_rc 0 env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u AC_NO_REEXEC -u OMP_NUM_THREADS "$AC_BIN" env
if [ "$(nproc)" -gt 1 ]; then expect_out "GOMP_SPINCOUNT 1000"; fi
expect_rc 0 env -u AC_NO_REEXEC -u GOMP_SPINCOUNT OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 "$AC_BIN" env
expect_out "OMP_WAIT_POLICY PASSIVE, GOMP_SPINCOUNT unset"
expect_rc 0 env -u AC_NO_REEXEC -u OMP_WAIT_POLICY GOMP_SPINCOUNT=7 OMP_NUM_THREADS=2 "$AC_BIN" env
expect_out "OMP_WAIT_POLICY unset, GOMP_SPINCOUNT 7"
expect_rc 0 env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT AC_NO_REEXEC=1 OMP_NUM_THREADS=2 "$AC_BIN" env
expect_out "OMP_WAIT_POLICY unset, GOMP_SPINCOUNT unset"
expect_rc 0 env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u AC_NO_REEXEC "$AC_BIN" env
expect_out "OMP_WAIT_POLICY unset, GOMP_SPINCOUNT unset"
expect_rc 0 env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u AC_NO_REEXEC OMP_NUM_THREADS=2 $MPIEXEC -n 2 "$AC_BIN" env --json
python3 -c "
import json
d = json.load(open('$T/out'))
assert d['layout']['world_size'] == 2, d['layout']
assert d['build']['threads']['gomp_spincount'] == '1000', d['build']['threads']
assert d['build']['threads']['omp_wait_policy'] == '', d['build']['threads']
" || fail "env --json under 2 re-executed ranks"
# OpenBLAS's own thread pool follows the launcher's thread count (dist::set_compute_threads):
# 2 ranks on this node share its hardware threads, and OpenBLAS must not keep one thread per
# core in every rank. (0 = LibTorch does not run on OpenBLAS; scripts/setup.sh selects it.)
expect_rc 0 env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS $MPIEXEC -n 2 "$AC_BIN" env --json
python3 -c "
import json, os
t = json.load(open('$T/out'))['build']['threads']
want = max(1, os.cpu_count() // 2)
assert t['intra_op'] == want, t
assert t['openblas'] in (0, want), t
" || fail "OpenBLAS threads under 2 ranks"
echo PASS
