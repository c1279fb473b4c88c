"""Hydra structured-config schemas made from a class's own dataclass fields.

A config option (``conf/<group>/<option>.yaml``) names its class with ``_target_`` and extends
the schema this module makes of that class: the class's init fields, their types (enums as
strings, tuples as lists) and THEIR defaults. So every default lives in one place, the class,
and Hydra type-checks every override (``client.steps=abc`` is refused when the config is
composed).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

#: Types OmegaConf stores as they are.
_PLAIN = (int, float, bool, str)


def dataclass_schema(cls: type, skip: typing.Iterable[str] = ()) -> type:
    """A dataclass for Hydra's ConfigStore: ``cls``'s init fields except ``skip``, with their
    config types and defaults, and ``_target_`` naming ``cls``.

    Raises
    ------
    TypeError
        If a configurable field has no default, or a type a config cannot hold (name it in
        ``skip``: the run binds it).
    """
    hints = typing.get_type_hints(cls)
    skipped = set(skip)
    rows: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skipped or f.name.startswith("_"):
            continue
        kind = config_type(hints[f.name], f"{cls.__name__}.{f.name}")
        rows.append((f.name, kind, dataclasses.field(default_factory=_factory(cls, f))))
    target = f"{cls.__module__}.{cls.__qualname__}"
    rows.append(("_target_", str, dataclasses.field(default=target)))
    return dataclasses.make_dataclass(f"{cls.__name__}Config", rows)


def _factory(cls: type, f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        value = plain(f.default)
    elif f.default_factory is not dataclasses.MISSING:
        value = plain(f.default_factory())
    else:
        raise TypeError(f"{cls.__name__}.{f.name} needs a default to be configurable")
    return lambda: value


def plain(value: Any) -> Any:
    """A default as a config holds it: enums as their values, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def config_type(kind: Any, where: str = "") -> Any:
    """An OmegaConf-friendly annotation of ``kind``.

    Raises
    ------
    TypeError
        For a type a config cannot hold.
    """
    if kind is Any or kind in _PLAIN:
        return kind
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return str
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if isinstance(kind, types.UnionType) or origin is typing.Union:
        inner = [config_type(a, where) for a in args if a is not type(None)]
        return typing.Optional[inner[0]] if len(inner) == 1 else Any  # noqa: UP007
    if origin in (tuple, list) or kind in (tuple, list):
        return list[Any]
    if origin in (dict, typing.Mapping) or kind is dict:
        return dict[str, Any]
    from collections.abc import Mapping

    if origin is Mapping:
        return dict[str, Any]
    raise TypeError(f"{where}: a config cannot hold {kind!r}; bind it in the run instead")
