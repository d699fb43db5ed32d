#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU and no network (docs/gpu.md). NOT RUN YET:
# no GPU was lent to a session since it was written.
#
#   scripts/gpu_check.sh [RESULTS_FILE]     (default: gpu_check_results.txt)
#
# Needs there: python3 with a CUDA `torch` (its LibTorch; the pip nvidia-* packages, NCCL
# among them) and transformers, a CUDA toolkit (CUDA_HOME, default /usr/local/cuda), cmake,
# ninja and a C++17 compiler. The rest of the build (Open MPI, parallel HDF5, Boost,
# GoogleTest, nlohmann-json, PCRE2, zlib headers, pkgconf) comes from gpu-bundle/debs, made
# here by scripts/gpu_bundle.sh and carried with the call (`carry: ["gpu-bundle/debs"]`;
# ~30 MB); without it the machine's own packages are used. Missing pieces are named and the
# script stops.
#
# In <= 8 minutes (GPU_CHECK_BUDGET_S; the build first, each later step skipped once the
# budget is spent), into RESULTS_FILE:
#   1. builds autocompress, test_gpu and test_dist_mpi (Release) against the pip torch's
#      LibTorch, with the NCCL of the nvidia-nccl wheel (the one LibTorch itself loads);
#   2. ctest -L gpu: collectives on CUDA tensors (1 rank; blocking and asynchronous on the
#      communication stream), model on CUDA == CPU, KD step on CUDA == CPU, a checkpoint
#      saved from and read into device memory (pinned staging), trainer resume on CUDA;
#   3. the bf16 GEMM peak of this GPU measured with torch (8192^3 matmuls);
#   4. cost calibrate --device cuda (this GPU's profile), then cost validate --device cuda
#      against it: latency and memory MAPE of the cost model on real hardware;
#   5. the KD step against PyTorch eager on the same GPU and models (bench/bench_distill.py
#      --device cuda --size gpu: ~200M Llama teacher, ~100M student, bf16): tokens/s of both,
#      the ratio, and MFU against the measured peak;
#   6. if time is left, the same for a hybrid (Mamba-2 + attention + MoE) student: tokens/s and
#      MFU of `distill --device cuda` (no eager counterpart of our hybrid exists).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS=$(realpath -m "${1:-gpu_check_results.txt}")
BUDGET=${GPU_CHECK_BUDGET_S:-480}
W=${GPU_CHECK_DIR:-$ROOT/build-gpu-check}
B=$W/build
mkdir -p "$W"
: >"$RESULTS"
START=$SECONDS
log() { echo "$*" | tee -a "$RESULTS"; }
left() { echo $((BUDGET - (SECONDS - START))); }
section() { log ""; log "== $* (t=$((SECONDS - START)) s)"; }
stop() { log "STOPPED: $*"; exit 1; }
have_time() { [ "$(left)" -gt "${1:-30}" ] || { log "SKIPPED: $2 (time budget of ${BUDGET} s spent)"; return 1; }; }

section "machine"
log "date: $(date -u +%FT%TZ)  host: $(hostname)  git: $(git describe --always --dirty 2>/dev/null || echo '?')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$RESULTS"
PY=${PYTHON:-python3}
$PY - >>"$RESULTS" 2>&1 <<'EOF' || stop "python3 has no CUDA torch"
import torch
print("torch:", torch.__version__, "cuda:", torch.version.cuda, "available:", torch.cuda.is_available(),
      "devices:", torch.cuda.device_count(), "nccl:", ".".join(map(str, torch.cuda.nccl.version())))
assert torch.cuda.is_available()
EOF
tail -n1 "$RESULTS"
TORCH_PREFIX=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')
TORCH_LIB=$($PY -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
NCCL_DIR=$($PY -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) || NCCL_DIR=
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -f "$CUDA_HOME/include/cuda_runtime_api.h" ] || stop "no CUDA toolkit headers in $CUDA_HOME (set CUDA_HOME)"
for tool in cmake ninja c++; do command -v $tool >/dev/null || stop "no $tool on PATH"; done
NCCL_ARGS=()
if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/include/nccl.h" ]; then
  NCCL_LIB=$(ls "$NCCL_DIR"/lib/libnccl.so* | head -n1)
  NCCL_ARGS=(-DNCCL_INCLUDE_DIR="$NCCL_DIR/include" -DNCCL_LIBRARY="$NCCL_LIB")
  log "nccl: $NCCL_LIB (the wheel's, as LibTorch loads)"
else
  log "nccl: not in the torch wheel's packages; CMake looks in $CUDA_HOME (a second libnccl may clash with LibTorch's)"
