"""The code's shape (issue 23, item 5): no module name repeats with another role, and no
function of the run layer (``fedpriv/run``) is longer than 60 code lines (docstrings, comments
and blank lines not counted). Checked on the source with ``ast``."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("fedpriv", "clients", "strategies")
MAX_RUN_FUNCTION_LINES = 60


def code_lines(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of ``node`` holding code: not blank, not only a comment, not its docstring."""
    lines = source.splitlines()[node.lineno - 1 : node.end_lineno]
    doc = ast.get_docstring(node, clean=False)
    skip: set[int] = set()
    if doc is not None:
        first = node.body[0]
        skip = set(range(first.lineno - node.lineno, first.end_lineno - node.lineno + 1))  # type: ignore[operator]
    return sum(
        1
        for i, line in enumerate(lines)
        if line.strip() and not line.strip().startswith("#") and i not in skip
    )


def test_the_counter_skips_docstrings_comments_and_blanks() -> None:
    src = 'def f():\n    """Doc.\n\n    more\n    """\n    # note\n\n    x = 1\n    return x\n'
    (fn,) = ast.parse(src).body
    assert isinstance(fn, ast.FunctionDef)
    assert code_lines(src, fn) == 3  # def, x = 1, return x


def test_no_run_layer_function_is_longer_than_60_code_lines() -> None:
    long = []
    for path in sorted((REPO / "fedpriv" / "run").rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = code_lines(source, node)
                if n > MAX_RUN_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n}")
    assert long == []


#: Names with one role in every accounting family subpackage (``fedpriv/accounting/<family>/``):
#: ``spec`` is the family's :class:`PrivacySpec`, ``lower`` its lower bound on ε.
FAMILY_ROLES = frozenset({"spec", "lower"})


def test_no_module_name_repeats() -> None:
    names = Counter(
        p.stem
        for pkg in PACKAGES
        for p in (REPO / pkg).rglob("*.py")
        if p.stem != "__init__" and p.stem not in FAMILY_ROLES
    )
    assert [name for name, n in names.items() if n > 1] == []


def test_family_role_modules_sit_only_in_family_subpackages() -> None:
    accounting = REPO / "fedpriv" / "accounting"
    concepts = {"core", "accountants", "loss_models", "samplers"}
    misplaced = [
        str(p.relative_to(REPO))
        for pkg in PACKAGES
        for p in (REPO / pkg).rglob("*.py")
        if p.stem in FAMILY_ROLES and (p.parent.parent != accounting or p.parent.name in concepts)
    ]
    assert misplaced == []
