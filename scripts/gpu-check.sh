#!/usr/bin/env bash
# The paper-scale path on one GPU, at small scale, with the embedded SmolLM2-135M
# (nothing is downloaded). What it checks, and why a CPU test cannot:
#   - grpo, relay, eapo and rsim train 4 optimizer steps in two generations (2 updates
#     each): the second generation samples from synced weights, so TRL's importance
#     ratio between the sampler and the trainer must stay ≈ 1 (a stale weight sync, or
#     a prompt rendered differently, pulls it away);
#   - relay's policy is warmed up first (build-warmup relay + SFT, docs/training.md's
#     recipe) so that it does call: the teacher round trip through the `collab serve
#     expert` server, the `</call>` stop and the teacher's masked tokens run on the GPU
#     path (rSIM's planner is asked at every step anyway);
#   - the policy's chat template reads `enable_thinking` (Qwen3's non-thinking mode
#     writes an empty think block; tests/engines/templates.py): every rollout prompt must
#     hold that block, so a path that drops chat_template_kwargs fails;
#   - `--eval-steps 2`: the held-out evaluation during training, on the rollout engine;
#   - memory: each run's peak on the GPU (nvidia-smi, per process) against its
#     `--dry-run` estimate, and a random-initialised model of a paper size (Qwen3-1.7B's
#     shape from collabrl/train/shapes, the real width and vocabulary) trained one step,
#     so the estimate is checked where it matters (a bound it must not fall below);
#   - then the slow vLLM tests (the samples of a group differ, the rollout's prompt ids
#     are the ones `collab eval` sends, a whole TRL step with the weight sync);
#   - DeepSpeed ZeRO-3 on two processes, a LoRA run to its end: the main process alone
#     merges the adapter, casts final/ to final_dtype and runs the end-of-run evaluation,
#     loads that must stay out of ZeRO-3's partitioning (its collectives would wait for
#     ever for the other process). On two GPUs configs/accelerate/zero3.yaml (DeepSpeed's
#     engine, vLLM colocated where installed); with one GPU, which cannot hold two NCCL
#     ranks, and in the smoke run, two CPU processes over gloo under the same DeepSpeed
#     registration (accelerate trains them with DDP). Skipped without `deepspeed`.
# Fails on the first broken check; writes $OUT/summary.json (peaks against estimates,
# seconds per step, importance ratios, calls) for docs/benchmarks.md.
#
#   bash scripts/gpu-check.sh               # after: pip install -e ".[vllm,dev]"
#   OUT=/tmp/gpu-check bash scripts/gpu-check.sh
#   bash scripts/gpu-check.sh --cpu-smoke   # every step here at a tiny scale, no GPU: the
#                                           # GPU-only asserts (memory, IS ratio, calls) skip
#
# A bare GPU machine (torch and transformers only, no vLLM, no internet) runs the same
# checks on the transformers engine (rollouts by the trained model, the teacher served
# by `collab serve --engine transformers`); the vLLM asserts and tests skip. Its wheels:
# `pip install --no-deps -e .` and the small pure-Python ones collabrl imports beside
# torch and transformers: trl accelerate datasets typer rich pyyaml fastapi uvicorn
# httpx gguf matplotlib (or `pip download` them on a machine with internet first:
# scripts/gpu-bundle.sh packs them, and the embedded model, for such a machine).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
out=${OUT:-gpu-check}
port=${PORT:-8011}
smoke=0
[[ "${1:-}" == "--cpu-smoke" ]] && smoke=1
rm -rf "$out" && mkdir -p "$out"

if ((smoke)); then
  export CUDA_VISIBLE_DEVICES="" COLLABRL_AUTO_ENGINE=transformers OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  echo "cpu smoke" > "$out/gpu.txt"
  scale=(--prompts-per-step 2 --num-generations 2 --max-tokens 16 --eval-limit 2)
  per_device=4 warmup_rows=8 warmup_epochs=1
  # EAPO's episode must hold one full turn: K = 3 answers, their calls and an answer.
  eapo_budget=(--max-tokens 256 --set protocol.consult.expert_max_tokens=16)
else
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
  scale=(--prompts-per-step 4 --num-generations 4 --max-tokens 128 --eval-limit 8)
  per_device=8 warmup_rows=192 warmup_epochs=3
  eapo_budget=(--max-tokens 512 --set protocol.consult.expert_max_tokens=64)
