"""``fedpriv-account``'s one runner: the keys of an analysis derived from its privacy spec.

A spec's analysis takes as ``key=value`` exactly the spec's config fields (those the run does
not bind) and the bound facts its :class:`~fedpriv.accounting.core.params.CliKeys` names, each
with the field's type, default and allowed enum values (:func:`spec_keys`); ``--help`` lists
them (:func:`help_text`). A call (:func:`run_spec`):

1. reads every key (an unknown key, a value of the wrong type or outside a key's choices is
   refused in one line naming the key and the value);
2. builds the spec, which checks every range itself (its message is renamed to the CLI's key
   and the value as typed);
3. answers ε after the rounds, or calibrates the noise parameter to ``target_epsilon``
   through ``spec.calibrated`` (the run's calibration), or, where the spec allows it, answers
   δ at ``target_epsilon`` when the noise is given;
4. adds the entries the spec declares (summary entries, its own report) and, with
   ``lower_bound=true``, :meth:`PrivacySpec.lower_bound`'s entries.

Analyses that are no spec (:mod:`fedpriv.accounting.accountants.gdp`'s G_μ analyses) state
their keys as :class:`~fedpriv.accounting.core.params.Key` objects (:class:`FunctionAnalysis`);
an analysis whose spec depends on one key (``checkin noise=``, ``secagg-dpsgd mechanism=``) is
a :class:`Choice`.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fedpriv.accounting.core.lower_report import LOWER_BOUND_KEY
from fedpriv.accounting.core.params import REQUIRED, CliKeys, Key, Params
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.common.errors import ConfigError

__all__ = [
    "Choice",
    "FunctionAnalysis",
    "SpecCli",
    "answer",
    "help_text",
    "run_spec",
    "spec_from_params",
    "spec_keys",
]

#: Fields of every spec that only steer a run (never a key unless ``CliKeys.takes`` says).
RUN_ONLY = ("stop_at_epsilon", "secure_mode", "calibrated_from_target_epsilon")
#: Config groups a spec's messages prefix to a field (the CLI names the bare key).
PREFIXES = ("privacy.", "client.")
#: ``lower_bound=true|false``: every analysis takes it.
LOWER_BOUND = Key(
    name=LOWER_BOUND_KEY,
    kind=bool,
    default=False,
    doc="true: also answer epsilon_lower_bound, a lower bound on the same mechanism's epsilon",
)
#: Answered in one line when ``target_epsilon`` and ``target_delta`` come with the noise.
BOTH_TARGETS = (
    "cannot be combined with target_delta when the noise is given: give target_delta for "
    "epsilon, target_epsilon for delta, or omit the noise to calibrate it"
)


@dataclass(frozen=True)
class SpecCli:
    """An analysis of ``spec``: the spec's own (``spec.cli``) or another reading of it."""

    spec: type[PrivacySpec]
    cli: CliKeys


@dataclass(frozen=True)
class FunctionAnalysis:
    """An analysis that is no spec: its keys, and ``run(values) -> answer`` on typed values."""

    keys: tuple[Key, ...]
    run: Callable[[dict[str, Any]], dict[str, Any]]
    doc: str = ""


@dataclass(frozen=True)
class Choice:
    """An analysis whose spec is chosen by one key: ``options`` maps its values to
    ``"module:attribute"`` (a spec class or a :class:`SpecCli`), imported when chosen."""

    key: str
    options: Mapping[str, str]
    default: str
    doc: str = ""

    def pick(self, raw: Mapping[str, Any]) -> tuple[str, SpecCli]:
        """The option ``raw`` names (its default when absent) and its analysis.

        Raises
        ------
        ConfigError
            For a value that is no option.
        """
        value = str(raw.get(self.key, self.default))
        if value not in self.options:
            raise ConfigError(self.key, value, "must be one of: " + ", ".join(self.options))
        return value, as_spec_cli(load(self.options[value]))

    def key_object(self) -> Key:
        """This key, as ``--help`` lists it."""
        return Key(name=self.key, kind=str, default=self.default, choices=tuple(self.options))


