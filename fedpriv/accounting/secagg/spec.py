"""Secure aggregation with S local DP-SGD steps: central and local ε (third paper).

N clients each run ``steps`` local DP-SGD steps per round (Poisson rate q, clipping C, own noise
σ_i·C per step) and a trusted aggregator reveals only the sum of their updates. With infinitely
divisible noise the per-step sums are dominated by one mechanism of the same family with the
summed noise (Theorem 4.6, "sum-dominating"): Gaussian ``σ = σ_i √N``, Skellam
``μ_total = N μ_i``. It is composed over ``steps × num_rounds`` subsampled steps
(sample-level DP on the union of the clients' data). Each client alone gets only its local
(LDP) guarantee from its own noise σ_i (Theorem 4.7: σ_LDP = σ/√N); both are reported.
If clients are honest-but-curious, one of them can subtract its own noise, so only the other
N−1 clients' noise counts.

One name, one meaning, as in a run: ``noise_multiplier`` is σ, the std of the SUMMED noise of
the trusted clients per unit of clipping norm (a run's ``privacy.noise_multiplier``);
``client_noise_multiplier`` is each client's own σ_i = σ/√N (σ/√(N−1) with
``honest_but_curious``). Give one of them; the result states both.

Assumptions (refused or stated, never silently relaxed): every one of the ``num_clients``
clients adds its noise in every round (with client sampling pass the minimum number of
clients per round); all clients use the same σ_i, q and C.

References
----------
Heikkilä, "On Using Secure Aggregation in Differentially Private Federated Learning with
Multiple Local Steps" (arXiv:2407.19286), Theorems 4.6 and 4.7, Appendix A.5, Table 1.
"""

from __future__ import annotations

import math
from typing import Any

from fedpriv.accounting.core.ledger import ACCOUNTANTS, CONVERSIONS, PrivacyLedger
from fedpriv.accounting.core.lower_bound import epsilon_lower_bound
from fedpriv.accounting.core.lower_report import (
    LOWER_BOUND_KEY,
    lower_bound_entry,
    wants_lower_bound,
)
from fedpriv.accounting.core.params import Params
from fedpriv.accounting.core.vocabulary import Accountant, Conversion
from fedpriv.accounting.dpsgd import poisson_gaussian_event
from fedpriv.accounting.secagg.lower import LocalStepsGaussianRound
from fedpriv.accounting.skellam import NO_LOWER_BOUND as SKELLAM_NO_LOWER_BOUND
from fedpriv.accounting.skellam import SKELLAM_KEYS, SkellamSpec
from fedpriv.common.errors import ConfigError, check

MECHANISMS = ("gaussian", "skellam")


def _noise_clients(num_clients: int, honest_but_curious: bool) -> int:
    check(
        isinstance(num_clients, int) and num_clients >= 1,
        "num_clients",
        num_clients,
        "must be an integer >= 1",
    )
    if honest_but_curious:
        check(
            num_clients >= 2,
            "num_clients",
            num_clients,
            "must be >= 2 when honest_but_curious=true",
        )
        return num_clients - 1
    return num_clients


def _skellam_spec(
    sigma_total: float,
    sample_rate: float,
    num_clients: int,
    steps: int,
    honest_but_curious: bool,
    conversion: str,
    target_delta: float,
    kwargs: dict[str, Any],
) -> SkellamSpec:
    for key, value in kwargs.items():
        check(
            key in SKELLAM_KEYS,
            key,
            value,
            "is not a Skellam option; known: " + ", ".join(SKELLAM_KEYS),
        )
    check("num_params" in kwargs, "num_params", None, "is required for mechanism='skellam'")
    given = {k: v for k, v in kwargs.items() if v is not None}
    return SkellamSpec(
        noise_multiplier=sigma_total,
        sample_rate=sample_rate,
        steps=steps,
        num_clients=num_clients,
        honest_but_curious=honest_but_curious,
        accountant=Accountant.RDP,
        conversion=Conversion(conversion),
        target_delta=target_delta,
        **given,
    )


