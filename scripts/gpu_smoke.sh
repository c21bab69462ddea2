#!/usr/bin/env bash
# GPU smoke test: validate a GPU install in minutes.
#
# Trains a tiny Qwen3 for 2 verl steps with the SPADER variant against the demo corpus, on one GPU
# with sglang rollouts (whatever the demo config says: it trains on the CPU), at the paper config's
# response length (8,192 tokens): the smoke policy never ends a turn, so every response and every
# micro-batch is full length. Needs the `gpu` extra (pip install -c requirements/gpu-lock.txt -e '.[gpu]') and one CUDA GPU. The
# scores are meaningless (tiny model); what it checks is that verl on the GPU, sglang, the SPADER
# plug-in (fused log-probs included), the retrieval service and checkpointing work together at the
# paper's length. The dry run prints the device, rollout backend, lengths and the memory plan.
#
#   scripts/gpu_smoke.sh [OUT_DIR]        (default OUT_DIR: results/gpu_smoke)
#   scripts/gpu_smoke.sh --dry-run [OUT_DIR]   print the composed verl command, on any machine
#
# Steps (spader.training.smoke): build the inputs with the workflow's CPU rules (demo data in
# verl's parquet format, the demo corpus's BM25 index, the tiny policy and reranker), then run the
# training job composed exactly like rule train_policy plus the smoke overrides (SMOKE_TRAINING,
# SMOKE_AGENT, SMOKE_OVERRIDES): cuda + sglang, 1 GPU, 2 steps, a checkpoint after each; the smoke
# policy is written to OUT_DIR/policy.
#
# Outputs: OUT_DIR/final.json (steps done, checkpoint, last metrics), per-step metrics in
# OUT_DIR/work/metrics/attempt_*.jsonl, verl's log on stderr, checkpoints in OUT_DIR/work/checkpoints/.
# A rerun after a failure resumes from the last checkpoint; delete OUT_DIR to start over.
# `python -m spader.training.smoke --dry-run` prints the composed verl command without a GPU.
# Environment: PYTHON (default: python), CORES for the CPU preparation (default: 4).
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--dry-run" ]]; then
  exec "${PYTHON:-python}" -m spader.training.smoke --dry-run --out "${2:-results/gpu_smoke}"
fi
"${PYTHON:-python}" -m spader.training.smoke --prepare --cores "${CORES:-4}" --out "${1:-results/gpu_smoke}"