fi
vllm=false
if ((!smoke)) && "$py" -c "import vllm" 2> /dev/null; then vllm=true; fi
engine=$([[ $vllm == true ]] && echo vllm || echo transformers)
echo "rollouts and teacher on: $engine"

# The policy: the embedded model's converted copy, with a template that reads
# enable_thinking. The tokenizer decodes the rollouts' prompts below.
policy="$out/policy"
"$py" - "$policy" << 'EOF'
import sys
from pathlib import Path

from collabrl.models import resolve_model, weights_dir
from tests.engines.templates import thinking_model_dir

thinking_model_dir(weights_dir(resolve_model("smollm2-135m")), Path(sys.argv[1]))
EOF
nothink=(--set engine.chat_template_kwargs.enable_thinking=false)

echo "== warm-up: a relay policy that calls"
"$py" -m collabrl build-warmup relay --model "$policy" --data arith4_train --limit "$warmup_rows" \
  --set prompt=plain --set sampling.max_tokens=64 --set sampling.temperature=0.7 \
  --out "$out/warmup-rows" > "$out/warmup-rows.log" 2>&1
"$py" -m collabrl train sft --model "$policy" --data "$out/warmup-rows" --epochs "$warmup_epochs" \
  --lr 5e-5 --set batch_size=8 --set gradient_accumulation_steps=1 --set warmup_ratio=0 \
  --set activation_checkpointing=false --set chat_template_kwargs.enable_thinking=false \
  --out "$out/warmup" > "$out/warmup.log" 2>&1

# Peak GPU memory of every process, sampled every 200 ms while the runs go.
if ((!smoke)); then
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 200 \
    > "$out/memory.csv" &
  smi=$!
fi
server_args=(--engine "$engine" --port "$port")
[[ $engine == vllm ]] && server_args+=(--set engine.gpu_memory_utilization=0.15
  --set engine.max_model_len=4096)
"$py" -m collabrl serve expert --model "$policy" "${server_args[@]}" > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server ${smi:-} 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null; do
  kill -0 $server 2> /dev/null || { tail -20 "$out/server.log"; exit 1; }
  sleep 5
done

common=(--data arith_train --steps 4 "${scale[@]}" --lr 1e-5
  --set trl.use_vllm=$vllm --set trl.vllm_mode=colocate
  --set trl.vllm_gpu_memory_utilization=0.15 --set trl.vllm_max_model_length=2048
  --set trl.gradient_checkpointing=true --set trl.steps_per_generation=2
  --set trl.gradient_accumulation_steps=1 --set trl.per_device_train_batch_size=$per_device
  "${nothink[@]}")
held_out=(--eval-data arith --eval-steps 2)
url="http://127.0.0.1:$port/v1"
declare -A extra=(
  [grpo]="--model $policy ${held_out[*]}"
  [relay]="--model $out/warmup/final --teacher $url --data arith4_train --set prompt=plain
    --set protocol.chat_template_kwargs.enable_thinking=false ${held_out[*]}"
  [eapo]="--model $policy --expert $url ${eapo_budget[*]} ${held_out[*]}"
  [rsim]="--model $policy --planner $policy --eval-data arith"
)

# One run: its dry-run plan (the estimate) first, then the run, its pid kept so that
# its own GPU memory can be read off memory.csv.
train() {
  local name=$1 method=$2
  shift 2
  "$py" -m collabrl train "$method" "$@" --dry-run > "$out/$name-plan.txt"
  grep -q "gradient checkpointing *│ True" "$out/$name-plan.txt"
  "$py" -m collabrl train "$method" "$@" --out "$out/$name" > "$out/$name.log" 2>&1 &
  echo $! > "$out/$name.pid"
  wait $! || { tail -40 "$out/$name.log"; exit 1; }
}
for method in grpo relay eapo rsim; do
  echo "== $method"
  # shellcheck disable=SC2086  # extra[] holds several words
  train "$method" "$method" "${common[@]}" ${extra[$method]}
done
kill $server 2> /dev/null || true

# A random-initialised model of a paper size: the relay policy's shape (Qwen3-1.7B, its
# 151,936-token vocabulary) with the SmolLM2 tokenizer, one step at micro-batch 2 and
# 2,048 new tokens (a random model rarely stops early), on the transformers engine so
# that the process holds the trainer alone. Too large for a CPU's smoke run.
if ((!smoke)); then
  echo "== paper width (Qwen3-1.7B shape, random weights)"
  "$py" - "$out/paper-model" "$policy" << 'EOF'
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

