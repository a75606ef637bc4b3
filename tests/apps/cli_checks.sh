#!/usr/bin/env bash
# The checks the CLI's end-to-end tests share (sourced by cli_*_test.sh after they set $dir, the
# work folder): each check prints "ok NAME" or "FAIL NAME …" and counts failures; `finish`
# reports them and sets the script's exit status.

failures=0

pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
# check NAME CMD...: CMD succeeds (its output is not captured).
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name"; fi; }
# expect_ok NAME CMD...: exit 0; the output is kept in $dir/out.txt and shown on failure.
expect_ok() {
  local name=$1; shift
  if "$@" >"$dir/out.txt" 2>&1; then pass "$name"; else fail "$name"; cat "$dir/out.txt"; fi
}
# expect_error NAME PATTERN CMD...: exit status 1 (an error, not a crash or a signal), and stderr
# matches PATTERN.
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$@" >"$dir/out.txt" 2>"$dir/err.txt"
  local rc=$?
  if [ "$rc" -ne 1 ]; then
    fail "$name (exit $rc: $(tail -c 300 "$dir/err.txt"))"
  elif ! grep -q -- "$pattern" "$dir/err.txt"; then
    fail "$name (message: $(cat "$dir/err.txt"))"
  else
    pass "$name"
  fi
}
# finish WHAT: the count of failed WHAT checks, and the exit status (0 when none failed).
finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures $1 check(s) failed"
    exit 1
  fi
  echo "all $1 checks passed"
}
