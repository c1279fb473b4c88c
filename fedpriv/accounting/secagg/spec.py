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

import dataclasses
import math
from typing import Any

from fedpriv.accounting.core.cli_runner import Choice, SpecCli
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.core.params import CliKeys, Key
from fedpriv.accounting.core.vocabulary import ACCOUNTANTS, CONVERSIONS, Accountant, Conversion
from fedpriv.accounting.dpsgd import DPSGDSpec, poisson_gaussian_event
from fedpriv.accounting.skellam import MECHANISM_FIELDS, SkellamSpec
from fedpriv.common.errors import ConfigError, check

MECHANISMS = ("gaussian", "skellam")
#: :func:`secagg_dpsgd`'s Skellam keyword arguments (the run's :class:`SkellamSpec` fields).
SKELLAM_KEYS = ("max_grad_norm", *MECHANISM_FIELDS)


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


def _client_noise(values: dict[str, Any]) -> dict[str, Any]:
    """``client_noise_multiplier`` σ_i given: σ of the sum is σ_i √m (m = N, N − 1 with
    ``honest_but_curious``; Theorem 4.7)."""
    sigma_i = values.get("client_noise_multiplier")
    if sigma_i is None:
        return {}
    return {
        "noise_multiplier": sigma_i
        * math.sqrt(_noise_clients(values["num_clients"], values["honest_but_curious"]))
    }


def _report(spec: DPSGDSpec | SkellamSpec, num_rounds: int) -> dict[str, Any]:
    """Each client's σ_i, the noise shares, the composed steps; Skellam: μ of the sum and of
    one client's share."""
    out: dict[str, Any] = {
        "local_delta": spec.target_delta,
        "client_noise_multiplier": spec.client_noise_multiplier,
        "noise_clients": spec.noise_shares,
        "total_steps": spec.steps * num_rounds,
    }
    if isinstance(spec, SkellamSpec):
        out.update(mu_total=spec.mechanism.mu, mu_local=spec.mechanism.mu_per_client)
    return out


#: ``client_noise_multiplier``: each client's own σ_i instead of σ of the sum.
CLIENT_NOISE = Key(
    name="client_noise_multiplier",
    kind=float,
    default=None,
    limits={"gt": 0.0},
    doc="each client's own sigma_i = sigma / sqrt(m) (instead of noise_multiplier)",
)
#: The answer's entries of the spec's summary (both mechanisms).
SUMMARY = (
    "mechanism",
    "noise_multiplier",
    "num_clients",
    "honest_but_curious",
    "sample_rate",
    "steps",
    "accountant",
    "conversion",
)
#: ``fedpriv-account secagg-dpsgd``: the run's spec with the clients whose noise is summed.
_SECAGG = CliKeys(
    doc="secure aggregation of N clients' local DP-SGD with S local steps: central epsilon "
    "(sum-dominating mechanism, Thm 4.6) and one client's local_epsilon (Thm 4.7)",
    takes=("steps", "num_clients"),
    required=("num_clients",),
    limits={"noise_multiplier": {"gt": 0.0}},
    hide=("max_grad_norm",),
    extra=(CLIENT_NOISE,),
    noise_aliases=("client_noise_multiplier",),
    derive=_client_noise,
    local_epsilon=True,
    summary=SUMMARY,
    report=_report,
)
GAUSSIAN = SpecCli(DPSGDSpec, _SECAGG)
SKELLAM = SpecCli(
    SkellamSpec,
    dataclasses.replace(
        _SECAGG,
        takes=("steps", "num_clients", *MECHANISM_FIELDS),
        required=("num_clients", "num_params"),
        hide=(),
        summary=(
            *SUMMARY,
            "scale",
            "bits",
            "beta",
            "local_samples",
            "l1_sensitivity",
            "l2_sensitivity",
        ),
    ),
)
#: The registry's ``secagg-dpsgd``: the spec of the ``mechanism``.
ANALYSIS = Choice(
    "mechanism",
    {"gaussian": f"{__name__}:GAUSSIAN", "skellam": f"{__name__}:SKELLAM"},
    "gaussian",
    doc="secagg-dpsgd mechanism=gaussian|skellam (sigma of the sum, each client's share)",
)
