#!/usr/bin/env bash
# Install, then the shortest honest training run: 10 GRPO steps of the embedded
# SmolLM2-135M on arith4 (the four arith families it solves sometimes; 4 problems × 8
# samples a step, 32 tokens each), then all 170 held-out arith4 problems scored greedily
# with the starting and the trained policy, side by side, with a sign test of the change.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
exec "${COLLABRL_VENV:-.venv}/bin/collab" train grpo -c configs/train/grpo-cpu-arith.yaml \
  --data arith4_train --steps 10 --prompts-per-step 4 --num-generations 8 --max-tokens 32 \
  --eval-data arith4 "$@"
