"""Validation helpers shared by every layer: finite and positive numbers, closed sets.

Each raises :class:`~fedpriv.common.errors.ConfigError` naming the field and the value, so bad
input gets one line (``privacy.noise_multiplier=-1.0 must be >= 0``).
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, TypeVar

from fedpriv.common.errors import ConfigError, check

E = TypeVar("E", bound=StrEnum)


def parse_enum(cls: type[E], field: str, value: Any) -> E:
    """``cls(value)``, or a :class:`ConfigError` naming ``field``, ``value`` and the choices."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise ConfigError(field, value, f"must be one of: {choices}") from None


def check_finite(field: str, value: Any, allowed: str = "must be a finite number") -> float:
    """``float(value)`` when it is a finite number; else :class:`ConfigError` naming the field."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, value, allowed) from None
    check(math.isfinite(x), field, value, allowed)
    return x


def check_positive(field: str, value: Any, allowed: str = "must be a finite number > 0") -> float:
    """``float(value)`` when it is a finite number > 0; else :class:`ConfigError` (``allowed``)."""
    x = check_finite(field, value, allowed)
    check(x > 0, field, value, allowed)
    return x