fi
# The Debian bundle (scripts/gpu_bundle.sh): unpacked here, then first on every search path.
BUNDLE_CMAKE_ARGS=()
if ls "$ROOT"/gpu-bundle/debs/*.deb >/dev/null 2>&1; then
  command -v dpkg >/dev/null || stop "gpu-bundle/debs is here but dpkg is not (needed to unpack the .debs)"
  source "$ROOT/scripts/gpu_bundle.sh"
  bundle_unpack "$ROOT/gpu-bundle" || stop "unpacking gpu-bundle/debs"
  bundle_env "$ROOT/gpu-bundle/root"
  log "build dependencies: the Debian bundle in gpu-bundle/root ($(ls "$ROOT"/gpu-bundle/debs/*.deb | wc -l) packages)"
else
  log "build dependencies: this machine's own (no gpu-bundle/debs; make it with scripts/gpu_bundle.sh)"
fi
# The runtime libraries of the wheel's dependencies (cudnn, cublas, nccl, ...).
NV_LIBS=$($PY -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$TORCH_LIB:${NV_LIBS}:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

section "1. build (against $TORCH_PREFIX)"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$TORCH_PREFIX/Torch" \
  -DCaffe2_DIR="$TORCH_PREFIX/Caffe2" -DCMAKE_LIBRARY_PATH="$TORCH_LIB" \
  -DCUDAToolkit_ROOT="$CUDA_HOME" "${NCCL_ARGS[@]}" "${BUNDLE_CMAKE_ARGS[@]}" -DAC_BUILD_TESTS=ON \
  -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >"$W/cmake.log" 2>&1 || { tail -30 "$W/cmake.log" | tee -a "$RESULTS"; stop "cmake"; }
cmake --build "$B" -j "$(nproc)" --target autocompress test_gpu test_dist_mpi >"$W/build.log" 2>&1 ||
  { grep -m20 -E "error|Error" "$W/build.log" | tee -a "$RESULTS"; stop "build"; }
grep -E "AC_TORCH_HAS_CUDA|AC_HAVE_NCCL" "$B/generated/autocompress/build_info.h" | tee -a "$RESULTS"
grep -q "AC_TORCH_HAS_CUDA 1" "$B/generated/autocompress/build_info.h" || stop "the build did not find a CUDA LibTorch"
AC=$B/autocompress
"$AC" env --device auto 2>&1 | grep -E "LibTorch|NCCL|CUDA|World" | tee -a "$RESULTS"

section "2. ctest -L gpu"
if have_time 60 "ctest -L gpu"; then
  ctest --test-dir "$B" -L gpu --output-on-failure --timeout 240 >"$W/ctest.log" 2>&1
  echo "ctest rc $?" | tee -a "$RESULTS"
  grep -E "tests passed|Test +#|SKIP|Skipped|FAIL|\[  FAILED" "$W/ctest.log" | tee -a "$RESULTS"
fi

section "3. bf16 GEMM peak (torch)"
PEAK_TORCH=$($PY - 2>>"$RESULTS" <<'EOF'
import torch, time
torch.backends.cuda.matmul.allow_tf32 = False
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3): a @ b
torch.cuda.synchronize()
best = 0.0
for _ in range(5):
    t = time.perf_counter(); [a @ b for _ in range(10)]; torch.cuda.synchronize()
    best = max(best, 10 * 2 * n**3 / (time.perf_counter() - t))
print(f"{best:.6g}")
EOF
)
log "bf16 GEMM peak (torch, 8192^3): ${PEAK_TORCH:-?} FLOP/s"

section "4. cost calibrate + cost validate --device cuda"
MEM=$($PY -c 'import torch; print(torch.cuda.get_device_properties(0).total_memory)')
if have_time 60 "cost calibrate"; then
  timeout "$(left)" "$AC" cost calibrate --device cuda --dtype bfloat16 --quick --threads 0 --memory-bytes "$MEM" \
    --id gpu-local --out "$W/gpu-local.json" >"$W/calibrate.log" 2>&1
  echo "cost calibrate rc $?" | tee -a "$RESULTS"
  tail -n 25 "$W/calibrate.log" | tee -a "$RESULTS"
fi
if [ -f "$W/gpu-local.json" ] && have_time 60 "cost validate"; then
  timeout "$(left)" "$AC" cost validate --device cuda --dtype bfloat16 --hardware "$W/gpu-local.json" --threads 0 \
    --sweeps 2 --repeats 3 --out "$W/validate.json" >"$W/validate.log" 2>&1
  echo "cost validate rc $?" | tee -a "$RESULTS"
  grep -E "^cost validate|^MAPE|^device" "$W/validate.log" | tee -a "$RESULTS"
fi

section "5. KD step vs PyTorch eager (bench_distill.py --device cuda --size gpu)"
if have_time 90 "KD step vs eager"; then
  timeout "$(left)" $PY bench/bench_distill.py --bin "$AC" --device cuda --size gpu --seq 1024 --batch 16 --steps 12 \
    --threads "$(nproc)" --peak "${PEAK_TORCH:-0}" \
    $([ -f "$W/gpu-local.json" ] && echo "--hardware $W/gpu-local.json") >"$W/kd_eager.log" 2>&1
  echo "bench_distill rc $?" | tee -a "$RESULTS"
  tail -n 12 "$W/kd_eager.log" | tee -a "$RESULTS"
fi

section "6. KD step of a hybrid student (distill --device cuda --dtype bf16)"
if have_time 90 "hybrid KD step"; then
  D=$W/kd
  rm -rf "$D" && mkdir -p "$D"
  "$AC" data preprocess --input tests/fixtures/data/corpus/fortunes_sample.jsonl \
    --tokenizer tests/fixtures/data/tokenizer/gpt2-4k.tokenizer.json --output "$D/fortunes" >"$D/data.log" 2>&1 || stop "data preprocess"
  # A ~150M-parameter teacher and a ~100M student (tiny-teacher's pattern, wider and deeper).
  $PY - "$ROOT/configs/models/tiny-teacher.json" "$D" <<'EOF'
import json, sys
base = json.load(open(sys.argv[1]))
def make(name, hidden, pattern, ffn):
    a = json.loads(json.dumps(base))
    a["name"], a["hidden_size"], a["pattern"] = name, hidden, pattern
    d = a["defaults"]
    d["attention"].update(num_heads=hidden // 64, num_kv_heads=max(1, hidden // 256), head_dim=64)
    d["mamba"].update(num_heads=2 * hidden // 64, head_dim=64)
    d["mlp"]["ffn_size"] = ffn
    d["moe"].update(expert_ffn=ffn // 4, shared_ffn=ffn // 4)
    json.dump(a, open(f"{sys.argv[2]}/{name}.json", "w"), indent=1)
make("gpu-teacher", 1024, "M-*-M-*-M-*-ME", 4096)
make("gpu-student", 768, "M-*-M-*-ME", 3072)
EOF
  for m in gpu-teacher gpu-student; do "$AC" model info --arch "$D/$m.json" 2>&1 | grep -iE "param" | head -2 | sed "s/^/$m: /" | tee -a "$RESULTS"; done
  timeout "$(left)" "$AC" pretrain --device cuda --dtype bf16 --arch "$D/gpu-teacher.json" --data "$D/fortunes" \
    --seq-len 512 --micro-batch 4 --steps 2 --warmup 0 --eval-interval 0 --out "$D/teacher" >"$D/teacher.log" 2>&1 ||
    { tail -20 "$D/teacher.log" | tee -a "$RESULTS"; stop "teacher"; }
  HW=()
  [ -f "$W/gpu-local.json" ] && HW=(--hardware "$W/gpu-local.json")
  timeout "$(left)" "$AC" distill --device cuda --dtype bf16 --teacher "$D/teacher/checkpoints" --student "$D/gpu-student.json" \
    --data "$D/fortunes" --seq-len 512 --micro-batch 4 --steps 30 --warmup 2 --log-interval 10 --eval-interval 0 \
    --save-interval 0 "${HW[@]}" --out "$D/student" >"$D/distill.log" 2>&1
  echo "distill rc $?" | tee -a "$RESULTS"
  grep -E "^device:|^dtype:|^MFU|^step 30/|student parameters" "$D/distill.log" | tee -a "$RESULTS"
  $PY - "$D/student/metrics.jsonl" "${PEAK_TORCH:-0}" "$W/gpu-local.json" <<'EOF' | tee -a "$RESULTS"
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
last = rows[-1]
print(f"KD step: {last['tokens_per_s']:.0f} tokens/s at step {last['step']}")
if "mfu" in last and os.path.exists(sys.argv[3]):
    ours = json.load(open(sys.argv[3]))
    ours = ours.get("profile", ours).get("peak_flops", 0)
    print(f"MFU: {100 * last['mfu']:.1f}% of the calibrated peak ({ours:.4g} FLOP/s)")
    if float(sys.argv[2]) > 0 and ours > 0:
        print(f"MFU: {100 * last['mfu'] * ours / float(sys.argv[2]):.1f}% of the torch bf16 GEMM peak ({float(sys.argv[2]):.4g} FLOP/s)")
EOF
  # The scorecard measured on the GPU (issue 16): teacher and student on one request set, the
  # model on cuda, timestamps after a device synchronize, peak from the caching allocator.
  timeout "$(left)" "$AC" scorecard --device cuda --hardware "${HW[1]:-h100}" --engine local-eager --workload in-game \
    --checkpoint "$D/teacher/checkpoints" "$D/student/checkpoints" --requests-count 8 --concurrency 4 \
    --max-prompt-tokens 256 --max-output-tokens 32 --out "$D/scorecard" >"$D/scorecard.log" 2>&1
  echo "scorecard rc $?" | tee -a "$RESULTS"
  grep -E "^scorecard: device|^\| " "$D/scorecard.log" | tee -a "$RESULTS"
fi

section "done in $((SECONDS - START)) s; logs in $W"