def secagg_dpsgd(
    mechanism: str,
    noise_multiplier: float | None,
    num_clients: int,
    sample_rate: float,
    steps: int,
    num_rounds: int,
    target_delta: float,
    honest_but_curious: bool = False,
    accountant: str = "pld",
    conversion: str = "default",
    *,
    client_noise_multiplier: float | None = None,
    **skellam_kwargs: Any,
) -> dict[str, Any]:
    """Central and local ε of DP-SGD with S local steps under secure aggregation.

    Give the noise as exactly one of ``noise_multiplier`` (σ of the sum, a run's
    ``privacy.noise_multiplier``) or ``client_noise_multiplier`` (each client's σ_i; pass
    ``None`` as ``noise_multiplier``).

    Parameters
    ----------
    mechanism : {"gaussian", "skellam"}
        Noise family; Skellam is accounted by RDP only (pass ``accountant="rdp"``).
    noise_multiplier : float or None
        σ: std of the summed noise of the ``noise_clients`` trusted clients per unit clipping
        norm, > 0, the same meaning as a run's ``privacy.noise_multiplier`` (each client adds
        σ/√noise_clients). ``None`` when ``client_noise_multiplier`` is given.
    num_clients : int
        N clients whose noise is summed in every round.
    sample_rate : float
        Each client's Poisson sampling rate q of its own data.
    steps : int
        Local steps S per round.
    num_rounds : int
        Rounds; the total is ``steps * num_rounds`` composed steps.
    target_delta : float
        δ in (0, 1).
    honest_but_curious : bool
        Count only N−1 clients' noise (one client may remove its own).
    accountant, conversion : str
        As in :class:`~fedpriv.accounting.core.ledger.PrivacyLedger`.
    client_noise_multiplier : float or None, keyword-only
        σ_i: each client's own noise std per unit clipping norm, > 0; then
        σ = σ_i √noise_clients. Exclusive with ``noise_multiplier``.
    **skellam_kwargs
        For Skellam: ``num_params`` (required), ``max_grad_norm``, ``bits``, ``scale``,
        ``beta``, ``rotation``, ``dropout_tolerance``, ``local_samples`` (see
        :class:`~fedpriv.accounting.skellam.SkellamSpec`, the run's own spec, whose
        ``noise_multiplier`` is the same σ of the sum).

    Returns
    -------
    dict
        ``epsilon`` (central, sample-level, on the sum), ``delta``, ``local_epsilon`` (one
        client's LDP ε from its own noise), ``noise_multiplier`` (σ of the sum),
        ``client_noise_multiplier`` (σ_i), ``noise_clients``, ``total_steps`` and the inputs;
        for Skellam also ``mu_total``, ``mu_local``, ``scale``.

    Raises
    ------
    ConfigError
        For out-of-range arguments, both or neither of the two noise parameters, or an
        unsupported mechanism/accountant combination.

    References
    ----------
    Heikkilä, "On Using Secure Aggregation in Differentially Private Federated Learning with
    Multiple Local Steps" (arXiv:2407.19286), Theorem 4.6 (sum-dominating mechanism) and
    Theorem 4.7 (local DP of one client's noise).
    """
    check(mechanism in MECHANISMS, "mechanism", mechanism, "must be one of: gaussian, skellam")
    check(accountant in ACCOUNTANTS, "accountant", accountant, "must be one of: pld, rdp")
    check(conversion in CONVERSIONS, "conversion", conversion, "must be one of: default, mironov")
    check(
        not (mechanism == "skellam" and accountant != "rdp"),
        "accountant",
        accountant,
        "must be 'rdp' for mechanism='skellam' (its analysis is an RDP bound)",
    )
    given_name, given_sigma = _given_noise(noise_multiplier, client_noise_multiplier)
    check(isinstance(steps, int) and steps >= 1, "steps", steps, "must be an integer >= 1")
    check(
        isinstance(num_rounds, int) and num_rounds >= 1,
        "num_rounds",
        num_rounds,
        "must be an integer >= 1",
    )
    noise_clients = _noise_clients(num_clients, honest_but_curious)
    total_steps = steps * num_rounds
    if given_name == "noise_multiplier":
        sigma_total = float(given_sigma)
        sigma_client = sigma_total / math.sqrt(noise_clients)
    else:
        sigma_client = float(given_sigma)
        sigma_total = sigma_client * math.sqrt(noise_clients)
    spec = None
    if mechanism == "gaussian":
        if skellam_kwargs:
            key = next(iter(skellam_kwargs))
            raise ConfigError(key, skellam_kwargs[key], "applies only to mechanism='skellam'")
        central = poisson_gaussian_event(sigma_total, sample_rate)
        local = poisson_gaussian_event(sigma_client, sample_rate)
    else:
        spec = _skellam_spec(
            sigma_total,
            sample_rate,
            num_clients,
            steps,
            honest_but_curious,
            conversion,
            target_delta,
            skellam_kwargs,
        )
        # The run's mechanism (same scale rule); each client's own share at that scale.
        ((central, _),) = spec.round_events()
        ((local, _),) = spec.local_events()
    results = {}
    for name, event in (("epsilon", central), ("local_epsilon", local)):
        ledger = PrivacyLedger(accountant=accountant, conversion=conversion)
        ledger.record(event, total_steps)
        results[name] = ledger.get_epsilon(target_delta)
    out: dict[str, Any] = {
        "analysis": "secagg-dpsgd",
        "epsilon": results["epsilon"],
        "delta": target_delta,
        "local_epsilon": results["local_epsilon"],
        "local_delta": target_delta,
        "mechanism": mechanism,
        "noise_multiplier": sigma_total,
        "client_noise_multiplier": sigma_client,
        "num_clients": num_clients,
        "noise_clients": noise_clients,
        "honest_but_curious": honest_but_curious,
        "sample_rate": sample_rate,
        "steps": steps,
        "num_rounds": num_rounds,
        "total_steps": total_steps,
        "accountant": accountant,
        "conversion": conversion,
        "neighboring_relation": "add_remove",
    }
    if spec is not None:
        out.update(
            mu_total=central.mu,
            mu_local=local.mu,
            scale=spec.mechanism.scale,
            bits=spec.bits,
            beta=spec.beta,
            local_samples=spec.local_samples,
            l1_sensitivity=central.l1_sensitivity,
            l2_sensitivity=central.l2_sensitivity,
        )
    return out


