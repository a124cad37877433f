#!/usr/bin/env bash
# Runs an MPI test command. When it exits 77 (every rank skipped: no GPU), prints only its
# standard output (the one "skipped" line) and exits 77, hiding mpirun's banner about a
# non-zero exit status; any other outcome passes everything through unchanged.
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
"$@" 2>"$errors"
rc=$?
if [ "$rc" -ne 77 ]; then cat "$errors" >&2; fi
exit "$rc"
