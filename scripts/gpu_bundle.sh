#!/usr/bin/env bash
# The build dependencies that travel to a GPU machine without network (docs/gpu.md): Debian
# bookworm's Open MPI, parallel HDF5, Boost.Program_options, GoogleTest, nlohmann-json, PCRE2,
# zlib headers and pkgconf, as .debs (~26 MB, under the 64 MiB a device call carries), unpacked
# there with `dpkg -x` into a folder of their own; nothing is installed into /.
#
#   scripts/gpu_bundle.sh [DIR]            download the .debs into DIR/debs (default gpu-bundle,
#                                          git-ignored; the folder to `carry` is DIR/debs)
#   scripts/gpu_bundle.sh --unpack [DIR]   unpack DIR/debs into DIR/root (gpu_check.sh does it)
#   scripts/gpu_bundle.sh --check [DIR]    here, on a CPU machine: unpack, then configure and
#                                          build autocompress + test_dist_layout with CMake
#                                          pointed at DIR/root only, in a mount namespace where
#                                          this machine's own copies are hidden; then check
#                                          that nothing was taken from the system and run the
#                                          binary and an MPI job through the bundle's mpiexec
#
# Sourced (`source scripts/gpu_bundle.sh; bundle_env DIR/root`): exports PATH, LD_LIBRARY_PATH,
# OPAL_PREFIX (Open MPI relocated), the PKG_CONFIG_* variables and the MCA settings of a
# one-node job, and sets the array BUNDLE_CMAKE_ARGS for CMake.
#
# The runtime libraries of MPI's network transports (UCX, libfabric, PSM, verbs) are left out:
# one node needs only shared memory (btl self,vader), and Open MPI skips components whose
# libraries are missing. glibc, libstdc++ and zlib are the machine's own.

BUNDLE_PACKAGES=(
  # Open MPI 4.1 (headers, libraries, mpiexec/orted) and what its core libraries load
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libhwloc15 libudev1 libevent-2.1-7
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libmunge2 libltdl7
  # parallel HDF5 1.10 and what libhdf5_openmpi links (libcurl for its ROS3 driver, with curl's own)
  libhdf5-openmpi-dev libhdf5-openmpi-103-1 libaec0 libsz2 libcurl4 libnghttp2-14 libidn2-0
  libunistring2 librtmp1 libgnutls30 libhogweed6 libnettle8 libgmp10 libtasn1-6 libp11-kit0 libffi8
  libssh2-1 libpsl5 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
  libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3 libzstd1 libbrotli1 libssl3
  # the launcher, the tests, the JSON, the tokenizer, checksums, pkg-config for PCRE2
  libboost-program-options-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  libboost1.74-dev libgtest-dev libgmock-dev nlohmann-json3-dev libpcre2-dev libpcre2-8-0 zlib1g-dev
  zlib1g pkgconf pkgconf-bin libpkgconf3
)

# bundle_env ROOT: the environment and CMake arguments of a build against the unpacked bundle.
bundle_env() {
  local R
  R=$(cd "$1" && pwd)
  local L=$R/usr/lib/x86_64-linux-gnu
  export PATH="$R/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$L:$L/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX=$R/usr
  export PKG_CONFIG_LIBDIR=$L/pkgconfig:$R/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$R
  # One node: shared memory only; the network components (their libraries are not bundled)
  # are neither loaded nor complained about.
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx
  export OMPI_MCA_mca_base_component_show_load_errors=0
  BUNDLE_CMAKE_ARGS=(
    -DCMAKE_PREFIX_PATH="$R/usr;$L/cmake"
    -DMPI_C_HEADER_DIR="$L/openmpi/include" -DMPI_C_LIB_NAMES=mpi -DMPI_mpi_LIBRARY="$L/openmpi/lib/libmpi.so"
    -DMPIEXEC_EXECUTABLE="$R/usr/bin/orterun"
    -DHDF5_C_COMPILER_EXECUTABLE=NOTFOUND -DHDF5_ROOT="$L/hdf5/openmpi"
    -DHDF5_C_INCLUDE_DIR="$R/usr/include/hdf5/openmpi" -DHDF5_hdf5_LIBRARY_RELEASE="$L/hdf5/openmpi/libhdf5.so"
    -DBoost_ROOT="$R/usr" -DBoost_NO_SYSTEM_PATHS=ON -DBoost_INCLUDE_DIR="$R/usr/include"
    -DGTest_DIR="$L/cmake/GTest" -Dnlohmann_json_DIR="$R/usr/share/cmake/nlohmann_json"
    -DPKG_CONFIG_EXECUTABLE="$R/usr/bin/pkgconf"
    -DZLIB_INCLUDE_DIR="$R/usr/include" -DZLIB_LIBRARY="$L/libz.so"
  )
}

