#!/usr/bin/env bash
# The CUDA compile check (CI runs it; README "Test"): builds the libraries and the
# `autocompress` binary against the CUDA LibTorch of a pinned pip `torch` wheel, with the
# CUDA toolkit and NCCL of /usr/local/cuda, so that the GPU code (NCCL communicator, CUDA
# streams, pinned staging, the CUDA paths of every stage) cannot rot on a CPU-only CI. It
# then loads the binary with every symbol bound and checks that a CUDA build with no GPU
# visible falls back to the CPU for `--device auto` and refuses `--device cuda` with exit 2.
# Nothing runs on a GPU here (docs/gpu.md).
#
#   scripts/check_cuda_build.sh            (build folder: build-cuda; CUDA_BUILD_DIR to change)
#
# Without a CUDA toolkit at $CUDA_HOME (default /usr/local/cuda) it says so and exits 0: a
# CPU-only machine has no GPU path to compile. With one, any failure exits 1.
#
# Cost on a fresh machine (docs/gpu.md "CI"): the wheels (~760 MB, once; cached in
# $AC_WHEEL_CACHE, default ~/.cache/autocompress/wheels, checked by sha256), unpacking the
# LibTorch (~1 GB), and ~70 translation units at -O0 -g0 with the LibTorch PCH.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
B=${CUDA_BUILD_DIR:-build-cuda}
CACHE=${AC_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/autocompress/wheels}
say() { echo "cuda-build: $*"; }
fail() { echo "cuda-build: FAIL: $*" >&2; exit 1; }

if [ ! -f "$CUDA_HOME/include/cuda_runtime_api.h" ]; then
  say "SKIPPED: no CUDA toolkit at $CUDA_HOME (a CPU-only machine; set CUDA_HOME to another" \
    "toolkit). The GPU path was not compiled."
  exit 0
fi
# NCCL: its header and library, found here and handed to CMake by path. Toolkits lay NCCL out
# differently (lib64 or lib, targets/x86_64-linux, a distribution's multiarch folder, with or
# without the libnccl.so development link); a CI run once compiled without the NCCL
# communicator because CMake's own search missed the library. Where it is cannot be a guess.
NCCL_ROOTS=(${NCCL_HOME:+"$NCCL_HOME"} "$CUDA_HOME" /usr /usr/local)
NCCL_H=""
NCCL_SO=""
for r in "${NCCL_ROOTS[@]}"; do
  [ -z "$NCCL_H" ] && NCCL_H=$(find -L "$r/include" "$r/targets" -maxdepth 4 -name nccl.h 2>/dev/null | head -n 1)
  [ -z "$NCCL_SO" ] && NCCL_SO=$(find -L "$r/lib64" "$r/lib" "$r/targets" -maxdepth 4 \
    \( -name libnccl.so -o -name 'libnccl.so.[0-9]*' \) 2>/dev/null | sort | head -n 1)
done
[ -n "$NCCL_SO" ] || NCCL_SO=$(ldconfig -p 2>/dev/null | sed -n 's/.*libnccl\.so\.[0-9]* .*=> //p' | head -n 1)
[ -n "$NCCL_H" ] || fail "no nccl.h under ${NCCL_ROOTS[*]}: the NCCL communicator cannot be compiled (set NCCL_HOME)"
[ -n "$NCCL_SO" ] || fail "no libnccl.so* under ${NCCL_ROOTS[*]} nor in ldconfig's cache (set NCCL_HOME)"
say "NCCL: $NCCL_H, $NCCL_SO"

# The pinned wheels: torch 2.11.0 is the CUDA 13.0 LibTorch whose pins (cuDNN 9.19.0.56,
# NCCL 2.28.9, cuda-toolkit 13.0.2) match /usr/local/cuda here, and the torch of the GPU
# machine the project is lent. The three nvidia wheels are the runtime libraries that
# libtorch_cuda.so needs and /usr/local/cuda lacks; with them the link resolves every symbol
# and the binary loads. Name, sha256, pip requirement.
WHEELS=(
  "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl 7aa2f9bbc6d4595ba72138026b2074be1233186150e9292865e04b7a63b8c67a torch==2.11.0"
  "nvidia_cufile-1.15.1.6-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 08a3ecefae5a01c7f5117351c64f17c7c62efa5fffdbe24fc7d298da19cd0b44 nvidia-cufile==1.15.1.6"
  "nvidia_cusparselt_cu13-0.8.0-py3-none-manylinux2014_x86_64.whl 25e30a8a7323935d4ad0340b95a0b69926eee755767e8e0b1cf8dd85b197d3fd nvidia-cusparselt-cu13==0.8.0"
  "nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 290f0a2ee94c9f3687a02502f3b9299a9f9fe826e6d0287ee18482e78d495b80 nvidia-nvshmem-cu13==3.4.5"
)
mkdir -p "$CACHE" "$B"
# A wheel verified once gets a stamp (its sha256, newer than the file): reruns skip hashing.
verified() { [ -f "$CACHE/$1" ] && [ -f "$CACHE/$1.sha256-ok" ] && [ "$CACHE/$1.sha256-ok" -nt "$CACHE/$1" ] &&
  [ "$(cat "$CACHE/$1.sha256-ok")" = "$2" ]; }
