#!/usr/bin/env bash
# Install, then run the test suite (tests marked slow are skipped; pass -m slow for them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${COLLABRL_VENV:-.venv}/bin/python" -m pytest -m "not slow" -q --durations=25 "$@"
