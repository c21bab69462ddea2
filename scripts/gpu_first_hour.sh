#!/usr/bin/env bash
# The first hour on a GPU node: preflight, plan, calibration, smoke test, in order, stopping at the
# first failure (docs/gpu.md, "The first hour", lists each command, what it prints and how long it
# takes). Runs the project's environment, .venv/bin/python of the repository, with the `gpu` extra
# installed (.venv/bin/pip install -c requirements/gpu-lock.txt -e '.[gpu]').
#
#   scripts/gpu_first_hour.sh [--configfile my.yaml ...]   on a GPU node
#   scripts/gpu_first_hour.sh --cpu                        on any machine: the GPU-only steps are
#                                                          skipped, the smoke test is a dry run
#
# Before anything, and before pip would fail on it, it names the C library and the wheel tag the
# `gpu` extra needs (sglang 0.5.14 ships only manylinux_2_34 wheels: glibc 2.34 or newer).
set -euo pipefail

cd "$(dirname "$0")/.."
machine=$(uname -m)
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' || true)
if [[ " $* " != *" --cpu "* ]]; then
  major=${glibc%%.*} minor=${glibc#*.}
  minor=${minor%%.*}
  if [[ -z "$glibc" || "$major" -lt 2 || ("$major" -eq 2 && "$minor" -lt 34) ]]; then
    echo "FAIL  glibc: ${glibc:+glibc $glibc: pip accepts wheels up to manylinux_${major}_${minor}_$machine, and }sglang 0.5.14 ships only manylinux_2_34_$machine wheels (pip would say 'no matching distribution'); run on RHEL 9, Ubuntu 22.04 or later (docs/gpu.md)" >&2
    exit 1
  fi
  echo "ok    glibc: glibc $glibc: pip accepts manylinux_2_34_$machine (sglang 0.5.14's wheels)"
fi
python=.venv/bin/python
if [[ ! -x "$python" ]]; then
  echo "scripts/gpu_first_hour.sh: no $PWD/$python: create the project's environment first," \
    "python3.11 -m venv .venv && .venv/bin/pip install -c requirements/gpu-lock.txt -e '.[gpu]' (docs/gpu.md)" >&2
  exit 2
fi
exec "$python" -m spader.training.first_hour "$@"