for w in "${WHEELS[@]}"; do
  read -r file sha req <<<"$w"
  verified "$file" "$sha" && continue
  if [ -f "$CACHE/$file" ] && echo "$sha  $CACHE/$file" | sha256sum --quiet -c - 2>/dev/null; then
    echo "$sha" >"$CACHE/$file.sha256-ok"
    continue
  fi
  rm -f "$CACHE/$file"
  say "downloading $req (the cp311 manylinux x86-64 wheel, without its dependencies)"
  python3 -m pip download -q --no-cache-dir --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp --abi cp311 --abi none --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$CACHE" "$req"
  [ -f "$CACHE/$file" ] || fail "pip did not fetch $file"
  echo "$sha  $CACHE/$file" | sha256sum --quiet -c - || { rm -f "$CACHE/$file"; fail "$file: sha256 mismatch"; }
  echo "$sha" >"$CACHE/$file.sha256-ok"
done
say "wheels ready in $CACHE ($((SECONDS - START)) s)"

# Unpack what a C++ build needs: LibTorch's headers, CMake files and shared libraries, and the
# three runtime libraries. Kept per wheel, so a rebuild in this folder does not unpack again.
TORCH_WHEEL=${WHEELS[0]%% *}
T=$B/torch
if [ ! -f "$T/.done-$TORCH_WHEEL" ]; then
  rm -rf "$T" && mkdir -p "$T/extra-lib"
  python3 - "$CACHE" "$T" "${WHEELS[@]%% *}" <<'EOF'
import os, shutil, sys, zipfile
cache, out, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(os.path.join(cache, wheels[0])) as z:
    z.extractall(out, [n for n in z.namelist()
                       if n.startswith(("torch/include/", "torch/share/cmake/"))
                       or (n.startswith("torch/lib/") and ".so" in n)])
for w in wheels[1:]:
    with zipfile.ZipFile(os.path.join(cache, w)) as z:
        for n in z.namelist():
            if "/lib/" in n and ".so" in os.path.basename(n):
                with z.open(n) as src, open(os.path.join(out, "extra-lib", os.path.basename(n)), "wb") as dst:
                    shutil.copyfileobj(src, dst)
EOF
  touch "$T/.done-$TORCH_WHEEL"
fi
T=$(cd "$T" && pwd)
TORCH_LIB=$T/torch/lib
EXTRA_LIB=$T/extra-lib
CUDA_LIB=$CUDA_HOME/lib64
[ -d "$CUDA_LIB" ] || CUDA_LIB=$CUDA_HOME/lib
say "LibTorch unpacked in $T ($((SECONDS - START)) s)"

