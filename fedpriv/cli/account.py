r"""``fedpriv-account ANALYSIS key=value ... [--json]``: every privacy analysis from a shell.

The analyses form a registry: ``ANALYSES`` maps a name to ``"module:attribute"``, imported only
when that analysis runs: a privacy spec class (its keys are the spec's fields, its answer the
spec's ε: :mod:`fedpriv.accounting.core.cli_runner`), a
:class:`~fedpriv.accounting.core.cli_runner.Choice` of specs by one key (``checkin noise=``,
``secagg-dpsgd mechanism=``), or a :class:`~fedpriv.accounting.core.cli_runner.FunctionAnalysis`
(the G_μ analyses, which are no spec). The answer is a JSON-able dict that always has
``"epsilon"`` and ``"delta"``. Bad input exits with status 2 and ONE line on stderr naming the
key and the value; a refused combination (``NotImplementedError``) too.

Every analysis takes ``lower_bound=true``: the answer then has ``epsilon_lower_bound``, a
lower bound on the ε of the same mechanism (a number <= ``epsilon``, or a sentence saying why
none is available for that analysis; docs/accounting.md lists each).

A reader that closes the pipe early (``fedpriv-account ... | head -1``) ends the command
quietly with exit status 141 (128 + SIGPIPE, what a shell reports for a process that SIGPIPE
ended), as the Python documentation recommends (the ``signal`` module's note on SIGPIPE):
stdout is redirected to ``os.devnull`` so that the interpreter's final flush writes nothing.

Examples
--------
::

    fedpriv-account poisson-gaussian noise_multiplier=1.1 sample_rate=0.01 steps=10000 \
        target_delta=1e-5
    fedpriv-account poisson-gaussian target_epsilon=3 sample_rate=0.01 steps=10000 \
        target_delta=1e-5 --json
    fedpriv-account client-level noise_multiplier=1 num_clients=6000 \
        client_sampling=poisson client_sample_rate=0.02 num_rounds=500 target_delta=1e-5
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from fedpriv.accounting.core import cli_runner
from fedpriv.accounting.core.params import parse_assignments
from fedpriv.common.errors import ConfigError

#: ANALYSIS name -> "module:attribute": a spec class, a Choice of specs, or a FunctionAnalysis.
ANALYSES: dict[str, str] = {
    "gaussian": "fedpriv.accounting.accountants.gdp_cli:GAUSSIAN",
    "gdp": "fedpriv.accounting.accountants.gdp_cli:GDP",
    "poisson-gaussian": "fedpriv.accounting.dpsgd:DPSGDSpec",
    "batch-clipping": "fedpriv.accounting.batch_clipping.spec:BatchClippingSpec",
    "checkin": "fedpriv.accounting.checkin.spec:ANALYSIS",
    "skellam": "fedpriv.accounting.skellam:SkellamSpec",
    "secagg-dpsgd": "fedpriv.accounting.secagg.spec:ANALYSIS",
    "client-level": "fedpriv.accounting.client_level.spec:ClientLevelSpec",
    "ftrl": "fedpriv.accounting.ftrl.spec:FTRLSpec",
}

USAGE = (
    "usage: fedpriv-account ANALYSIS key=value ... [--json]   (ANALYSIS --help: its keys)\n"
    "analyses: " + ", ".join(ANALYSES) + "\n"
    "Give target_epsilon instead of the noise parameter to calibrate it."
)


def load_analysis(name: str) -> Any:
    """Import the entry registered for ``name``.

    Raises
    ------
    ConfigError
        For an unknown analysis, or one whose module is not installed yet.
    """
    if name not in ANALYSES:
        raise ConfigError("analysis", name, "must be one of: " + ", ".join(ANALYSES))
    module_name, _, attr = ANALYSES[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise ConfigError(
            "analysis", name, f"is not available (module {module_name} missing)"
        ) from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise ConfigError("analysis", name, f"is not available ({module_name}.{attr} missing)")
    return obj


def analysis_help(name: str, params: Mapping[str, Any] | None = None) -> str:
    """``fedpriv-account ANALYSIS [key=value ...] --help``: what it answers and its keys, each
    with its type, default and meaning (a key choosing the spec, e.g. ``noise=``, picks whose).

    Raises
    ------
    ConfigError
        For an unknown analysis.
    """
    return cli_runner.help_text(name, load_analysis(name), params)


def run(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Run analysis ``name`` on ``params`` (strings or numbers); the result dict (Python API
    of the CLI).

    Raises
    ------
    ConfigError
        One line naming the key and the value.
    """
    result = cli_runner.answer(name, load_analysis(name), params)
    if "epsilon" not in result or "delta" not in result:
        raise RuntimeError(f"analysis {name} returned no epsilon/delta")
    return result


