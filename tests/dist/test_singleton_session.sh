#!/usr/bin/env bash
# Each MPI singleton keeps its Open MPI session files under a base of its own (dist/mpi_singleton.h):
# two singletons that start and finish together cannot remove each other's job-family directory.
set -u
fail() { echo "FAIL: $*"; exit 1; }
T="$AC_TEST_TMP/tmp"
rm -rf "$AC_TEST_TMP" && mkdir -p "$T"
unset OMPI_MCA_orte_tmpdir_base AC_SINGLETON_SESSION_BASE
# field N of line L of a probe's output ("rank R pid P base B exists E")
field() { sed -n "${2}p" <<<"$1" | awk -v n="$3" '{print $n}'; }

# A singleton, and a singleton started by it: each under $TMPDIR/ompi-singleton.<its pid>, made
# while it runs, removed when it ends.
out=$(TMPDIR="$T" "$AC_SINGLETON_PROBE" --child "$AC_SINGLETON_PROBE") || fail "probe failed: $out"
echo "$out"
[ "$(wc -l <<<"$out")" -eq 2 ] || fail "want two lines"
for l in 1 2; do
  pid=$(field "$out" $l 4)
  [ "$(field "$out" $l 6)" = "$T/ompi-singleton.$pid" ] || fail "line $l: base is not \$TMPDIR/ompi-singleton.$pid"
  [ "$(field "$out" $l 8)" = 1 ] || fail "line $l: the base does not exist while MPI is up"
done
[ "$(field "$out" 1 4)" != "$(field "$out" 2 4)" ] || fail "parent and child share a pid"
[ -z "$(ls -A "$T")" ] || fail "left behind in \$TMPDIR: $(ls -A "$T")"

# A base the user set is kept.
out=$(OMPI_MCA_orte_tmpdir_base="$T/user" TMPDIR="$T" "$AC_SINGLETON_PROBE") || fail "probe failed: $out"
echo "$out"
[ "$(field "$out" 1 6)" = "$T/user" ] || fail "the user's OMPI_MCA_orte_tmpdir_base was replaced"
[ -d "$T/user" ] || fail "the user's base was removed"

# Ranks started by mpirun are not singletons: they keep the base mpirun gives them (its TMPDIR).
out=$(TMPDIR="$T" $MPIEXEC -n 2 "$AC_SINGLETON_PROBE") || fail "mpirun probe failed: $out"
echo "$out"
[ "$(grep -c " base $T exists 1$" <<<"$out")" -eq 2 ] || fail "a rank under mpirun got a singleton base"

# Many singletons starting and ending together: every one initializes.
pids=()
for i in $(seq 8); do TMPDIR="$T" "$AC_SINGLETON_PROBE" >"$AC_TEST_TMP/many.$i" 2>&1 & pids+=($!); done
for i in "${!pids[@]}"; do wait "${pids[$i]}" || fail "concurrent singleton $((i + 1)) failed: $(cat "$AC_TEST_TMP/many.$((i + 1))")"; done
echo "PASS"