# A compile + link check: -O0 -g0 (Debug, so debug-only asserts compile too), the LibTorch
# PCH, a unity build (AC_UNITY_BUILD), no tests, no benches. Loading the CUDA LibTorch's ~0.7 GB
# PCH costs ~15 s of CPU per translation unit, whatever it holds (a 40-line source: 16.7 s):
# one unit per source, the check compiled 117 of them, the longest part of CI on 2 cores;
# batches of 16 sources load it ~20 times. -rpath-link lets the linker resolve what
# libtorch_cuda.so needs, so an undefined symbol anywhere fails the link. A fresh cache each
# time: nothing found for another LibTorch survives.
rm -f "$B/build/CMakeCache.txt"
NVCC_ARGS=()
[ -x "$CUDA_HOME/bin/nvcc" ] && NVCC_ARGS=(-DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc")
cmake -S . -B "$B/build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g0" \
  -DAC_UNITY_BUILD=ON \
  -DTorch_DIR="$T/torch/share/cmake/Torch" -DCaffe2_DIR="$T/torch/share/cmake/Caffe2" \
  -DCUDAToolkit_ROOT="$CUDA_HOME" "${NVCC_ARGS[@]}" -DCMAKE_LIBRARY_PATH="$TORCH_LIB" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$EXTRA_LIB:$TORCH_LIB:$CUDA_LIB" \
  -DNCCL_INCLUDE_DIR="$(dirname "$NCCL_H")" -DNCCL_LIBRARY="$NCCL_SO" \
  -DAC_BUILD_TESTS=OFF >"$B/cmake.log" 2>&1 || { tail -40 "$B/cmake.log"; fail "cmake (log: $B/cmake.log)"; }
say "configured ($((SECONDS - START)) s)"
cmake --build "$B/build" -j "${JOBS:-$(nproc)}" --target autocompress ||
  fail "the build against the CUDA LibTorch failed"
say "built ($((SECONDS - START)) s)"

# What was built: a CUDA LibTorch with NCCL, the wheel's and not a system one.
INFO=$B/build/generated/autocompress/build_info.h
grep -q "AC_TORCH_HAS_CUDA 1" "$INFO" || fail "AC_TORCH_HAS_CUDA is not 1: CMake did not see the wheel's torch_cuda"
grep -q "AC_HAVE_NCCL 1" "$INFO" || { grep -iE "nccl|CUDAToolkit" "$B/cmake.log" || true
  fail "AC_HAVE_NCCL is not 1: the NCCL communicator was not compiled (CMake's lines above)"; }
grep -q "^TORCH_LIBRARY:FILEPATH=$T/" "$B/build/CMakeCache.txt" || fail "TORCH_LIBRARY is not the wheel's"
AC=$B/build/autocompress
NEEDED=$(readelf -d "$AC" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
for lib in libtorch_cuda.so libc10_cuda.so libnccl.so.2 libcudart.so.13; do
  case " $NEEDED" in *" $lib "*) ;; *) fail "autocompress does not link $lib (NEEDED: $NEEDED)" ;; esac
done
say "linked against the wheel's libtorch_cuda.so, libc10_cuda.so, libnccl.so.2 and libcudart.so.13"

# Load it with every symbol bound now (LD_BIND_NOW): a symbol that no library provides fails
# here, not on a cluster. Then the device resolver of a CUDA build: no GPU here, so `auto` is
# the CPU for "no GPU visible" (a CPU build would say "this build has no CUDA") and `cuda` is
# refused with exit 2. Where a GPU is visible, `auto` must pick cuda:0.
export LD_LIBRARY_PATH="$EXTRA_LIB:$TORCH_LIB:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_BIND_NOW=1 OMPI_MCA_ess_singleton_isolated=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
"$AC" --version || fail "autocompress --version did not run"
ENV_OUT=$("$AC" env --device auto 2>&1) || { echo "$ENV_OUT"; fail "autocompress env --device auto"; }
echo "$ENV_OUT" | grep -E "LibTorch|NCCL|CUDA|World"
echo "$ENV_OUT" | grep -q "LibTorch .*(CUDA)" || fail "env does not report a CUDA LibTorch"
echo "$ENV_OUT" | grep -q "NCCL .*built, version" || fail "env does not report the NCCL communicator"
if echo "$ENV_OUT" | grep -q "sees 0 CUDA device"; then
  echo "$ENV_OUT" | grep -q "device cpu (auto: no GPU visible" || fail "--device auto without a GPU: expected the CPU for 'no GPU visible'"
  set +e
  CUDA_OUT=$("$AC" env --device cuda 2>&1)
  rc=$?
  set -e
  echo "$CUDA_OUT" | tail -n 1
  [ "$rc" = 2 ] || fail "env --device cuda without a GPU: exit $rc, expected 2"
  echo "$CUDA_OUT" | grep -q "cuda: no GPU visible" || fail "env --device cuda: the reason is not 'no GPU visible'"
  say "no GPU visible: --device auto falls back to the CPU, --device cuda exits 2"
else
  echo "$ENV_OUT" | grep -q "device cuda:0 (auto:" || fail "a GPU is visible but --device auto did not pick cuda:0"
  say "a GPU is visible: --device auto picks cuda:0"
fi
say "OK in $((SECONDS - START)) s (nothing ran on a GPU)"
