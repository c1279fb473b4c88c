"""``fedpriv [GROUP=OPTION ...] --help``: every field of the composed config with its default
and the one-line description its class documents (numpydoc ``Parameters`` / ``Attributes``).

The defaults shown are the classes' own (the schema is made from them), so the help cannot
disagree with what runs.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from fedpriv.run.config import (
    ClientResources,
    DatasetConfig,
    ModelConfig,
    PartitionConfig,
    RunConfig,
    compose_config,
    conf_dir,
)

#: The config groups an argument may pick an option of.
GROUPS = ("dataset", "partition", "model", "privacy", "client", "sampler", "strategy", "aggregator")
#: Groups whose fields a fixed schema class documents.
SCHEMAS: dict[str, type] = {
    "dataset": DatasetConfig,
    "partition": PartitionConfig,
    "model": ModelConfig,
    "client_resources": ClientResources,
}
_ENTRY = re.compile(r"^(\w+(?:, \w+)*) ?:(.*)$")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: first line of its description}`` from ``cls``'s numpydoc docstring sections
    ``Parameters`` and ``Attributes`` (its bases' too, the subclass winning)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        out.update(_docs(inspect.getdoc(klass) or ""))
    return out


def _docs(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    lines = doc.splitlines()
    inside = False
    for i, line in enumerate(lines):
        if line.strip() in ("Parameters", "Attributes") and i + 1 < len(lines):
            inside = lines[i + 1].strip().startswith("---")
            continue
        if inside and line.strip() and not line.startswith(" ") and not line.startswith("-"):
            found = _ENTRY.match(line.strip())
            if found is None:
                continue
            text = found.group(2).strip()
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if nxt.startswith(" ") and nxt.strip():
                text = nxt.strip()
            for name in found.group(1).split(", "):
                out[name] = text
    return out


def describe(node: DictConfig, docs: dict[str, str], indent: str = "") -> list[str]:
    """``key: value  # doc`` lines of ``node`` (nested mappings indented)."""
    lines = []
    for key, value in node.items():
        doc = docs.get(str(key), "")
        comment = f"  # {doc}" if doc else ""
        if isinstance(value, DictConfig) and len(value):
            lines.append(f"{indent}{key!s}:{comment}")
            lines += describe(value, field_docs(_class_of(str(key), value)), indent + "  ")
        else:
            plain = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            shown = json.dumps(plain) if isinstance(plain, (list, dict)) else _scalar(plain)
            lines.append(f"{indent}{key!s}: {shown}{comment}")
    return lines


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _class_of(group: str, node: DictConfig) -> type:
    if "_target_" in node:
        try:
            cls = get_class(str(node["_target_"]))
            return cls if isinstance(cls, type) else object
        except Exception:  # a wrong target is reported when the run is planned
            return object
    return SCHEMAS.get(group, object)


def print_help(argv: list[str]) -> str:
    """The help text for the command's group choices (see the module docstring)."""
    conf = conf_dir()
    out = ["usage: fedpriv [GROUP=OPTION ...] [KEY=VALUE ...] [-m for a sweep] [--help]", ""]
    out.append("Config groups (GROUP=OPTION):")
    for folder in sorted(p for p in conf.iterdir() if p.is_dir()):
        options = ", ".join(sorted(f.stem for f in folder.glob("*.yaml")))
        out.append(f"  {folder.name}: {options}")
    picks = [a.lstrip("+") for a in argv if "=" in a and a.split("=")[0].lstrip("+") in GROUPS]
    cfg: Any = compose_config(picks)
    out += ["", "Fields, defaults and what they mean (set KEY=VALUE, GROUP.KEY=VALUE):", ""]
    out += describe(cfg, field_docs(RunConfig))
    out += [
        "",
        "Name a group's option before --help to see its fields (fedpriv client=checkin "
        "--help); the classes document every field (python -m pydoc clients.local_dpsgd).",
    ]
    return "\n".join(out)
