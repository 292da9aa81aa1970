#!/usr/bin/env bash
# The Python packages the device check imports, as wheels in .device-wheels/
# (ignored by git), so a device machine without network installs them offline:
# run this here, then pass carry=[".device-wheels"] with the device command.
# Binary wheels for CPython 3.10-3.13 on x86-64 Linux (with CMake and the build
# backend for the CPU kernels); under 64 MB in all.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.device-wheels
mkdir -p "$out"
PKGS=(gguf pyyaml requests tqdm urllib3 idna charset-normalizer certifi jinja2 markupsafe regex psutil filelock
      platformdirs scikit-build-core pybind11 packaging pathspec cmake ninja)
for v in 3.10 3.11 3.12 3.13; do
  python3 -m pip download -q --only-binary=:all: --no-deps --python-version "$v" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$out" "${PKGS[@]}"
done
du -sh "$out"
