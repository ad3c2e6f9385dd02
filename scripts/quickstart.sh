#!/usr/bin/env bash
# Install, then evaluate the embedded SmolLM2-135M-Instruct on a GSM8K slice.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${COLLABRL_VENV:-.venv}/bin/collab" eval gsm8k --model smollm2-135m \
  --limit 16 --n 4 --max-tokens 256 --temperature 0.6 "$@"