def load(target: str) -> Any:
    """The attribute ``"module:attribute"`` names (imported now)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def as_spec_cli(obj: Any) -> SpecCli:
    """A spec class as its own analysis (``cls.cli``); a :class:`SpecCli` as it is."""
    return obj if isinstance(obj, SpecCli) else SpecCli(obj, obj.cli)


# --------------------------------------------------------------------------- the keys
def spec_keys(cls: type[PrivacySpec], cli: CliKeys) -> list[Key]:
    """Every key of ``cls``'s analysis: the fields (config fields, then the bound ones
    ``cli.takes`` names; a dataclass-valued field as its own fields), ``cli.extra``, the rounds
    key and ``lower_bound``. Types, defaults and enum values are the fields'.

    Raises
    ------
    TypeError
        For a field taken as a key whose type a command line cannot hold (hide it).
    """
    hints = typing.get_type_hints(cls)
    keys: list[Key] = []
    shared = [f.name for f in dataclasses.fields(PrivacySpec)]
    fields = sorted(dataclasses.fields(cls), key=lambda f: f.name in shared)  # the family's first
    for f in fields:
        if not _taken(cls, cli, f.name):
            continue
        kind = _plain(hints[f.name])
        if dataclasses.is_dataclass(kind):
            keys += _nested_keys(kind, f.name, cli)
        else:
            keys.append(_key(cls, cli, f.name, kind, _default(f)))
    return [*keys, *cli.extra, cli.rounds, LOWER_BOUND]


def _taken(cls: type[PrivacySpec], cli: CliKeys, name: str) -> bool:
    if name in cli.hide:
        return False
    if name in cli.takes:
        return True
    return name not in cls.bound_fields and name not in RUN_ONLY


def _nested_keys(kind: Any, outer: str, cli: CliKeys) -> list[Key]:
    hints = typing.get_type_hints(kind)
    out = []
    for f in dataclasses.fields(kind):
        if f.name in cli.hide or not f.init:
            continue
        out.append(_key(kind, cli, f.name, _plain(hints[f.name]), _default(f), outer))
    return out


def _key(
    owner: type, cli: CliKeys, name: str, kind: Any, default: Any, outer: str | None = None
) -> Key:
    if kind not in (float, int, bool, str) and not (
        isinstance(kind, type) and issubclass(kind, enum.Enum)
    ):
        raise TypeError(f"{owner.__name__}.{name}: a command line cannot hold {kind!r}; hide it")
    key = {f: k for k, f in cli.aliases.items()}.get(name, name)
    noise = getattr(owner, "calibrates", None)
    if name == noise or key in cli.required:
        default = None if name == noise else REQUIRED
    default = cli.defaults.get(key, default)
    path = name if outer is None else f"{outer}.{name}"
    return Key(name=key, kind=kind, default=default, field=path, limits=cli.limits.get(key, {}))


def _plain(hint: Any) -> Any:
    """``X`` of ``X | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner[0] if len(inner) == 1 else hint
    return hint


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