target, tokenizer = sys.argv[1], AutoTokenizer.from_pretrained(sys.argv[2])
config = AutoConfig.from_pretrained("collabrl/train/shapes/Qwen3-1.7B")
config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
config.pad_token_id = tokenizer.pad_token_id
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(target)
tokenizer.save_pretrained(target)
EOF
  train paper grpo --model "$out/paper-model" --data arith_train --steps 1 --prompts-per-step 1 \
    --num-generations 2 --max-tokens 2048 --set trl.use_vllm=false \
    --set trl.gradient_checkpointing=true
fi
[[ -n ${smi:-} ]] && kill "$smi" 2> /dev/null || true

if [[ $vllm == true ]]; then
  "$py" -m pytest -q -m "slow or not slow" tests/train/test_vllm_rollout.py \
    tests/train/test_prompt_parity.py 2>&1 | tee "$out/pytest.log"
fi

if "$py" -c "import deepspeed" 2> /dev/null; then
  gpus=$( ((smoke)) && echo 0 || nvidia-smi -L | wc -l)
  if ((gpus >= 2)); then
    label="two GPUs" where=(env CUDA_VISIBLE_DEVICES=0,1)
    launch=(--config_file configs/accelerate/zero3.yaml --num_processes 2)
    rollouts=(--set trl.use_vllm=$vllm --set trl.vllm_mode=colocate
      --set trl.vllm_gpu_memory_utilization=0.15 --set trl.vllm_max_model_length=2048)
  else
    label="two CPU processes" where=(env CUDA_VISIBLE_DEVICES= COLLABRL_AUTO_ENGINE=transformers)
    launch=(--config_file configs/accelerate/cpu-2proc.yaml --use_deepspeed --zero_stage 3
      --zero3_init_flag true)
    rollouts=(--set trl.use_vllm=false)
  fi
  echo "== zero-3 on $label: LoRA merge, final_dtype, end-of-run evaluation"
  # A hang in a collective only one process entered is a failure, not a wait.
  "${where[@]}" OMP_NUM_THREADS=1 timeout 1800 "$py" -m accelerate.commands.launch "${launch[@]}" \
    -m collabrl train grpo --model "$policy" --data arith_train --steps 1 --prompts-per-step 2 \
    --num-generations 2 --max-tokens 16 --lora --set final_dtype=bfloat16 "${rollouts[@]}" \
    --eval-data arith --eval-limit 2 "${nothink[@]}" --out "$out/zero3" > "$out/zero3.log" 2>&1 ||
    { tail -40 "$out/zero3.log"; exit 1; }
  "$py" - "$out/zero3" << 'EOF'
import json
import sys
from pathlib import Path

from safetensors import safe_open

run = Path(sys.argv[1])
with safe_open(str(run / "final" / "model.safetensors"), framework="pt") as weights:
    names = list(weights.keys())
    dtypes = {str(weights.get_slice(name).get_dtype()) for name in names}
assert dtypes == {"BF16"}, f"zero3: final/ in {dtypes}, not bfloat16"
assert not any("lora" in name for name in names), "zero3: final/ holds the adapter unmerged"
evaluation = json.loads((run / "eval.json").read_text())
assert evaluation.keys() == {"start", "final", "paired"}, f"zero3: eval.json {list(evaluation)}"
EOF
else
  echo "== zero-3: skipped (DeepSpeed is not installed: pip install deepspeed)"
fi

"$py" - "$out" "$smoke" "$vllm" << 'EOF'
"""Assert what the runs logged and collect the figures into summary.json."""
import json
import re
import sys
from pathlib import Path

import yaml
from transformers import AutoTokenizer

from collabrl.episode import Author, Episode
from tests.engines.templates import EMPTY_THINK

out, smoke, vllm = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "true"
tokenizer = AutoTokenizer.from_pretrained(out / "policy")
summary = {"gpu": (out / "gpu.txt").read_text().strip(), "vllm": vllm}


