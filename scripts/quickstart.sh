#!/usr/bin/env bash
# Install, then evaluate the embedded SmolLM2-135M-Instruct on an arith slice: the first 18
# problems are 2 of each of its 9 families, from 1-digit addition to 2-digit products.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${COLLABRL_VENV:-.venv}/bin/collab" eval arith --model smollm2-135m \
  --limit 18 --n 4 --max-tokens 64 --temperature 0.6 "$@"
