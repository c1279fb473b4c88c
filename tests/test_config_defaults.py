"""One source of defaults (issue 23, item 3): every default lives in the code, once.

The top-level keys' defaults are :class:`fedpriv.run.config.RunConfig`'s; an option of a class
group (``privacy``, ``client``, ``strategy``, ``aggregator``) names its class and extends the
schema made of that class's fields, so the class's defaults are the option's. These tests fail
if a yaml file states a default again with another value, or an option of a class group does
not take its class's defaults.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from fedpriv.common.schema import plain
from fedpriv.run.config import CLASS_GROUPS, RunConfig, compose_config, conf_dir, option_schema

CONF = conf_dir()
OPTIONS = sorted(p for g in CLASS_GROUPS for p in (CONF / g).glob("*.yaml") if p.stem != "custom")
#: Keys of a class-group option that are not defaults: its class, Hydra's directives, and
#: values bound to the run by interpolation (``${num_clients}``).
NOT_DEFAULTS = {"defaults", "_target_", "_recursive_"}


def class_defaults(cls: type) -> dict[str, Any]:
    """The default of every configurable field of ``cls`` (its schema's)."""
    out = {}
    for f in dataclasses.fields(option_schema(cls)):
        factory = f.default_factory
        out[f.name] = f.default if factory is dataclasses.MISSING else factory()
    return out


def stated(path: Path) -> dict[str, Any]:
    node = OmegaConf.load(path)
    return {
        k: v
        for k, v in OmegaConf.to_container(node, resolve=False).items()  # type: ignore[union-attr]
        if k not in NOT_DEFAULTS
    }


def test_the_top_level_yaml_states_no_value() -> None:
    node = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
    assert set(node) == {"defaults", "hydra"}  # type: ignore[arg-type]


def test_the_default_run_takes_the_schema_defaults() -> None:
    cfg = OmegaConf.to_container(compose_config([]))
    for f in dataclasses.fields(RunConfig):
        if f.default not in (dataclasses.MISSING, "???"):  # ???: a group's option
            assert cfg[f.name] == f.default, f.name  # type: ignore[index]


@pytest.mark.parametrize("path", OPTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_class_option_restates_no_default_with_another_value(path: Path) -> None:
    target = str(OmegaConf.load(path).get("_target_"))
    defaults = class_defaults(get_class(target))
    wrong = {
        k: (v, defaults.get(k, "<not a field>"))
        for k, v in stated(path).items()
        if not (isinstance(v, str) and v.startswith("${")) and plain(v) != defaults.get(k)
    }
    assert wrong == {}, f"{path.name}: stated value vs the class default"


@pytest.mark.parametrize("path", OPTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_class_option_extends_its_class_schema(path: Path) -> None:
    node = OmegaConf.to_container(OmegaConf.load(path))
    assert f"{path.stem}_schema" in node.get("defaults", []), path  # type: ignore[union-attr]
    cfg = compose_config([f"{path.parent.name}={path.stem}"])
    defaults = class_defaults(get_class(str(node["_target_"])))  # type: ignore[index]
    composed = OmegaConf.to_container(cfg[path.parent.name], resolve=True)
    for key, value in defaults.items():
        if key in stated(path) or key == "_target_":
            continue
        assert composed[key] == value, (path.name, key)  # type: ignore[index]
