#!/usr/bin/env bash
# Install, then the shortest honest training run: 6 GRPO steps of the embedded SmolLM2-135M
# on arith (4 problems × 4 samples a step), scored greedily on 18 held-out arith problems
# (2 of each of its 9 families) before and after, side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
exec "${COLLABRL_VENV:-.venv}/bin/collab" train grpo -c configs/train/grpo-cpu-arith.yaml \
  --data arith_train --steps 6 --prompts-per-step 4 --num-generations 4 \
  --eval-data arith --eval-limit 18 "$@"
