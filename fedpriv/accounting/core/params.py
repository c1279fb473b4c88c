"""Typed ``key=value`` parameters for the ``fedpriv-account`` analyses.

Every analysis of the CLI registry (:mod:`fedpriv.cli.account`) receives its arguments as
``dict[str, str]`` and reads them through :class:`Params`, which converts each value to its
type, checks its range, and raises :class:`fedpriv.common.errors.ConfigError` naming the key and the
value (``sample_rate='1.5' must be in [0, 1]``). :meth:`Params.finish` rejects keys that the
analysis never read, so a typo (``noise_multipler=1``) is an error instead of being ignored.

An analysis states its keys as :class:`Key` objects: for a privacy spec they are derived from
the spec's dataclass fields (:func:`fedpriv.accounting.core.cli_runner.spec_keys`), and the
spec declares only what is its own in :class:`CliKeys` (aliases, derived keys, the rounds key,
what the answer prints).

Example
-------
>>> p = Params({"noise_multiplier": "1.1", "steps": "100"}, analysis="poisson-gaussian")
>>> p.float("noise_multiplier", ge=0.0), p.int("steps", ge=1), p.delta("target_delta", 1e-5)
(1.1, 100, 1e-05)
>>> p.finish()
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from fedpriv.common.errors import ConfigError
from fedpriv.common.validate import parse_enum

_MISSING: Any = object()
#: A :class:`Key` default meaning: the key must be given.
REQUIRED: Any = _MISSING
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


@dataclass(frozen=True, kw_only=True)
class Key:
    """One ``key=value`` of a ``fedpriv-account`` analysis: its type, default and range.

    Parameters
    ----------
    name : str
        The key on the command line.
    kind : type
        ``float``, ``int``, ``bool``, ``str`` or an :class:`enum.Enum` (its values are the
        choices; the enum's own aliases are accepted).
    default : Any
        The value when the key is absent (:data:`REQUIRED`: it must be given; ``None``:
        absent).
    doc : str
        One line for ``--help`` (a spec field's comes from the spec's docstring).
    field : str or None
        The spec field the key sets (``"cohort.num_clients"`` for a field of a bound dataclass
        field); ``None`` for a key of the analysis itself (rounds, lower bound, derived keys).
    choices : tuple of str
        For a ``str`` key, the values accepted (empty: any); for an enum key, a subset.
    refusal : str
        The message for a value outside ``choices`` (default: ``must be one of: ...``).
    limits : Mapping[str, float]
        ``ge``/``gt``/``le``/``lt`` checked when the value is read (the CLI's own caps; the
        spec checks its fields' ranges itself).
    allow_inf : bool
        A float key that accepts ``inf``.
    """

    name: str
    kind: Any = float
    default: Any = REQUIRED
    doc: str = ""
    field: str | None = None
    choices: tuple[str, ...] = ()
    refusal: str = ""
    limits: Mapping[str, float] = dataclasses.field(default_factory=dict)
    allow_inf: bool = False

    @property
    def required(self) -> builtins.bool:
        """Whether the key must be given."""
        return self.default is REQUIRED

    def read(self, p: Params) -> Any:
        """The typed value of this key in ``p`` (its default when absent).

        Raises
        ------
        ConfigError
            Naming the key and the value given, for a value of the wrong type, outside
            ``choices`` or ``limits``, or a required key that is absent.
        """
        name, default = self.name, self.default
        if self.kind is bool:
            return None if default is None and not p.has(name) else p.bool(name, default)
        if self.kind is int:
            ge, le = self.limits.get("ge"), self.limits.get("le")
            return p.int(
                name,
                default,
                ge=None if ge is None else builtins.int(ge),
                le=None if le is None else builtins.int(le),
            )
        if self.kind is float:
            return p.float(name, default, allow_inf=self.allow_inf, **self.limits)
        raw = p._get(name, default)
        if raw is None or (isinstance(raw, enum.Enum) and raw is default):
            return raw
        if isinstance(self.kind, type) and issubclass(self.kind, enum.Enum):
            kind: Any = self.kind
            value: Any = parse_enum(kind, name, raw)
            text = str(value.value)
        else:
            value = text = str(raw)
        if self.choices and text not in self.choices:
            why = self.refusal or "must be one of: " + ", ".join(self.choices)
            raise ConfigError(name, raw, why)
        return value

    def type_text(self) -> str:
        """The type as ``--help`` shows it: ``float``, ``int``, ``bool`` or ``{a,b}``."""
        if isinstance(self.kind, type) and issubclass(self.kind, enum.Enum):
            values = self.choices or tuple(str(m.value) for m in self.kind)
            return "{" + ",".join(values) + "}"
        if self.kind is str and self.choices:
            return "{" + ",".join(self.choices) + "}"
        return str(getattr(self.kind, "__name__", self.kind))

    def default_text(self) -> str:
        """The default as ``--help`` shows it (``required``, ``-`` for none)."""
        if self.required:
            return "required"
        if self.default is None:
            return "-"
        if isinstance(self.default, enum.Enum):
            return str(self.default.value)
        if isinstance(self.default, builtins.bool):
            return "true" if self.default else "false"
        return (
            f"{self.default:g}" if isinstance(self.default, builtins.float) else str(self.default)
        )


#: Builds a spec's keyword arguments from the typed values of a call (``derive``).
Derive = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class CliKeys:
    """What a privacy spec declares for ``fedpriv-account`` beyond its dataclass fields.

    The keys of a spec's analysis are its config fields (those it does not bind), and the
    fields named in ``takes``, each with the field's type and default
    (:func:`fedpriv.accounting.core.cli_runner.spec_keys`); then ``target_epsilon``
    calibrates the noise parameter (:attr:`PrivacySpec.calibrates`), the rounds key gives the
    rounds, and ``lower_bound=true`` asks for :meth:`PrivacySpec.lower_bound`. Everything else
    here is an override of what the fields say.

    Parameters
    ----------
    doc : str
        What the analysis answers (``--help``; default: the spec's first docstring line).
    takes : tuple of str
        Bound (or run-only) fields the CLI takes as keys (a field whose type is a dataclass,
        e.g. the cohort sampler: each of its fields).
    hide : tuple of str
        Fields that are not keys (they do not change this analysis's answer).
    required : tuple of str
        Keys that must be given (a bound fact whose default only means "not bound yet").
    defaults : Mapping[str, Any]
        Defaults of the CLI that differ from the field's.
    limits : Mapping[str, Mapping[str, float]]
        The CLI's caps of a key (``{"epochs": {"le": 100_000}}``: minutes of computation
        beyond).
    aliases : Mapping[str, str]
        ``{key: field}`` where the key is not spelled as the field (``sampling``: ``sampler``).
    renamed : Mapping[str, str]
        ``{old key: new key}``: an old spelling refused in one line naming the new one.
    extra : tuple of Key
        Keys that set no field directly; ``derive`` reads them.
    rounds : Key
        The key giving the rounds after which ε is answered (``num_rounds``; ``repetitions``
        for check-in passes); ``bind_rounds`` also sets the spec's ``num_rounds`` field.
    bind_rounds : bool
        Set the spec's bound ``num_rounds`` field to the rounds.
    noise_aliases : tuple of str
        Other keys that give the noise parameter (through ``derive``), exclusive with it and
        with ``target_epsilon``.
    delta_at_epsilon : bool
        With the noise given, ``target_epsilon`` without ``target_delta`` asks for δ at that ε.
    summary : tuple of str
        Entries of :meth:`PrivacySpec.summary` the answer prints.
    local_epsilon : bool
        The answer also prints ``local_epsilon`` (one client's own release,
        :meth:`PrivacySpec.local_events`).
    derive : callable, optional
        ``values -> spec keyword arguments`` for derived keys (given the typed values of the
        call, keyed by CLI key; returns the fields it sets).
    report : callable, optional
        ``(spec, num_rounds) -> dict``: the analysis's own entries of the answer.
    epsilon, delta, calibrate : callable, optional
        Replace ``spec.epsilon(n)``, δ at ε from the spec's ledger, and
        ``spec.calibrated(target, n)`` (batch clipping answers for a group of records).
    """

    doc: str = ""
    takes: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    limits: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    renamed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra: tuple[Key, ...] = ()
    rounds: Key = Key(
        name="num_rounds", kind=int, default=1, limits={"ge": 1}, doc="rounds released"
    )
    bind_rounds: bool = False
    noise_aliases: tuple[str, ...] = ()
    delta_at_epsilon: bool = False
    summary: tuple[str, ...] = ()
    local_epsilon: bool = False
    derive: Derive | None = None
    report: Callable[[Any, int], dict[str, Any]] | None = None
    epsilon: Callable[[Any, int], float] | None = None
    delta: Callable[[Any, float, int], float] | None = None
    calibrate: Callable[[Any, float, int], Any] | None = None
