#!/usr/bin/env bash
# --help for the tool and every subcommand; exit codes 0 / 2.
source "$(dirname "$0")/lib.sh"

expect_rc 0 "$AC_BIN" --help
expect_out "Subcommands:"
expect_out "  env "
expect_out "  bench comm "
# Every listed subcommand has its own --help.
subs=$(sed -n '/^Subcommands:/,/^$/p' "$AC_TEST_TMP/out" | sed '1d;$d' | awk '{ if ($1 == "bench" || $1 == "data" || $1 == "model" || $1 == "cost" || $1 == "checkpoint") print $1" "$2; else print $1 }')
[ -n "$subs" ] || fail "no subcommands listed"
# Two calls at a time (each is mostly a process start, and this machine has 2 cores); each
# output is checked on its own afterwards.
n=0
while IFS= read -r s; do
  ( timeout 60 "$AC_BIN" $s --help >"$AC_TEST_TMP/help.$n" 2>&1; echo $? >"$AC_TEST_TMP/help.$n.rc" ) &
  n=$((n + 1))
  [ $((n % 2)) = 0 ] && wait
done <<<"$subs"
wait
n=0
while IFS= read -r s; do
  out=$AC_TEST_TMP/help.$n
  [ "$(cat "$out.rc")" = 0 ] || { cat "$out"; fail "exit code $(cat "$out.rc"), want 0: $AC_BIN $s --help"; }
  grep -q -- "Usage: autocompress $s" "$out" || { cat "$out"; fail "output lacks 'Usage: autocompress $s'"; }
  grep -q -- "--config" "$out" || { cat "$out"; fail "$s --help: output lacks '--config'"; }
  n=$((n + 1))
done <<<"$subs"
[ "$n" -ge 10 ] || fail "only $n subcommands listed"

expect_rc 0 "$AC_BIN" --version
expect_out "autocompress 0."
expect_rc 2 "$AC_BIN"
expect_rc 2 "$AC_BIN" no-such-command
expect_out "unknown subcommand 'no-such-command'"
expect_rc 2 "$AC_BIN" env --no-such-option
expect_out "unrecognised option '--no-such-option'"
expect_rc 2 "$AC_BIN" env --tp notanumber
expect_rc 0 "$AC_BIN" bench --help
expect_out "bench comm"
echo PASS
