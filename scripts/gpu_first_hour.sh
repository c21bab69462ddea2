#!/usr/bin/env bash
# The first hour on a GPU node: preflight, plan, calibration, smoke test, in order, stopping at the
# first failure (docs/gpu.md, "The first hour", lists each command, what it prints and how long it
# takes). Needs the `gpu` extra (pip install -c requirements/gpu-lock.txt -e '.[gpu]').
#
#   scripts/gpu_first_hour.sh [--configfile my.yaml ...]   on a GPU node
#   scripts/gpu_first_hour.sh --cpu                        on any machine: the GPU-only steps are
#                                                          skipped, the smoke test is a dry run
# Environment: PYTHON (default: python).
set -euo pipefail

cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m spader.training.first_hour "$@"
