"""The README stays what a newcomer can read, and the documentation's pointers hold (issue 23,
item 8).

- README.md has at most :data:`MAX_README_LINES` lines.
- Its Layout section (a ```text block after ``## Layout``; each line a path, then what it
  holds; an indented line continues the one above) names only paths that exist, every
  top-level package of ``fedpriv/`` and every top-level folder of the repository; a "layer N"
  it states is the layer ``tests/test_import_direction.py`` enforces, and so are the layer
  numbers of the diagram in ``docs/architecture.md``.
- Every relative link of README.md and ``docs/*.md`` points to an existing file, and its
  ``#anchor`` (if any) to a heading of the page it names.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

from tests.test_import_direction import height, layer_of

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
MAX_README_LINES = 300
#: Top-level folders that are outputs or local data, never part of the tree (see .gitignore).
NOT_TREE = {"outputs", "multirun", "runs", "data", "build", "__pycache__"}


def layout_entries(text: str) -> dict[str, str]:
    """``{path: what it holds}`` of the Layout block of ``text``."""
    found = re.search(r"^## Layout\n.*?^```text\n(.*?)^```", text, flags=re.M | re.S)
    assert found, "README.md has no ```text block under '## Layout'"
    entries: dict[str, str] = {}
    last = ""
    for line in found.group(1).splitlines():
        if not line.strip():
            continue
        if line[0].isspace():  # continues the entry above
            assert last, f"Layout: a continuation line before any entry: {line!r}"
            entries[last] += " " + line.strip()
            continue
        path, _, what = line.partition(" ")
        assert path not in entries, f"Layout names {path} twice"
        entries[path] = what.strip()
        last = path
    return entries


def top_level_folders() -> set[str]:
    """The repository's top-level folders holding tracked files (git), else every folder that
    is not an output, a cache or a virtual environment."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True
        ).stdout
        folders = {line.split("/", 1)[0] for line in out.splitlines() if "/" in line}
        if folders:
            return folders
    except (OSError, subprocess.CalledProcessError):
        pass
    return {
        p.name
        for p in REPO.iterdir()
        if p.is_dir()
        and p.name not in NOT_TREE
        and p.name not in (".git", ".venv", ".pytest_cache", ".hypothesis")
        and not p.name.endswith(".egg-info")
    }


ENTRIES = layout_entries(README.read_text())


def test_readme_is_at_most_300_lines() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move the detail into its "
        "docs/ page and link it"
    )


def test_the_layout_block_is_parsed() -> None:
    text = "## Layout\n\nintro\n\n```text\na/   first\n     more\nb.py second\n```\n"
    assert layout_entries(text) == {"a/": "first more", "b.py": "second"}


@pytest.mark.parametrize("path", sorted(ENTRIES))
def test_every_path_the_layout_names_exists(path: str) -> None:
    target = REPO / path
    assert target.exists(), f"README Layout names {path}, which does not exist"
    if path.endswith("/"):
        assert target.is_dir(), f"README Layout names {path} as a folder"
    assert ENTRIES[path], f"README Layout says nothing about {path}"


def test_the_layout_names_every_package_of_fedpriv() -> None:
    packages = {
        f"fedpriv/{p.name}/"
        for p in (REPO / "fedpriv").iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    }
    assert packages, "no package found under fedpriv/"
    assert sorted(packages - set(ENTRIES)) == []


def test_the_layout_names_every_top_level_folder() -> None:
    named = {path.split("/", 1)[0] for path in ENTRIES}
    assert sorted(top_level_folders() - named - {"fedpriv"} - NOT_TREE) == []
    assert "fedpriv" in named


def _stated_layers(entries: dict[str, str]) -> list[tuple[str, int]]:
    out = []
    for path, what in entries.items():
        found = re.match(r"layer (\d+)\b", what)
        if found:
            out.append((path, int(found.group(1))))
    return out


def _module(path: str) -> str:
    return path.strip("/").replace("/", ".")


def test_the_layout_states_the_enforced_layers() -> None:
    stated = _stated_layers(ENTRIES)
    assert len(stated) >= 10, "the Layout no longer states the layers of the packages"
    wrong = [
        f"{path}: README says layer {n}, tests/test_import_direction.py puts it at "
        f"{height(layer_of(_module(path)))}"
        for path, n in stated
        if height(layer_of(_module(path))) != n
    ]
    assert wrong == []


def test_the_architecture_diagram_states_the_enforced_layers() -> None:
    text = ARCHITECTURE.read_text()
    found = re.search(r"^## The layers\n.*?^```text\n(.*?)^```", text, flags=re.M | re.S)
    assert found, "docs/architecture.md has no ```text diagram under '## The layers'"
    rows = re.findall(r"^\s+(\d)\s+((?:fedpriv/)?\w+/)", found.group(1), flags=re.M)
    assert {p for _, p in rows} >= {p for p in ENTRIES if p.startswith("fedpriv/")}
    wrong = [
        f"{path}: diagram says {n}, the import test {height(layer_of(_module(path)))}"
        for n, path in rows
        if height(layer_of(_module(path))) != int(n)
    ]
    assert wrong == []


# --------------------------------------------------------------------------- links

PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (no links live there)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page`` (repeated headings get GitHub's ``-1``, ``-2``)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def test_the_slug_is_githubs() -> None:
    assert slug("Privacy accounting: `fedpriv-account`") == "privacy-accounting-fedpriv-account"
    assert slug("Speed on the worker engine (n = m = 10,000; 2 workers)") == (
        "speed-on-the-worker-engine-n--m--10000-2-workers"
    )
    assert slug("Where fedpriv's Strategy departs from Flower's") == (
        "where-fedprivs-strategy-departs-from-flowers"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(
                f"{target}: no file {file.relative_to(REPO) if REPO in file.parents else file}"
            )
            continue
        if anchor and file.suffix == ".md" and anchor not in anchors(file):
            bad.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert bad == [], f"{page.relative_to(REPO)}: broken links"


def test_every_docs_page_is_in_the_index() -> None:
    index = (REPO / "docs" / "index.md").read_text()
    listed = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    assert sorted(pages - listed) == []
