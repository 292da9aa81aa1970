#!/usr/bin/env bash
# Device check of the GPU path, self-contained (no network, no llama.cpp): builds
# the CPU kernels from this checkout and the CUDA kernels (nvcc, then NVRTC),
# checks every kernel against its reference and the GPU split against the CPU
# split with forced routing (check.py: bounded by size), prints the kernels' GB/s
# against copy bandwidth, then runs the product end to end on a DeepSeek-V3-shaped
# file and prints the side-by-side table (product.py). Sized for at most 8 minutes
# on one H200. From the repo root:
#
#   bash tests/gpu/check.sh            (extra arguments go to check.py)
#
# The log is also written to $OUT/check.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOG_DIR=${OUT:-/tmp/rapidmoe-check}
mkdir -p "$LOG_DIR"
export PYTHONUNBUFFERED=1
export RAPIDMOE_CACHE_DIR=${RAPIDMOE_CACHE_DIR:-/tmp/rapidmoe-check/cache}
export RAPIDMOE_CONFIG_DIR=/tmp/rapidmoe-check/config RAPIDMOE_DATA_DIR=/tmp/rapidmoe-check/data
export RAPIDMOE_CUDA_SRC="$PWD/csrc/cuda"
SITE=/tmp/rapidmoe-check/site
t0=$(date +%s)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
(nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | tail -1

# CPU kernels (pybind11 module) from this checkout; the build backend comes from the
# image, else from the carried wheels (tests/gpu/wheels.sh)
if [ -d .device-wheels ] && ! python3 -c "import scikit_build_core, pybind11" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --find-links .device-wheels --target /tmp/rapidmoe-check/build-deps \
    scikit-build-core pybind11 packaging pathspec cmake ninja >"$LOG_DIR/pip-build.log" 2>&1 || tail -5 "$LOG_DIR/pip-build.log"
  export PYTHONPATH="/tmp/rapidmoe-check/build-deps${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/rapidmoe-check/build-deps/bin:$PATH"
fi
if ! ls "$SITE"/rapidmoe/engine/_cpu*.so >/dev/null 2>&1; then
  echo "building the CPU kernels ..."
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation --no-deps --no-index \
    --target "$SITE" . >"$LOG_DIR/pip.log" 2>&1 || { tail -30 "$LOG_DIR/pip.log"; echo "CPU build failed"; exit 2; }
  echo "CPU kernels built in $(( $(date +%s) - t0 )) s"
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
# the engine's pure-Python dependencies, from wheels carried along (tests/gpu/wheels.sh)
if [ -d .device-wheels ] && ! ls "$SITE"/gguf >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --find-links .device-wheels --target "$SITE" gguf pyyaml requests \
    tqdm urllib3 idna charset-normalizer certifi jinja2 markupsafe regex psutil filelock platformdirs \
    >>"$LOG_DIR/pip.log" 2>&1 || { tail -20 "$LOG_DIR/pip.log"; echo "installing the carried wheels failed"; }
fi
python3 -c "import gguf, jinja2, regex, psutil, filelock" 2>/dev/null \
  || echo "note: the engine's dependencies are missing here (run tests/gpu/wheels.sh and carry .device-wheels)"
# engine.paths needs platformdirs; where the image lacks it, pip's vendored copy serves
if ! python3 -c "import platformdirs" 2>/dev/null; then
  mkdir -p /tmp/rapidmoe-check/shim
  echo "from pip._vendor.platformdirs import *  # noqa" >/tmp/rapidmoe-check/shim/platformdirs.py
  export PYTHONPATH="/tmp/rapidmoe-check/shim:$PYTHONPATH"
fi

# stay inside a 10-minute device call whatever the build took; the product part
# gets what the kernel part leaves
left=$(( 585 - ($(date +%s) - t0) ))
timeout "$(( left / 2 ))" python3 tests/gpu/check.py --no-table "$@" 2>&1 | tee "$LOG_DIR/check.log"
rc=${PIPESTATUS[0]}
left=$(( 585 - ($(date +%s) - t0) ))
timeout "$left" python3 tests/gpu/product.py --dir "$LOG_DIR" 2>&1 | tee "$LOG_DIR/product.log"
rc2=${PIPESTATUS[0]}
echo "check.sh: exit $rc (kernels), $rc2 (product) after $(( $(date +%s) - t0 )) s"
[ "$rc" -eq 0 ] && [ "$rc2" -eq 0 ]