def _jsonable(v: Any) -> Any:
    """inf/nan are not JSON: write them as the strings "inf", "-inf", "nan"."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        return _jsonable(v.item())
    return v


def format_summary(result: dict[str, Any]) -> str:
    """Readable multi-line summary: the (ε, δ) line first, then the details."""
    name = result.get("analysis", "")
    lines = [f"{name}: epsilon = {result['epsilon']:.6g} at delta = {result['delta']:.3g}"]
    if "local_epsilon" in result:
        lines.append(f"  local (per-client) epsilon = {result['local_epsilon']:.6g}")
    if "calibrated" in result:
        key = result["calibrated"]
        lines.append(
            f"  calibrated {key} = {result[key]:.6g} "
            f"for target_epsilon = {result['target_epsilon']:g}"
        )
    bound = result.get("epsilon_lower_bound")
    if isinstance(bound, (int, float)) and 0 < result["epsilon"] < math.inf:
        lines.append(f"  lower bound / epsilon = {bound / result['epsilon']:.4g}")
    skip = {"analysis", "epsilon", "delta", "local_epsilon", "calibrated"}
    for key, value in result.items():
        if key in skip:
            continue
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        if len(text) > 200:
            text = text[:197] + "..."
        lines.append(f"  {key} = {text}")
    return "\n".join(lines)


#: Exit status when the reader closes stdout early: 128 + SIGPIPE (13), as a shell reports.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 ok, 2 bad arguments, 141 when the
    reader of stdout closed it early, e.g. ``| head -1``: no traceback, nothing on stderr)."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here when the output was buffered
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return EXIT_BROKEN_PIPE
    return status


def _main(argv: Sequence[str] | None) -> int:
    """:func:`main` without the broken-pipe handling."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if any(a in ("-h", "--help") for a in args[1:]):
        try:
            given = [a for a in args[1:] if "=" in a and not a.startswith("-")]
            print(analysis_help(args[0], parse_assignments(given)))
        except ConfigError as err:
            print(f"fedpriv-account: error: {err}", file=sys.stderr)
            return 2
        return 0
    as_json = "--json" in args
    args = [a for a in args if a != "--json"]
    if not args:
        print(
            "fedpriv-account: error: no ANALYSIS given (see fedpriv-account --help)",
            file=sys.stderr,
        )
        return 2
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)  # dp-accounting's order warnings
    except ImportError:  # pragma: no cover
        pass
    try:
        flags = [a for a in args[1:] if a.startswith("-")]
        if flags:
            raise ConfigError("option", flags[0], "is unknown (only --json)")
        result = run(args[0], parse_assignments(args[1:]))
    except (ConfigError, NotImplementedError) as err:
        print(f"fedpriv-account: error: {err}", file=sys.stderr)
        return 2
    except (ArithmeticError, ValueError) as err:  # e.g. noise_multiplier=1e300 or 1e-300
        print(
            f"fedpriv-account: error: these values are outside what {args[0]} can compute in "
            f"double precision ({type(err).__name__}: {err}); use a realistic range",
            file=sys.stderr,
        )
        return 2
    if as_json:
        print(json.dumps(_jsonable(result), allow_nan=False))
    else:
        print(format_summary(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
