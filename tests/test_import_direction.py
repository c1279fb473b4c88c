"""The core is layered and imports go one way (issue 23).

Every import statement of every module counts, at module level or inside a function (a lazy
import is an edge like any other). Checked on the source with ``ast``:

- a module imports only from its own layer or the layers below it (:data:`LAYERS`);
- ``clients/`` and ``strategies/`` use the core, never each other, and the core imports neither;
- no two modules import each other, directly or through others (no cycle), anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Bottom to top. A module may import its own layer and the layers below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaf", ("fedpriv.common",)),
    ("data and models", ("fedpriv.data", "fedpriv.models")),
    ("mechanisms", ("fedpriv.mechanisms",)),
    ("accounting", ("fedpriv.accounting",)),
    ("reporting", ("fedpriv.report",)),
    ("run", ("fedpriv.run",)),
    ("command lines", ("fedpriv.cli",)),
    ("client algorithms", ("clients",)),
    ("strategies", ("strategies",)),
]
#: Layers of the same height that must not import each other.
SIBLINGS = {("command lines", "client algorithms"), ("command lines", "strategies")}
SIBLINGS |= {("client algorithms", "strategies")}
SIBLINGS |= {(b, a) for a, b in SIBLINGS}
HEIGHT = {"command lines": 6, "client algorithms": 6, "strategies": 6}
PACKAGES = ("fedpriv", "clients", "strategies")


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[tuple[str, int]]:
    """``(project module, line)`` of every import in ``path`` (any depth), resolved to the most
    specific known module (``from fedpriv.run import checkpoint`` -> ``fedpriv.run.checkpoint``).
    """
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            if name.split(".")[0] not in PACKAGES:
                continue
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add((name, node.lineno))
    return found


def layer_of(module: str) -> str:
    for name, prefixes in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    return "package root"


def height(layer: str) -> int:
    names = [n for n, _ in LAYERS]
    return HEIGHT.get(layer, names.index(layer) if layer in names else -1)


def graph() -> dict[str, set[tuple[str, int]]]:
    mods = modules()
    return {m: imports_of(p, set(mods)) for m, p in mods.items()}


def test_every_core_module_is_in_a_layer() -> None:
    assert [m for m in modules() if layer_of(m) == "package root"] == ["fedpriv"]


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    src = REPO / "fedpriv" / "common" / "errors.py"
    found = imports_of(src, set(modules()))
    assert all(layer_of(m) == "leaf" for m, _ in found)
    fake = tmp_path / "m.py"
    fake.write_text("import os\n\ndef f():\n    from strategies.fedavg import DPFedAvg\n")
    assert ("strategies.fedavg", 4) in imports_of_outside(fake)


def imports_of_outside(path: Path) -> set[tuple[str, int]]:
    """:func:`imports_of` for a file outside the repository (the checker's own test)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in PACKAGES:
                out.add((node.module, node.lineno))
    return out


@pytest.mark.parametrize("layer", [name for name, _ in LAYERS])
def test_no_import_runs_upward_or_sideways(layer: str) -> None:
    bad = []
    for mod, deps in sorted(graph().items()):
        if layer_of(mod) != layer:
            continue
        for dep, line in sorted(deps):
            other = layer_of(dep)
            if other == "package root":
                continue
            if height(other) > height(layer) or (layer, other) in SIBLINGS:
                bad.append(f"{mod}:{line} ({layer}) imports {dep} ({other})")
    assert bad == []


def test_no_import_cycle() -> None:
    g = {m: {d for d, _ in deps} for m, deps in graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert cycles == []
