"""The package's layering (pyproject.toml [tool.importlinter], ARCHITECTURE.md): the
engine never imports the app, each layer imports only those below it, and no
package has an import cycle among its modules, function-level imports included."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import rapidmoe

ROOT = Path(__file__).resolve().parents[1]
PKG = Path(list(rapidmoe.__path__)[0])  # installed, rapidmoe is a namespace package (no __init__.py)
LINT = [str(Path(sys.executable).with_name("lint-imports")), str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"]


def _lint(pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(LINT, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT / "tests")


def test_the_package_keeps_its_layers():
    r = _lint()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 kept, 0 broken" in r.stdout


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "rapidmoe"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("*.so", "cuda_src", "__pycache__", "assets"))
    (dst / "__init__.py").touch()  # a regular package: it hides the installed namespace package
    return dst


def test_a_cycle_or_an_upward_import_breaks_a_contract(tmp_path):
    pkg = _copy(tmp_path)
    with open(pkg / "app" / "tui" / "screens" / "chat.py", "a") as f:
        f.write("\n\ndef _probe():\n    from .. import app  # a cycle inside a function counts too\n")
    r = _lint(tmp_path)
    assert r.returncode == 1 and "No cycles are allowed in rapidmoe.app.tui" in r.stdout, r.stdout + r.stderr

    pkg = _copy(tmp_path / "b")
    with open(pkg / "engine" / "kernels.py", "a") as f:
        f.write("\nfrom .moe import router as _probe  # the kernels below the MoE layer\n")
    r = _lint(tmp_path / "b")
    assert r.returncode == 1 and "rapidmoe.engine.kernels is not allowed to import rapidmoe.engine.moe" in r.stdout, \
        r.stdout + r.stderr


def _over_the_size_rule(files, base: Path) -> list[str]:
    """Modules over 400 lines and functions over 80 among `files`, named relative to `base`."""
    import ast

    over = []
    for p in files:
        src = p.read_text(encoding="utf-8")
        if src.count("\n") > 400:
            over.append(f"{p.relative_to(base)}: {src.count(chr(10))} lines")
        for f in ast.walk(ast.parse(src)):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > 80:
                over.append(f"{p.relative_to(base)}:{f.lineno} {f.name}: {f.end_lineno - f.lineno + 1} lines")
    return over


def test_no_function_over_80_lines_and_no_module_over_400():
    """The package's own size rule (ARCHITECTURE.md): a function that outgrows a screen
    or a module that outgrows one responsibility is split, not let grow."""
    over = _over_the_size_rule(sorted(PKG.rglob("*.py")), PKG)
    assert not over, over


def test_the_tests_and_scripts_keep_the_size_rule_too():
    """The same rule for the Python under tests/ and scripts/. Nothing there is generated
    (the generated references, tests/refs/, are JSON), so nothing is left out."""
    files = sorted(p for d in ("tests", "scripts") for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 50  # the walk found them
    over = _over_the_size_rule(files, ROOT)
    assert not over, over