# --------------------------------------------------------------------------- a call
def answer(name: str, obj: Any, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Answer ``fedpriv-account NAME`` for ``raw``: ``obj`` is the registry's entry (a spec
    class, a :class:`SpecCli`, a :class:`Choice` or a :class:`FunctionAnalysis`).

    Raises
    ------
    ConfigError
        One line naming a key and its value.
    """
    if isinstance(obj, FunctionAnalysis):
        p = Params(raw, name, known=[k.name for k in obj.keys])
        values = {k.name: k.read(p) for k in obj.keys}
        with renamed(CliKeys(), p):
            return obj.run(values)
    if isinstance(obj, Choice):
        _, analysis = obj.pick(raw)
        return run_spec(name, analysis, {k: v for k, v in raw.items() if k != obj.key})
    return run_spec(name, as_spec_cli(obj), raw)


def run_spec(name: str, analysis: SpecCli, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Answer ``fedpriv-account NAME`` for ``raw`` (``{key: value}``, strings or numbers).

    Returns
    -------
    dict
        ``analysis``, ``calibrated`` and ``target_epsilon`` when calibrated, ``epsilon``,
        ``delta``, the rounds, ``neighboring_relation``, the spec's declared entries, and with
        ``lower_bound=true`` :meth:`PrivacySpec.lower_bound`'s entries.

    Raises
    ------
    ConfigError
        One line naming a key and its value, for any bad input or refused combination.
    """
    cls, cli = analysis.spec, analysis.cli
    keys = spec_keys(cls, cli)
    p = _params(raw, name, cli, keys)
    values = {k.name: k.read(p) for k in keys}
    lower, n = values.pop(LOWER_BOUND_KEY), values.pop(cli.rounds.name)
    mode = _mode(cls, cli, p)
    target = float(values["target_epsilon"] or 0.0)  # in the calibrate and delta modes
    out: dict[str, Any] = {"analysis": name}
    with renamed(cli, p):
        spec = _build(cls, cli, keys, values, n, calibrating=mode == "calibrate")
        if mode == "calibrate":
            spec = (cli.calibrate or _calibrated)(spec, target, n)
            out.update(calibrated=cls.calibrates, target_epsilon=target)
        if mode == "delta":
            epsilon, delta = target, (cli.delta or _ledger_delta)(spec, target, n)
            spec = _at_delta(spec, delta)
        else:
            epsilon, delta = (cli.epsilon or _epsilon)(spec, n), spec.target_delta
        out.update(epsilon=epsilon, delta=delta)
        out.update(_entries(spec, cli, n))
        if lower:
            out.update(spec.lower_bound(n).entries())
    return out


def spec_from_params(cls: type[PrivacySpec], p: Params) -> Any:
    """The spec of a call's parameters ``p`` (its own analysis's keys; the rounds and
    ``lower_bound`` are read and ignored); without the noise parameter but with
    ``target_epsilon``, a spec that still needs calibration.

    Raises
    ------
    ConfigError
        As :func:`run_spec`.
    """
    cli = cls.cli
    keys = spec_keys(cls, cli)
    q = _params(p.raw, p.analysis, cli, keys)
    values = {k.name: k.read(q) for k in keys}
    mode = _mode(cls, cli, q)
    with renamed(cli, q):
        return _build(cls, cli, keys, values, values[cli.rounds.name], mode == "calibrate")


def _params(raw: Mapping[str, Any], name: str, cli: CliKeys, keys: list[Key]) -> Params:
    """``raw`` as :class:`Params` of these keys (an old spelling or unknown key refused)."""
    for old, new in cli.renamed.items():
        if old in raw:
            raise ConfigError(old, raw[old], f"was renamed: use {new} (docs/migration.md)")
    return Params(raw, name, known=[k.name for k in keys])


def _mode(cls: type[PrivacySpec], cli: CliKeys, p: Params) -> str:
    """``epsilon`` (the noise is given), ``calibrate`` (``target_epsilon`` instead) or
    ``delta`` (both, without ``target_delta``, where the spec allows it)."""
    noise = (cls.calibrates, *cli.noise_aliases)
    given = [k for k in noise if p.has(k)]
    if len(given) > 1:
        raise ConfigError(
            given[1], p.raw[given[1]], f"cannot be combined with {given[0]}; give one"
        )
    if not p.has("target_epsilon"):
        if not given:
            others = ", ".join([*noise[1:], "target_epsilon"])
            raise ConfigError(noise[0], None, f"is required (or one of: {others})")
        return "epsilon"
    if not given:
        return "calibrate"
    target = p.raw["target_epsilon"]
    if not cli.delta_at_epsilon:
        raise ConfigError("target_epsilon", target, f"cannot be combined with {given[0]}; give one")
    if p.has("target_delta"):
        raise ConfigError("target_epsilon", target, BOTH_TARGETS)
    return "delta"