def peak_mib(name: str) -> int:
    """The run's own peak on the GPU (its process, the colocated vLLM included)."""
    pid = (out / f"{name}.pid").read_text().strip()
    rows = (line.split(",") for line in (out / "memory.csv").read_text().splitlines())
    return max((int(used) for p, used in rows if p.strip() == pid), default=0)


def estimate_gib(name: str) -> float:
    """The dry run's training total (the rows the plan prints, on this machine)."""
    plan = (out / f"{name}-plan.txt").read_text()
    total = float(re.search(r"training total\s*│\s*([\d.]+) GiB", plan).group(1))
    vllm_share = re.search(r"colocated vLLM\s*│\s*\+ (\d+)% of the device", plan)
    if vllm_share:  # the colocated vLLM reserves its share of the whole device
        device = float(re.search(r"this GPU\s*│\s*(\d+) GiB", plan).group(1))
        total += device * int(vllm_share.group(1)) / 100
    return total


def check_memory(name: str, figures: dict) -> None:
    # The estimate is an upper bound (sequences at their cap, the prompt at its
    # assumed length): the measured peak, less ~1 GiB of CUDA context, must not pass it.
    peak, estimate = peak_mib(name), estimate_gib(name)
    figures.update(peak_memory_mib=peak, estimate_gib=estimate)
    assert peak > 0, f"{name}: no GPU memory sampled for its process"
    assert peak - 1024 <= estimate * 1024, f"{name}: peak {peak} MiB > estimate {estimate} GiB"


for method in ("grpo", "relay", "eapo", "rsim"):
    logs = [json.loads(line) for line in (out / method / "metrics.jsonl").read_text().splitlines()]
    assert [log["step"] for log in logs if "loss" in log] == [1, 2, 3, 4], method
    generations = [log for log in logs if "reward" in log]
    assert [log["step"] for log in generations] == [1, 3], f"{method}: two generations"
    identical = [log.get("episodes/identical_groups") for log in generations]
    assert all(share == 0 for share in identical), f"{method}: identical groups {identical}"
    config = yaml.safe_load((out / method / "config.yaml").read_text())
    kwargs = config["engine"]["chat_template_kwargs"]
    assert kwargs == {"enable_thinking": False}, f"{method}: chat template {kwargs}"
    records = [json.loads(line) for line in (out / method / "rollouts.jsonl").read_text().splitlines()]
    episodes = [Episode.from_dict(record["episode"]) for record in records]
    for episode in episodes:  # the option reached the rendered prompt
        assert EMPTY_THINK in tokenizer.decode(episode.prompt_ids), f"{method}: no empty think"
    helped = [e for e in episodes if any(s.author is Author.TEACHER for s in e.segments)]
    for episode in helped:
        # The policy stopped at its call's `</call>` (the stop string on this engine),
        # the teacher's tokens came back unsampled: no log-probs, masked from the loss.
        for before, segment in zip(episode.segments, episode.segments[1:]):
            if segment.author is Author.TEACHER:
                assert before.text.rstrip().endswith("</call>"), f"{method}: {before.text!r}"
                assert not segment.logprobs, f"{method}: a teacher segment with log-probs"
        assert sum(episode.loss_mask()) < len(episode.loss_mask()), method
    calls = [log.get("episodes/calls", 0.0) for log in generations]
    ratio = [log.get("sampling/importance_sampling_ratio/mean") for log in generations]
    figures = {
        "seconds_per_step": [log.get("step_time") for log in logs if "loss" in log],
        "rollout_seconds": [log.get("episodes/rollout_seconds") for log in generations],
        "reward": [log["reward"] for log in generations],
        "calls": calls,
        "importance_ratio": ratio,
        "identical_groups": identical,
        "eval_steps": [log["step"] for log in logs if "eval/pass@1" in log],
    }
    if method != "rsim":
        assert figures["eval_steps"] == [2, 4], f"{method}: eval at {figures['eval_steps']}"
    if vllm:  # sampler and trainer agree, after the first weight sync too
        assert all(r is not None and 0.9 <= r <= 1.1 for r in ratio), f"{method}: IS {ratio}"
    if method == "relay" and not smoke:
        assert max(calls) > 0, "relay: the warmed-up policy never called"
        assert helped, "relay: no teacher segment in the kept rollouts"
    if not smoke:
        check_memory(method, figures)
    summary[method] = figures
if not smoke:
    summary["paper"] = {}
    check_memory("paper", summary["paper"])
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
EOF