def _given_noise(
    noise_multiplier: float | None, client_noise_multiplier: float | None
) -> tuple[str, float]:
    """``(name, value)`` of the one noise parameter given (σ of the sum or each client's σ_i).

    Raises
    ------
    ConfigError
        For both, neither, or a value that is not a finite number > 0.
    """
    if noise_multiplier is not None and client_noise_multiplier is None:
        name, value = "noise_multiplier", noise_multiplier
    elif client_noise_multiplier is not None and noise_multiplier is None:
        name, value = "client_noise_multiplier", client_noise_multiplier
    elif noise_multiplier is None:
        raise ConfigError(
            "noise_multiplier",
            None,
            "is required: σ of the sum (or client_noise_multiplier=, each client's σ_i)",
        )
    else:
        raise ConfigError(
            "client_noise_multiplier",
            client_noise_multiplier,
            f"cannot be combined with noise_multiplier={noise_multiplier!r} (σ of the sum);"
            " give one",
        )
    check(
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0,
        name,
        value,
        "must be a finite number > 0",
    )
    return name, float(value)


KEYS = (
    "mechanism",
    "noise_multiplier",
    "client_noise_multiplier",
    "target_epsilon",
    "num_clients",
    "sample_rate",
    "steps",
    "num_rounds",
    "target_delta",
    "honest_but_curious",
    "accountant",
    "conversion",
    LOWER_BOUND_KEY,
    *SKELLAM_KEYS,
)
#: What ``lower_bound=true`` answers for ``mechanism=gaussian``
#: (:mod:`fedpriv.accounting.secagg.lower`).
GAUSSIAN_LOWER_BOUND = (
    "optimistic PLD of the realised pair: a record with a constant gradient of norm C, the "
    "others 0, each round releasing its S local steps summed"
)