def _build(
    cls: type[PrivacySpec],
    cli: CliKeys,
    keys: list[Key],
    values: dict[str, Any],
    n: int,
    calibrating: bool,
) -> Any:
    """The spec of the typed ``values`` (the noise left to calibration when ``calibrating``)."""
    kwargs: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for k in keys:
        if k.field is None or k.name not in values:
            continue
        outer, _, inner = k.field.rpartition(".")
        (nested.setdefault(outer, {}) if outer else kwargs)[inner] = values[k.name]
    hints = typing.get_type_hints(cls)
    for outer, fields in nested.items():
        kwargs[outer] = _plain(hints[outer])(**fields)
    if not calibrating:
        kwargs["target_epsilon"] = None
    if cli.bind_rounds:
        kwargs["num_rounds"] = n
    if cli.derive is not None:
        kwargs.update(cli.derive(values))
    return cls(**kwargs)


def _calibrated(spec: Any, target: float, n: int) -> Any:
    return spec.calibrated(target, n)


def _epsilon(spec: Any, n: int) -> float:
    return float(spec.epsilon(n))


def _ledger_delta(spec: Any, epsilon: float, n: int) -> float:
    """δ at ``epsilon`` of the spec's ledger after ``n`` rounds."""
    ledger = spec.accounting.ledger()
    for event, count in spec.round_events():
        ledger.record(event, count * n)
    return float(ledger.get_delta(epsilon))


def _at_delta(spec: Any, delta: float) -> Any:
    """``spec`` at the δ just answered (its report and lower bound then read that δ); the spec
    itself where that δ is no valid target (0, or 1 and above)."""
    if not 0.0 < delta < 1.0:
        return spec
    try:
        return dataclasses.replace(spec, target_delta=delta)
    except ConfigError:
        return spec


def _entries(spec: Any, cli: CliKeys, n: int) -> dict[str, Any]:
    """The rounds, the relation, ``local_epsilon``, the declared summary entries and the
    spec's own report."""
    out: dict[str, Any] = {cli.rounds.name: n}
    if cli.local_epsilon:
        out["local_epsilon"] = spec.accounting.epsilon_after(spec.local_events(), n)
    if cli.summary:
        summary = spec.summary()
        out.update({k: summary.get(k) for k in cli.summary})
    out["neighboring_relation"] = spec.neighboring_relation.value
    if cli.report is not None:
        out.update(cli.report(spec, n))
    return out


@contextmanager
def renamed(cli: CliKeys, p: Params) -> Iterator[None]:
    """Re-raise a spec's :class:`ConfigError` naming the CLI key (``privacy.sampler`` →
    ``sampling``) and the value as typed on the command line."""
    try:
        yield
    except ConfigError as exc:
        name = exc.field
        for prefix in PREFIXES:
            name = name.removeprefix(prefix)
        name = name.rpartition(".")[2] if name.startswith("cohort.") else name
        key = {f: k for k, f in cli.aliases.items()}.get(name, name)
        value = p.raw[key] if key in p.raw else exc.value
        if key == exc.field and value is exc.value:
            raise
        raise ConfigError(key, value, exc.allowed) from None


