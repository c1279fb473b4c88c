"""Poisson-subsampled Gaussian mechanism (DP-SGD): the event and its ε.

One DP-SGD step with Poisson sampling at rate ``q``, per-sample clipping to ``C`` and noise
``N(0, (σC)²)`` on the sum is the event ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` of
dp-accounting (add/remove relation). It is accounted by dp-accounting's PLD accountant
(default) or RDP accountant; see :class:`fedpriv.accounting.ledger.PrivacyLedger` for the
conversions.

References
----------
Abadi et al. 2016 (DP-SGD); Mironov, Talwar, Zhang 2019 (RDP of the sampled Gaussian);
Doroshenko et al. 2022 (connect-the-dots PLD); Mironov 2017, Prop. 3 (RDP conversion).
"""

from __future__ import annotations

import math
from typing import Any

from dp_accounting import dp_event

from fedpriv.accounting.ledger import ACCOUNTANTS, CONVERSIONS, PrivacyLedger
from fedpriv.accounting.params import Params
from fedpriv.errors import check

SAMPLING_REFUSAL = (
    "is not covered: the Poisson analysis under-reports epsilon for shuffled or fixed-size "
    "batches; use sampling=poisson or the batch-clipping analysis"
)
KEYS = (
    "noise_multiplier",
    "target_epsilon",
    "sample_rate",
    "steps",
    "target_delta",
    "accountant",
    "conversion",
    "sampling",
)


def poisson_gaussian_event(
    noise_multiplier: float, sample_rate: float, *, sampling: str = "poisson"
) -> dp_event.DpEvent:
    """The dp-accounting event of one Poisson-subsampled Gaussian step.

    Parameters
    ----------
    noise_multiplier : float
        σ: noise std divided by the clipping norm (sensitivity); ``>= 0`` (0 = no privacy).
    sample_rate : float
        q: probability that each record is in the batch, in ``[0, 1]``.
    sampling : str
        How batches are drawn; only ``"poisson"`` is covered by this analysis.

    Returns
    -------
    DpEvent
        ``GaussianDpEvent(σ)`` when ``q == 1``, else ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``.

    Raises
    ------
    ConfigError
        If σ is negative or not finite, q is outside [0, 1], or ``sampling`` is not
        ``"poisson"`` (shuffled or fixed-size batches accounted as Poisson under-report ε;
        use the batch-clipping analysis for those).
    """
    check(sampling == "poisson", "sampling", sampling, SAMPLING_REFUSAL)
    check(
        isinstance(noise_multiplier, (int, float))
        and math.isfinite(noise_multiplier)
        and noise_multiplier >= 0,
        "noise_multiplier",
        noise_multiplier,
        "must be a finite number >= 0",
    )
    check(
        isinstance(sample_rate, (int, float)) and 0 <= sample_rate <= 1,
        "sample_rate",
        sample_rate,
        "must be in [0, 1]",
    )
    gaussian = dp_event.GaussianDpEvent(float(noise_multiplier))
    if sample_rate == 1:
        return gaussian
    return dp_event.PoissonSampledDpEvent(float(sample_rate), gaussian)


def poisson_gaussian_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    accountant: str = "pld",
    conversion: str = "default",
) -> float:
    """ε of ``steps`` composed Poisson-subsampled Gaussian steps at ``target_delta``.

    Raises
    ------
    ConfigError
        For out-of-range arguments (see :func:`poisson_gaussian_event` and the ledger).
    """
    check(isinstance(steps, int) and steps >= 0, "steps", steps, "must be an integer >= 0")
    ledger = PrivacyLedger(accountant=accountant, conversion=conversion)
    if steps > 0:
        ledger.record(poisson_gaussian_event(noise_multiplier, sample_rate), steps)
    else:
        poisson_gaussian_event(noise_multiplier, sample_rate)  # validate anyway
    return ledger.get_epsilon(target_delta)


def run_cli(params: dict[str, str]) -> dict[str, Any]:
    """``fedpriv-account poisson-gaussian``: keys noise_multiplier | target_epsilon,
    sample_rate, steps, target_delta, accountant=pld|rdp, conversion=default|mironov."""
    from fedpriv.accounting.calibrate import calibrate_noise_multiplier

    p = Params(params, "poisson-gaussian", KEYS)
    sampling = p.str("sampling", "poisson")
    check(sampling == "poisson", "sampling", sampling, SAMPLING_REFUSAL)
    given = p.exclusive("noise_multiplier", "target_epsilon")
    sample_rate = p.float("sample_rate", ge=0.0, le=1.0)
    steps = p.int("steps", ge=1)
    delta = p.delta("target_delta")
    accountant = p.choice("accountant", ACCOUNTANTS, "pld")
    conversion = p.choice("conversion", CONVERSIONS, "default")
    out: dict[str, Any] = {"analysis": "poisson-gaussian"}
    if given == "target_epsilon":
        target = p.float("target_epsilon", gt=0.0)
        p.finish()
        sigma = calibrate_noise_multiplier(
            target, delta, sample_rate, steps, accountant, conversion
        )
        out.update(calibrated="noise_multiplier", target_epsilon=target)
    else:
        sigma = p.float("noise_multiplier", ge=0.0)
        p.finish()
    eps = poisson_gaussian_epsilon(sigma, sample_rate, steps, delta, accountant, conversion)
    out.update(
        epsilon=eps,
        delta=delta,
        noise_multiplier=sigma,
        sample_rate=sample_rate,
        steps=steps,
        accountant=accountant,
        conversion=conversion,
        neighboring_relation="add_remove",
    )
    return out