def run_cli(params: dict[str, str]) -> dict[str, Any]:
    """``fedpriv-account secagg-dpsgd``: mechanism, exactly one of noise_multiplier (σ of the
    SUM, as a run's ``privacy.noise_multiplier``) | client_noise_multiplier (each client's σ_i)
    | target_epsilon, num_clients, sample_rate, steps, num_rounds, target_delta,
    honest_but_curious [, accountant, conversion; Skellam: num_params, bits, max_grad_norm,
    scale, beta, rotation, dropout_tolerance, local_samples]. Calibration returns both σ and
    σ_i and names ``noise_multiplier`` (the run's setting) as the calibrated one.
    ``lower_bound=true`` adds ``epsilon_lower_bound`` (:func:`_lower_bound`)."""
    p = Params(params, "secagg-dpsgd", KEYS)
    lower = wants_lower_bound(p)
    out = _run(p)
    if lower:
        out.update(_lower_bound(out))
    return out


def _lower_bound(out: dict[str, Any]) -> dict[str, Any]:
    """``epsilon_lower_bound`` of the answer ``out`` at its δ.

    ``mechanism=gaussian``: the realised pair of
    :class:`~fedpriv.accounting.secagg.lower.LocalStepsGaussianRound` (hypotheses: a record
    whose loss is linear in the model, others with zero gradients, plain local SGD, so a
    round releases the sum of its S noisy steps; the noise σ the accountant uses, i.e. the
    honest-but-curious view when that is set), composed over the rounds with optimistic
    PLDs (Doroshenko et al. arXiv:2207.04380). ``mechanism=skellam``: not available
    (:data:`fedpriv.accounting.skellam.NO_LOWER_BOUND`).
    """
    if out["mechanism"] != "gaussian":
        return lower_bound_entry(None, SKELLAM_NO_LOWER_BOUND)
    if out["sample_rate"] == 0:
        return lower_bound_entry(0.0, "exact: sample_rate=0 releases nothing about a record")
    pair = LocalStepsGaussianRound(out["noise_multiplier"], out["sample_rate"], out["steps"])
    bound = epsilon_lower_bound([(pair, out["num_rounds"])], out["delta"])
    return lower_bound_entry(bound, GAUSSIAN_LOWER_BOUND)


def _run(p: Params) -> dict[str, Any]:
    """:func:`run_cli`'s answer without the lower bound."""
    from fedpriv.accounting.core.calibrate import bisect_noise

    mechanism = p.choice("mechanism", MECHANISMS, "gaussian")
    given = p.exclusive("noise_multiplier", "client_noise_multiplier", "target_epsilon")
    num_clients = p.int("num_clients", ge=1)
    kwargs: dict[str, Any] = dict(
        num_clients=num_clients,
        sample_rate=p.float("sample_rate", ge=0.0, le=1.0),
        steps=p.int("steps", ge=1),
        num_rounds=p.int("num_rounds", 1, ge=1),
        target_delta=p.delta("target_delta"),
        honest_but_curious=p.bool("honest_but_curious", False),
        accountant=p.choice("accountant", ACCOUNTANTS, "rdp" if mechanism == "skellam" else "pld"),
        conversion=p.choice("conversion", CONVERSIONS, "default"),
    )
    if mechanism == "gaussian":
        for key in SKELLAM_KEYS:
            check(not p.has(key), key, p.raw.get(key), "applies only to mechanism=skellam")
    if mechanism == "skellam":  # the run's spec reads the mechanism's keys (its defaults)
        kwargs.update(SkellamSpec.mechanism_keys(p))
    if given == "target_epsilon":
        target = p.float("target_epsilon", gt=0.0)
        p.finish()
        sigma = bisect_noise(lambda s: secagg_dpsgd(mechanism, s, **kwargs)["epsilon"], target)
        out = secagg_dpsgd(mechanism, sigma, **kwargs)
        out.update(calibrated="noise_multiplier", target_epsilon=target)
        return out
    if given == "client_noise_multiplier":
        sigma_i = p.float("client_noise_multiplier", gt=0.0)
        p.finish()
        return secagg_dpsgd(mechanism, None, client_noise_multiplier=sigma_i, **kwargs)
    sigma = p.float("noise_multiplier", gt=0.0)
    p.finish()
    return secagg_dpsgd(mechanism, sigma, **kwargs)
