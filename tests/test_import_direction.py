"""Packages import one way (issue 11): ``clients/`` and ``strategies/`` use the core
(``fedpriv/``), never each other; the core imports neither. Checked on every import statement
(module level or inside functions) of every module, parsed with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "fedpriv": {"clients", "strategies"},
    "clients": {"strategies"},
    "strategies": {"clients"},
}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """``(top-level package, line)`` of every absolute import in the file at ``path``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def test_the_checker_sees_function_level_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\n\ndef f():\n    from strategies.fedavg import DPFedAvg\n")
    assert imported_packages(src) == {("os", 1), ("strategies", 4)}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_go_one_way(package: str) -> None:
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {top}"
        for path in sorted((REPO / package).rglob("*.py"))
        for top, line in sorted(imported_packages(path))
        if top in FORBIDDEN[package]
    ]
    assert bad == []
