"""``fedpriv-account gdp`` and ``fedpriv-account gaussian``: exact G_mu answers from a shell.

The command-line side of :mod:`fedpriv.accounting.accountants.gdp` (Dong, Roth, Su,
"Gaussian Differential Privacy", arXiv:1905.02383): kept apart so that the accountant does not
import the command-line runner (which imports the spec base, the ledger and so the accountants).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fedpriv.accounting.accountants.gdp import (
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    noise_for_mu,
)
from fedpriv.accounting.core.cli_runner import LOWER_BOUND, FunctionAnalysis
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import Key
from fedpriv.common.errors import ConfigError, check


def _targets(values: dict[str, Any], noise: str) -> tuple[float | None, float | None]:
    """``target_epsilon`` and ``target_delta`` (at least one); with the noise given, exactly
    one is the question (ε at δ, or δ at ε): both at once would silently ignore one.

    Raises
    ------
    ConfigError
        Neither target, or both with the noise given.
    """
    eps, delta = values["target_epsilon"], values["target_delta"]
    if delta is None and eps is None:
        raise ConfigError("target_delta", None, "is required (or give target_epsilon)")
    if values[noise] is not None and eps is not None and delta is not None:
        from fedpriv.accounting.core.cli_runner import BOTH_TARGETS

        raise ConfigError("target_epsilon", eps, BOTH_TARGETS)
    return eps, delta


#: Below this mu, delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) cancels to
#: nothing in double precision (a delta of 1e-17 would read as 0): refused, never answered.
MIN_RESOLVED_MU = 1e-8


def _check_resolved(mu: float, field: str, value: Any) -> None:
    check(
        mu == 0.0 or mu >= MIN_RESOLVED_MU,
        field,
        value,
        f"gives mu={mu:.3g} < {MIN_RESOLVED_MU:g}: delta is not resolvable in double precision "
        "(use a larger target_delta or less noise)",
    )


def _run_mu(mu: float | None, eps: float | None, delta: float | None) -> dict[str, Any]:
    """Answer for a G_mu mechanism: epsilon (given delta), delta (given epsilon) or mu."""
    if mu is not None:
        _check_resolved(mu, "mu", mu)
    if mu is None:
        if eps is None or delta is None:
            raise ConfigError(
                "target_epsilon", eps, "and target_delta are both needed to calibrate"
            )
        mu = gdp_mu(eps, delta)
        _check_resolved(mu, "target_delta", delta)
        return {
            "epsilon": eps,
            "delta": float(gdp_delta(eps, mu)),
            "mu": mu,
            "calibrated": "mu",
            "target_epsilon": eps,
        }
    if delta is not None:
        return {"epsilon": gdp_epsilon(delta, mu), "delta": delta, "mu": mu}
    assert eps is not None
    return {"epsilon": eps, "delta": float(gdp_delta(eps, mu)), "mu": mu}


#: What ``lower_bound=true`` answers for a G_mu mechanism.
#: The Gaussian mechanism IS G_mu: a record moving the release by its full sensitivity
#: realises the pair N(0, 1), N(mu, 1) (Dong, Roth, Su arXiv:1905.02383, Theorem 2.7,
#: Corollaries 2.13 and 3.3), so the lower bound equals epsilon.
EXACT_LOWER_BOUND = "exact: G_mu is attained by a record at full sensitivity (arXiv:1905.02383)"
#: The targets and the lower bound, keys of both analyses.
_COMMON = (
    Key(
        name="target_delta",
        default=None,
        limits={"gt": 0.0, "lt": 1.0},
        doc="delta: answer epsilon at it (with target_epsilon and no noise: calibrate)",
    ),
    Key(
        name="target_epsilon",
        default=None,
        limits={"ge": 0.0},
        doc="epsilon: answer delta at it, or with target_delta and no noise calibrate",
    ),
)


def _exact_lower_bound(out: dict[str, Any], lower: bool) -> dict[str, Any]:
    """``out`` with ``epsilon_lower_bound = epsilon`` when ``lower`` (a G_mu answer is exact:
    :data:`EXACT_LOWER_BOUND`)."""
    if lower:
        out.update(LowerBound(out["epsilon"], EXACT_LOWER_BOUND).entries())
    return out


def _gdp(values: dict[str, Any]) -> dict[str, Any]:
    """``gdp``: with ``mu`` and ``target_delta`` the exact epsilon; with ``mu`` and
    ``target_epsilon`` the exact delta; without ``mu`` but with both targets the largest mu
    that meets them (``"calibrated": "mu"``)."""
    eps, delta = _targets(values, "mu")
    out: dict[str, Any] = {"analysis": "gdp", **_run_mu(values["mu"], eps, delta)}
    return _exact_lower_bound(out, values["lower_bound"])


def _gaussian(values: dict[str, Any]) -> dict[str, Any]:
    """``gaussian``: ``steps`` compositions of the Gaussian mechanism with noise std
    ``noise_multiplier`` times the sensitivity form exactly ``G_mu``, ``mu =
    sqrt(steps)/noise_multiplier``; without ``noise_multiplier`` but with both targets the
    smallest noise multiplier that meets them (``"calibrated": "noise_multiplier"``)."""
    sigma, steps = values["noise_multiplier"], values["steps"]
    eps, delta = _targets(values, "noise_multiplier")
    if sigma is not None:
        res = _run_mu(math.inf if sigma == 0 else math.sqrt(steps) / sigma, eps, delta)
    else:
        res = _run_mu(None, eps, delta)
        assert eps is not None and delta is not None
        sigma = noise_for_mu(res["mu"], math.sqrt(steps), eps, delta)
        res["mu"] = math.sqrt(steps) / sigma
        res["delta"] = float(gdp_delta(eps, res["mu"]))
        res["calibrated"] = "noise_multiplier"
    out: dict[str, Any] = {"analysis": "gaussian", "noise_multiplier": sigma, "steps": steps}
    out.update(res)
    return _exact_lower_bound(out, values["lower_bound"])


def _analysis(keys: tuple[Key, ...], run: Callable[..., dict[str, Any]], doc: str) -> Any:
    return FunctionAnalysis((*keys, *_COMMON, LOWER_BOUND), run, doc)


#: ``fedpriv-account gdp``: a G_mu mechanism's exact (ε, δ), or the mu for both targets.
GDP = _analysis(
    (Key(name="mu", default=None, allow_inf=True, limits={"ge": 0.0}, doc="mu of G_mu"),),
    _gdp,
    "Gaussian DP: the exact epsilon(delta) or delta(epsilon) of G_mu (Dong, Roth, Su 2019)",
)
#: ``fedpriv-account gaussian``: ``steps`` Gaussian mechanisms, exactly G_mu.
GAUSSIAN = _analysis(
    (
        Key(
            name="noise_multiplier",
            default=None,
            allow_inf=True,
            limits={"ge": 0.0},
            doc="noise std per unit sensitivity",
        ),
        Key(name="steps", kind=int, default=1, limits={"ge": 1}, doc="compositions"),
    ),
    _gaussian,
    "the Gaussian mechanism composed `steps` times: exactly G_mu, mu = sqrt(steps)/sigma",
)
