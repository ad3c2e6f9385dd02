#!/usr/bin/env bash
# The paper-scale path on one GPU, at small scale: two optimizer steps of grpo, relay,
# eapo and rsim with TRL's colocated vLLM rollouts, activation checkpointing on and,
# for relay and eapo, a `collab serve expert` vLLM server on the same GPU as teacher
# and experts (the embedded SmolLM2-135M everywhere: nothing is downloaded). Then the
# slow vLLM tests (the samples of a group differ, the rollout's prompt ids are the ones
# `collab eval` sends, a whole TRL step with the weight sync). Fails on the first broken
# check; writes gpu-check/summary.json (peak GPU memory, seconds per step, the checks)
# for docs/benchmarks.md.
#   bash scripts/gpu-check.sh            # after: pip install -e ".[vllm,dev]"
#   OUT=/tmp/gpu-check bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
out=${OUT:-gpu-check}
port=${PORT:-8011}
rm -rf "$out" && mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"

# vLLM loads a Hugging Face folder: the embedded model's converted copy.
model=$("$py" -c "from collabrl.models import resolve_model, weights_dir
print(weights_dir(resolve_model('smollm2-135m')))")

# Peak memory of the whole GPU, sampled every 200 ms while the runs go.
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/memory.csv" &
smi=$!
"$py" -m collabrl serve expert --model "$model" --engine vllm --port "$port" \
  --set engine.gpu_memory_utilization=0.15 --set engine.max_model_len=4096 > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server $smi 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null; do
  kill -0 $server 2>/dev/null || { tail -20 "$out/server.log"; exit 1; }
  sleep 5
done

common=(--model "$model" --data arith_train --steps 2 --prompts-per-step 4 --num-generations 4
  --max-tokens 128 --set trl.use_vllm=true --set trl.vllm_mode=colocate
  --set trl.vllm_gpu_memory_utilization=0.15 --set trl.vllm_max_model_length=2048
  --set trl.gradient_checkpointing=true --set trl.steps_per_generation=2
  --set trl.gradient_accumulation_steps=1 --set trl.per_device_train_batch_size=8
  --set engine.chat_template_kwargs.enable_thinking=false)
url="http://127.0.0.1:$port/v1"
declare -A extra=(
  [grpo]=""
  [relay]="--teacher $url --set protocol.chat_template_kwargs.enable_thinking=false"
  [eapo]="--expert $url"
  [rsim]="--planner $model"
)
for method in grpo relay eapo rsim; do
  echo "== $method"
  # shellcheck disable=SC2086  # extra[] holds several words
  "$py" -m collabrl train "$method" "${common[@]}" ${extra[$method]} --dry-run \
    > "$out/$method-plan.txt"
  grep -q "gradient checkpointing *│ True" "$out/$method-plan.txt"
  # shellcheck disable=SC2086
  "$py" -m collabrl train "$method" "${common[@]}" ${extra[$method]} --out "$out/$method" \
    2>&1 | tee "$out/$method.log"
done
kill $server $smi 2>/dev/null || true

"$py" -m pytest -q -m "slow or not slow" tests/train/test_vllm_rollout.py tests/train/test_prompt_parity.py \
  2>&1 | tee "$out/pytest.log"

"$py" - "$out" <<'EOF'
"""Assert what the runs logged and collect the figures into summary.json."""
import json
import sys
from pathlib import Path

import yaml

out = Path(sys.argv[1])
summary = {"gpu": (out / "gpu.txt").read_text().strip()}
memory = [int(line) for line in (out / "memory.csv").read_text().split() if line.isdigit()]
summary["peak_memory_mib"] = max(memory)
for method in ("grpo", "relay", "eapo", "rsim"):
    logs = [json.loads(line) for line in (out / method / "metrics.jsonl").read_text().splitlines()]
    steps = [log for log in logs if "reward" in log]
    assert len(steps) == 2, f"{method}: {len(steps)} steps logged"
    identical = [log.get("episodes/identical_groups") for log in steps]
    assert all(share == 0 for share in identical), f"{method}: identical groups {identical}"
    config = yaml.safe_load((out / method / "config.yaml").read_text())
    kwargs = config["engine"]["chat_template_kwargs"]
    assert kwargs == {"enable_thinking": False}, f"{method}: chat template {kwargs}"
    summary[method] = {
        "seconds_per_step": [log.get("step_time") for log in steps],
        "rollout_seconds": [log.get("episodes/rollout_seconds") for log in steps],
        "reward": [log["reward"] for log in steps],
        "identical_groups": identical,
        "frac_reward_zero_std": [log.get("frac_reward_zero_std") for log in steps],
    }
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
EOF
