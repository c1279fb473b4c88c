"""Every script outside the packages (benchmarks, the peer benchmark's adapted copies,
examples, scripts) imports names that exist: a module moved by a refactor breaks this test,
not a benchmark run weeks later."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("fedpriv", "clients", "strategies", "examples")
SCRIPTS = sorted(
    p for folder in ("benchmarks", "examples", "scripts") for p in (REPO / folder).rglob("*.py")
)


def _project_imports(path: Path) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` of every ``from <project module> import name`` in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in PACKAGES:
                out += [(node.lineno, node.module, a.name) for a in node.names]
    return out


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_project_import_resolves(path: Path) -> None:
    missing = []
    for line, module, name in _project_imports(path):
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"line {line}: from {module} import {name}")
    assert not missing, f"{path.relative_to(REPO)}: " + "; ".join(missing)


def test_scripts_were_found() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"bench_clients.py", "run_fedpriv.py", "floor_fedpriv.py"} <= names
