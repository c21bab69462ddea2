#!/usr/bin/env bash
# GPU smoke test: validate a GPU install in minutes.
#
# Trains the demo's warm-started tiny Qwen3 (it searches and ends its turns on the closing tags) for
# 2 verl steps with the SPADER variant against the demo corpus, with sglang rollouts (whatever the
# demo config says: it trains on the CPU), on the packed actor path, then checks at every step:
# searches, turns that end at a closing tag and none sglang ran past, rewards that differ, non-zero
# advantages, the seeds sglang's replicas report; and that the weights changed. With 2 or more GPUs
# visible it trains on 2 (FSDP2's NCCL collectives, 2 sglang replicas). Exit 1 when a check fails.
# Needs the `gpu` extra (pip install -c requirements/gpu-lock.txt -e '.[gpu]') and a CUDA GPU. The
# scores are meaningless (tiny model).
#
#   scripts/gpu_smoke.sh [OUT_DIR] [--padded]   (default OUT_DIR: results/gpu_smoke)
#   scripts/gpu_smoke.sh --dry-run [OUT_DIR]    print the composed verl command, on any machine
#
# Steps (spader.training.smoke): build the inputs with the workflow's CPU rules (demo data in
# verl's parquet format, the demo corpus's BM25 index, the tiny reranker, the warm start), then run
# the training job composed exactly like rule train_policy plus the smoke overrides
# (SMOKE_TRAINING, SMOKE_OVERRIDES): cuda + sglang, 2 steps, a checkpoint after each; the smoke
# policy (the warm start with its head untied) is written to OUT_DIR/policy.
#
# Outputs: OUT_DIR/final.json (steps done, checkpoint, last metrics), per-step metrics in
# OUT_DIR/work/metrics/attempt_*.jsonl, verl's log on stderr, checkpoints in OUT_DIR/work/checkpoints/,
# the checks on stdout. A rerun after a failure resumes from the last checkpoint; delete OUT_DIR to
# start over.
# Environment: PYTHON (default: python), CORES for the CPU preparation (default: 4).
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--dry-run" ]]; then
  exec "${PYTHON:-python}" -m spader.training.smoke --dry-run --out "${2:-results/gpu_smoke}"
fi
out="results/gpu_smoke"
if [[ $# -gt 0 && "$1" != --* ]]; then
  out="$1"
  shift
fi
exec "${PYTHON:-python}" -m spader.training.smoke --prepare --cores "${CORES:-4}" --out "$out" "$@"
