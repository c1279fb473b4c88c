"""Typed payloads: a frozen dataclass as JSON and back, into the SAME class, validated again.

A run's plan and privacy spec travel to every Ray worker this way (:mod:`fedpriv.run.plan`):
the driver encodes the objects it validated; each worker decodes them by calling the class's
constructor, so ``__post_init__`` checks every field again on the worker. Only subclasses of
the type the caller expects are decoded: a payload cannot make a worker build anything else.

Encoding: a dataclass becomes ``{"type": "module.QualName", "fields": {...}}`` (its init
fields), an Enum its value, a tuple or list a list (decoded as a tuple), a mapping a dict;
numbers (``inf`` and ``nan`` included, as JSON's extensions), strings, bools and ``None`` stay.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")

TYPE_KEY = "type"
FIELDS_KEY = "fields"


def encode(value: Any) -> Any:
    """``value`` as JSON-able data (see the module docstring).

    Raises
    ------
    TypeError
        For a value of another type (a tensor, an open file, ...).
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {
            f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init
        }
        return {TYPE_KEY: f"{cls.__module__}.{cls.__qualname__}", FIELDS_KEY: fields}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot encode {type(value).__name__} in a payload")


def decode(data: Any, expected: type[T]) -> T:
    """The object :func:`encode` made of ``data``, built by its class's constructor.

    Raises
    ------
    TypeError
        If ``data`` is not a payload of ``expected`` or of a subclass of it.
    ConfigError
        If the class refuses a field (the constructor validates again).
    """
    if not (isinstance(data, dict) and set(data) == {TYPE_KEY, FIELDS_KEY}):
        raise TypeError(f"not a payload of {expected.__name__}: {str(data)[:80]}")
    cls = _class(str(data[TYPE_KEY]))
    if not issubclass(cls, expected):
        raise TypeError(f"payload holds {cls.__name__}, expected {expected.__name__}")
    obj: T = _decode(data)
    return obj


def dumps(value: Any) -> str:
    """:func:`encode` as a canonical JSON string (sorted keys: equal objects, equal strings)."""
    return json.dumps(encode(value), sort_keys=True)


def loads(text: str, expected: type[T]) -> T:
    """Inverse of :func:`dumps`."""
    return decode(json.loads(text), expected)


def _decode(data: Any) -> Any:
    if isinstance(data, dict) and set(data) == {TYPE_KEY, FIELDS_KEY}:
        cls = _class(str(data[TYPE_KEY]))
        return cls(**{k: _decode(v) for k, v in data[FIELDS_KEY].items()})
    if isinstance(data, list):
        return tuple(_decode(v) for v in data)
    if isinstance(data, dict):
        return {k: _decode(v) for k, v in data.items()}
    return data


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    obj = getattr(importlib.import_module(module), name, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise TypeError(f"payload names {path!r}, which is not a dataclass")
    return obj