bundle_unpack() {
  local dir=$1
  ls "$dir"/debs/*.deb >/dev/null 2>&1 || { echo "gpu_bundle: no .debs in $dir/debs (run scripts/gpu_bundle.sh first)" >&2; return 1; }
  local stamp
  stamp=$(ls "$dir"/debs/*.deb | sort | sha256sum | cut -c1-16)
  if [ ! -f "$dir/root/.unpacked-$stamp" ]; then
    rm -rf "$dir/root" && mkdir -p "$dir/root"
    local f
    for f in "$dir"/debs/*.deb; do dpkg -x "$f" "$dir/root" || return 1; done
    # The system's zlib runtime stays the one every library of the machine was built against:
    # the bundle keeps libz.so (for linking) and drops its libz.so.1 name.
    rm -f "$dir/root/usr/lib/x86_64-linux-gnu/libz.so.1"
    # Open MPI's wrappers and pkgconf: the Debian alternatives are not set up by dpkg -x.
    ln -sf orterun "$dir/root/usr/bin/mpiexec"
    ln -sf pkgconf "$dir/root/usr/bin/pkg-config"
    touch "$dir/root/.unpacked-$stamp"
  fi
}

bundle_download() {
  local dir=$1
  mkdir -p "$dir/debs"
  command -v apt-get >/dev/null || { echo "gpu_bundle: needs apt-get (Debian bookworm)" >&2; return 1; }
  . /etc/os-release
  [ "${VERSION_CODENAME:-}" = bookworm ] || echo "gpu_bundle: warning: this is $PRETTY_NAME, the list is for Debian bookworm" >&2
  rm -f "$dir"/debs/*.deb
  # apt-get download writes into the current folder; _apt cannot write here as root's files.
  (cd "$dir/debs" && apt-get download -q "${BUNDLE_PACKAGES[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed") || return 1
  echo "gpu_bundle: $(ls "$dir"/debs/*.deb | wc -l) packages, $(du -sh "$dir/debs" | cut -f1) in $dir/debs"
}

# The check on a CPU machine: a build that can see only the bundle. Runs inside `unshare -m`
# (private mounts) with this machine's copies of the same headers, CMake packages and MPI/HDF5
# plugin folders hidden under empty tmpfs mounts; whatever still resolves to the system is
# caught by the checks after the build (compiler dependency files, CMake cache, ldd).
bundle_check_inside() {
  set -euo pipefail
  local dir=$1 src=$2
  local hide
  for hide in /usr/include/boost /usr/include/nlohmann /usr/include/gtest /usr/include/gmock /usr/include/hdf5 \
      /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/hdf5 /usr/share/openmpi /etc/openmpi \
      /usr/lib/x86_64-linux-gnu/cmake/GTest /usr/share/cmake/nlohmann_json /usr/lib/x86_64-linux-gnu/pkgconfig \
      /usr/share/pkgconfig; do
    if [ -d "$hide" ]; then mount -t tmpfs none "$hide"; fi
  done
  for hide in /usr/lib/x86_64-linux-gnu/cmake/boost_*; do [ -d "$hide" ] && mount -t tmpfs none "$hide"; done
  for hide in /usr/bin/mpicc /usr/bin/mpiexec /usr/bin/mpirun /usr/bin/orterun /usr/bin/orted /usr/bin/h5pcc \
      /usr/bin/pkg-config /usr/bin/pkgconf /usr/include/pcre2.h /usr/include/zlib.h; do
    if [ -e "$hide" ]; then mount --bind /dev/null "$hide"; fi
  done
  bundle_env "$dir/root"
  local B=$dir/check-build
  rm -rf "$B"
  cmake -S "$src" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g0" \
    -DAC_WITH_NCCL=OFF -DAC_USE_CCACHE=OFF -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
    "${BUNDLE_CMAKE_ARGS[@]}" >"$dir/check-cmake.log" 2>&1 || { tail -40 "$dir/check-cmake.log"; echo "gpu_bundle: FAIL: cmake"; return 1; }
  echo "gpu_bundle: configured against the bundle"
  cmake --build "$B" -j "${JOBS:-$(nproc)}" --target autocompress test_dist_layout >"$dir/check-build.log" 2>&1 ||
    { grep -m20 -B2 -A6 "error" "$dir/check-build.log"; echo "gpu_bundle: FAIL: build"; return 1; }
  echo "gpu_bundle: built autocompress and test_dist_layout"
  local R
  R=$(cd "$dir/root" && pwd)
  # Every header of these packages came from the bundle, none from /usr/include or /usr/lib.
  local leaked
  leaked=$(ninja -C "$B" -t deps 2>/dev/null | grep -E "^ +/usr/(include/(boost|nlohmann|gtest|gmock|hdf5|pcre2|zlib|zconf)|lib/x86_64-linux-gnu/openmpi)" | sort -u | head -5 || true)
  [ -z "$leaked" ] || { echo "$leaked"; echo "gpu_bundle: FAIL: headers from the system"; return 1; }
  grep -E "^(MPI_C_HEADER_DIR|MPI_mpi_LIBRARY|HDF5_C_INCLUDE_DIR|HDF5_hdf5_LIBRARY_RELEASE|Boost_INCLUDE_DIR|GTest_DIR|PCRE2_LINK_LIBRARIES|ZLIB_LIBRARY_RELEASE|nlohmann_json_DIR|MPIEXEC_EXECUTABLE)[:=]" "$B/CMakeCache.txt" |
    grep -v "$R" && { echo "gpu_bundle: FAIL: CMake found the entries above outside the bundle"; return 1; }
  # The bundle's libraries are the ones loaded.
  local lib
  for lib in libmpi.so.40 libhdf5_openmpi.so.103 libboost_program_options.so.1.74.0 libpcre2-8.so.0; do
    ldd "$B/autocompress" | grep -q "$lib => $R/" || { ldd "$B/autocompress" | grep "$lib"; echo "gpu_bundle: FAIL: $lib not from the bundle"; return 1; }
  done
  echo "gpu_bundle: headers, CMake packages and libraries all from $R"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  "$B/autocompress" --version
  "$R/usr/bin/mpiexec" --oversubscribe -n 2 "$B/autocompress" env --tp 2 | grep -E "MPI|HDF5|World|TP groups"
  "$B/tests/dist/test_dist_layout" --gtest_filter='Watchdog.*:DeviceCuda.*' | tail -n 1
  echo "gpu_bundle: OK: the project builds and runs against the bundle alone"
}

bundle_main() {
  set -euo pipefail
  local mode=download
  case "${1:-}" in --unpack | --check) mode=${1#--}; shift ;; esac
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local dir=${1:-$root/gpu-bundle}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  case $mode in
    download) bundle_download "$dir" ;;
    unpack) bundle_unpack "$dir" && echo "gpu_bundle: unpacked into $dir/root" ;;
    check)
      ls "$dir"/debs/*.deb >/dev/null 2>&1 || bundle_download "$dir"
      bundle_unpack "$dir"
      unshare -m bash -c "source '${BASH_SOURCE[0]}'; bundle_check_inside '$dir' '$root'"
      ;;
  esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then bundle_main "$@"; fi