# --------------------------------------------------------------------------- --help
def help_text(name: str, obj: Any, raw: Mapping[str, Any] | None = None) -> str:
    """``fedpriv-account NAME --help``: what the analysis answers and every key with its type,
    default and meaning (a :class:`Choice` lists the keys of the option ``raw`` picks)."""
    head = f"usage: fedpriv-account {name} key=value ... [--json]"
    choice_key: list[Key] = []
    noise: tuple[str, ...] = ()
    if isinstance(obj, Choice):
        value, analysis = obj.pick(raw or {})
        choice_key = [obj.key_object()]
        doc = obj.doc + f"\n\n{obj.key}={value}: " + _doc(analysis)
        keys, docs = spec_keys(analysis.spec, analysis.cli), _field_docs(analysis.spec)
        noise = (analysis.spec.calibrates, *analysis.cli.noise_aliases)
    elif isinstance(obj, FunctionAnalysis):
        doc, keys, docs = obj.doc, list(obj.keys), {}
    else:
        analysis = as_spec_cli(obj)
        doc, docs = _doc(analysis), _field_docs(analysis.spec)
        keys = spec_keys(analysis.spec, analysis.cli)
        noise = (analysis.spec.calibrates, *analysis.cli.noise_aliases)
    docs = {**docs, **_cli_docs(obj, raw)}
    rows = [_row(k, docs, noise) for k in [*choice_key, *keys]]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"  {a.ljust(widths[0])}  {b.ljust(widths[1])}  {c}".rstrip() for a, b, c in rows]
    return f"{head}\n\n{doc}\n\nkeys (key=type  default  meaning):\n" + "\n".join(lines)


def _cli_docs(obj: Any, raw: Mapping[str, Any] | None) -> dict[str, str]:
    """What the keys every spec analysis shares mean on the command line."""
    analysis = obj.pick(raw or {})[1] if isinstance(obj, Choice) else obj
    if isinstance(analysis, FunctionAnalysis):
        return {}
    cli = as_spec_cli(analysis).cli
    target = "calibrate the noise parameter to this epsilon after the rounds (omit the noise)"
    if cli.delta_at_epsilon:
        target += "; with the noise and without target_delta: answer delta at this epsilon"
    return {"target_epsilon": target}


def _doc(analysis: SpecCli) -> str:
    if analysis.cli.doc:
        return analysis.cli.doc
    return inspect.cleandoc(analysis.spec.__doc__ or "").split("\n\n", 1)[0]


def _row(k: Key, docs: Mapping[str, str], noise: tuple[str, ...]) -> tuple[str, str, str]:
    """``key=type``, the default (``or KEY`` for the noise parameter), the meaning."""
    default = "or " + ", ".join(n for n in (*noise, "target_epsilon") if n != k.name)
    default = default if k.name in noise else k.default_text()
    meaning = docs.get(k.name) if k.name == "target_epsilon" else None
    meaning = meaning or k.doc or docs.get((k.field or k.name).rpartition(".")[2], "")
    return f"{k.name}={k.type_text()}", default, re.sub(r":\w+:`~?([^`]+)`", r"\1", meaning)


def _field_docs(cls: type) -> dict[str, str]:
    """``{field: first sentence}`` from the numpydoc ``Parameters`` of ``cls`` and its bases
    (the subclass winning) and of the cohort sampler (a field of client-level specs)."""
    from fedpriv.mechanisms.client_sampling import CohortSampler

    out: dict[str, str] = {}
    for klass in [*reversed(CohortSampler.__mro__), *reversed(cls.__mro__)]:
        out.update(_parameters(inspect.getdoc(klass) or ""))
    return out


def _parameters(doc: str) -> dict[str, str]:
    """``{name: first sentence of its description}`` of a numpydoc ``Parameters`` section."""
    out: dict[str, str] = {}
    lines = doc.split("\nParameters\n----------\n", 1)[1:]
    names: list[str] = []
    text: list[str] = []
    for line in (lines[0].split("\n\n")[0].splitlines() if lines else []) + [""]:
        if line and not line.startswith(" "):
            _store(out, names, text)
            names, text = [n.strip() for n in line.split(":", 1)[0].split(",")], []
        elif line.strip():
            text.append(line.strip())
    _store(out, names, text)
    return out


def _store(out: dict[str, str], names: list[str], text: list[str]) -> None:
    sentence = " ".join(text).replace("``", "").split(". ", 1)[0].rstrip(".")
    for name in names:
        if sentence and not name.startswith("("):
            out[name] = sentence
