"""Typed ``key=value`` parameters for the ``fedpriv-account`` analyses.

Every analysis of the CLI registry (:mod:`fedpriv.cli.account`) receives its arguments as
``dict[str, str]`` and reads them through :class:`Params`, which converts each value to its
type, checks its range, and raises :class:`fedpriv.common.errors.ConfigError` naming the key and the
value (``sample_rate='1.5' must be in [0, 1]``). :meth:`Params.finish` rejects keys that the
analysis never read, so a typo (``noise_multipler=1``) is an error instead of being ignored.

Example
-------
>>> p = Params({"noise_multiplier": "1.1", "steps": "100"}, analysis="poisson-gaussian")
>>> p.float("noise_multiplier", ge=0.0), p.int("steps", ge=1), p.delta("target_delta", 1e-5)
(1.1, 100, 1e-05)
>>> p.finish()
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

from fedpriv.common.errors import ConfigError

_MISSING: Any = object()
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_assignments(args: Sequence[str]) -> dict[str, str]:
    """Turn ``["a=1", "b=x"]`` into ``{"a": "1", "b": "x"}``.

    Raises
    ------
    ConfigError
        If an item has no ``=``, an empty key, or a key appears twice.
    """
    out: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("argument", arg, "must be key=value")
        if key in out:
            raise ConfigError(key, value, f"is given twice (first {key}={out[key]})")
        out[key] = value.strip()
    return out


class Params:
    """Read typed values out of a ``dict[str, str]`` and remember which keys were used.

    Parameters
    ----------
    raw : Mapping[str, str]
        The key=value pairs as strings (values that are already numbers are accepted too).
    analysis : str
        Name used in the unknown-key message.
    known : Iterable[str], optional
        All keys the analysis accepts; when given, an unknown key is reported at once
        (before a "required" error that a typo would otherwise cause).

    Raises
    ------
    ConfigError
        If ``known`` is given and ``raw`` has a key outside it.
    """

    def __init__(
        self, raw: Mapping[str, Any], analysis: str = "", known: Iterable[str] | None = None
    ) -> None:
        self.raw = {str(k): v for k, v in raw.items()}
        self.analysis = analysis
        self.used: set[str] = set()
        if known is not None:
            allowed = list(known)
            for key, value in self.raw.items():
                if key not in allowed:
                    where = f" of {analysis}" if analysis else ""
                    raise ConfigError(
                        key, value, f"is not a key{where}; known keys: " + ", ".join(allowed)
                    )

    def has(self, key: builtins.str) -> builtins.bool:
        """Whether ``key`` was given (marks nothing as used)."""
        return key in self.raw

    def _get(self, key: builtins.str, default: Any) -> Any:
        self.used.add(key)
        if key in self.raw:
            return self.raw[key]
        if default is _MISSING:
            raise ConfigError(key, None, "is required")
        return default

    # The methods ``float``, ``int``, ``str`` and ``bool`` shadow the builtins inside the class
    # body, so annotations here name the builtins through :mod:`builtins`.
    @overload
    def float(
        self,
        key: builtins.str,
        default: None,
        *,
        ge: builtins.float | None = None,
        gt: builtins.float | None = None,
        le: builtins.float | None = None,
        lt: builtins.float | None = None,
        allow_inf: builtins.bool = False,
    ) -> builtins.float | None: ...

    @overload
    def float(
        self,
        key: builtins.str,
        default: builtins.float | builtins.str = ...,
        *,
        ge: builtins.float | None = None,
        gt: builtins.float | None = None,
        le: builtins.float | None = None,
        lt: builtins.float | None = None,
        allow_inf: builtins.bool = False,
    ) -> builtins.float: ...

    def float(
        self,
        key: builtins.str,
        default: Any = _MISSING,
        *,
        ge: builtins.float | None = None,
        gt: builtins.float | None = None,
        le: builtins.float | None = None,
        lt: builtins.float | None = None,
        allow_inf: builtins.bool = False,
    ) -> builtins.float | None:
        """A finite float (``inf`` only with ``allow_inf``) within the given bounds.

        ``None`` when the key is absent and the default is ``None``; :class:`ConfigError`
        when it is absent without a default.
        """
        value = self._get(key, default)
        if value is None:
            return None  # an explicit default of None
        try:
            x = builtins.float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, value, "must be a number") from None
        if math.isnan(x) or (math.isinf(x) and not allow_inf):
            raise ConfigError(key, value, "must be a finite number")
        _check_bounds(key, value, x, ge, gt, le, lt)
        return x

    @overload
    def int(
        self,
        key: builtins.str,
        default: None,
        *,
        ge: builtins.int | None = None,
        le: builtins.int | None = None,
    ) -> builtins.int | None: ...

    @overload
    def int(
        self,
        key: builtins.str,
        default: builtins.int | builtins.str = ...,
        *,
        ge: builtins.int | None = None,
        le: builtins.int | None = None,
    ) -> builtins.int: ...

    def int(
        self,
        key: builtins.str,
        default: Any = _MISSING,
        *,
        ge: builtins.int | None = None,
        le: builtins.int | None = None,
    ) -> builtins.int | None:
        """An integer (``1e5`` is accepted when it is integral) within the given bounds.

        ``None`` when the key is absent and the default is ``None``.
        """
        value = self._get(key, default)
        if value is None:
            return None
        try:
            x = builtins.float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, value, "must be an integer") from None
        if not math.isfinite(x) or x != builtins.int(x):
            raise ConfigError(key, value, "must be an integer")
        n = builtins.int(x)
        _check_bounds(key, value, n, ge, None, le, None)
        return n

    def bool(self, key: builtins.str, default: Any = _MISSING) -> builtins.bool:
        """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case)."""
        value = self._get(key, default)
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(key, value, "must be true or false")

    def choice(
        self, key: builtins.str, choices: Iterable[builtins.str], default: Any = _MISSING
    ) -> builtins.str:
        """One of ``choices`` (exact match)."""
        options = list(choices)
        value = self._get(key, default)
        if value not in options:
            raise ConfigError(key, value, "must be one of: " + ", ".join(options))
        return str(value)

    def str(self, key: builtins.str, default: Any = _MISSING) -> builtins.str:
        """The raw string."""
        return str(self._get(key, default))

    @overload
    def delta(self, key: builtins.str, default: None) -> builtins.float | None: ...

    @overload
    def delta(
        self, key: builtins.str = "target_delta", default: builtins.float | builtins.str = ...
    ) -> builtins.float: ...

    def delta(
        self, key: builtins.str = "target_delta", default: Any = _MISSING
    ) -> builtins.float | None:
        """A probability strictly inside (0, 1), as ``target_delta`` must be.

        ``None`` when the key is absent and the default is ``None``.
        """
        value: builtins.float | None = self.float(key, default, gt=0.0, lt=1.0)
        return value

    def exclusive(self, *keys: builtins.str, required: builtins.bool = True) -> builtins.str | None:
        """The one of ``keys`` that was given; error if several (or none and ``required``)."""
        given = [k for k in keys if k in self.raw]
        if len(given) > 1:
            raise ConfigError(
                given[1], self.raw[given[1]], f"cannot be combined with {given[0]}; give one"
            )
        if not given:
            if required:
                raise ConfigError(
                    keys[0], None, "is required (or one of: " + ", ".join(keys[1:]) + ")"
                )
            return None
        return given[0]

    def finish(self) -> None:
        """Raise for the first key that the analysis did not read (an unknown key)."""
        for key, value in self.raw.items():
            if key not in self.used:
                known = ", ".join(sorted(self.used))
                where = f" of {self.analysis}" if self.analysis else ""
                raise ConfigError(key, value, f"is not a key{where}; known keys: {known}")


def _check_bounds(
    key: str,
    raw: Any,
    x: float,
    ge: float | None,
    gt: float | None,
    le: float | None,
    lt: float | None,
) -> None:
    if ge is not None and not x >= ge:
        raise ConfigError(key, raw, f"must be >= {ge}")
    if gt is not None and not x > gt:
        raise ConfigError(key, raw, f"must be > {gt}")
    if le is not None and not x <= le:
        raise ConfigError(key, raw, f"must be <= {le}")
    if lt is not None and not x < lt:
        raise ConfigError(key, raw, f"must be < {lt}")


def noise_or_target(p: Params, spec: Any, num_rounds: int) -> tuple[Any, dict[str, Any]]:
    """``spec`` with the given ``noise_multiplier``, or calibrated to ``target_epsilon`` over
    ``num_rounds`` (exactly one of the two keys; ``p.finish()`` is called). Returns the spec
    and the output entries saying what was calibrated. ``spec`` is a frozen dataclass with a
    ``noise_multiplier`` field and ``calibrated(target_epsilon, num_rounds)``."""
    import dataclasses

    given = p.exclusive("noise_multiplier", "target_epsilon")
    if given == "target_epsilon":
        target = p.float("target_epsilon", gt=0.0)
        p.finish()
        out = {"calibrated": "noise_multiplier", "target_epsilon": target}
        return spec.calibrated(target, num_rounds), out
    sigma = p.float("noise_multiplier", ge=0.0)
    p.finish()
    return dataclasses.replace(spec, noise_multiplier=sigma), {}
