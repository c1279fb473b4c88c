"""``privacy.secure_mode``'s lattice noise: its RDP accounting and what it costs against PLD.

In secure mode a spec with a ``lattice_noise`` field (batch clipping with Poisson batches,
central-Gaussian check-ins, client-level DP-FedAvg) releases a discrete Gaussian on the lattice
``γℤ^d`` (:mod:`fedpriv.mechanisms.lattice_gaussian`) instead of a float Gaussian, and is
accounted by RDP whatever ``privacy.accountant`` says: the PLD analyses (Poisson PLD, the
random-allocation PLD, the f-DP mixtures) are stated for the continuous Gaussian's privacy loss,
which the discrete Gaussian does not have.

The bound used: the discrete Gaussian of std ``σΔ`` on an integer-valued query of ℓ2
sensitivity ``Δ`` is ``ρ = 1/(2σ²)``-zCDP, i.e. RDP ``ε(α) = α/(2σ²)`` for every α > 1
(Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy",
arXiv:2004.00010, Theorem 4 (scalar) and Theorem 15 (vectors, independent coordinates);
hypothesis: the query's values lie on the lattice, here after rounding, which grows ``Δ`` to
``Δ(1 + 2^-20)``: :func:`~fedpriv.mechanisms.lattice_gaussian.lattice_noise_multiplier`).
The curve bounds BOTH ``D_α(M(D)‖M(D'))`` and ``D_α(M(D')‖M(D))`` (the mechanism is
symmetric: shifting by the difference of the two inputs swaps them), which is the hypothesis
of the Poisson-subsampled RDP bound for add/remove neighbours (Steinke 2022, "Composition of
Differential Privacy & Privacy Amplification by Subsampling", arXiv:2210.00597, its
Poisson-subsampling RDP theorem at integer orders;
:func:`fedpriv.accounting.samplers.poisson.poisson_subsampled_rdp`), used by
:class:`~fedpriv.accounting.loss_models.discrete_gaussian.DiscreteGaussianEvent`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.accounting.core.vocabulary import Accountant
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.skellam import SkellamSpec

__all__ = ["float_counterpart", "lattice_bound", "secure_accounting", "secure_accounting_line"]

S = TypeVar("S", bound=PrivacySpec)

#: The field a spec with lattice noise declares (a bool, bound by its client algorithm).
LATTICE_FIELD = "lattice_noise"
#: The bound that accounts lattice discrete Gaussian noise (module docstring).
LATTICE_BOUND = (
    "discrete Gaussian zCDP (CKS20 arXiv:2004.00010 Thm 4/15), Poisson-subsampled RDP "
    "(Steinke arXiv:2210.00597)"
)
#: The bound that accounts record-level DP-SGD's lattice twin (integer Skellam noise).
SKELLAM_BOUND = "Skellam RDP (Agarwal, Kairouz, Liu arXiv:2110.04995 Thm 3.5), Poisson-subsampled"


def has_lattice_noise(spec: PrivacySpec) -> bool:
    """Whether ``spec`` declares ``lattice_noise`` and it is set."""
    names = {f.name for f in dataclasses.fields(spec)}
    return LATTICE_FIELD in names and bool(getattr(spec, LATTICE_FIELD))


def lattice_bound(spec: S) -> S:
    """``spec`` with lattice noise, accounted by RDP (its conversion kept), validated again.

    Raises
    ------
    ConfigError
        When the spec cannot carry lattice noise (its own ``__post_init__`` says why).
    """
    changes: dict[str, Any] = {LATTICE_FIELD: True, "accountant": Accountant.RDP}
    return dataclasses.replace(spec, **changes)


def float_counterpart(spec: PrivacySpec) -> PrivacySpec | None:
    """The same release with float Gaussian noise at the same σ, accounted by PLD (the
    analysis a seeded run would use): the spec without its lattice noise, or for a secure
    Skellam run (``client=dpsgd``'s lattice twin) the :class:`DPSGDSpec` of the same local
    steps; ``None`` when ``spec`` draws float noise."""
    if has_lattice_noise(spec):
        changes: dict[str, Any] = {LATTICE_FIELD: False, "accountant": Accountant.PLD}
        return dataclasses.replace(spec, **changes)
    if isinstance(spec, SkellamSpec) and spec.secure_mode:
        shared = {f.name for f in dataclasses.fields(DPSGDSpec)} - {"accountant", "conversion"}
        return DPSGDSpec(**{n: getattr(spec, n) for n in shared if hasattr(spec, n)})
    return None


def secure_accounting(spec: PrivacySpec, num_rounds: int) -> dict[str, Any]:
    """For ``results.json``: how a lattice-noise run is accounted and what it costs.

    Returns
    -------
    dict
        ``{}`` without lattice noise; else ``secure_mode_accountant`` (``"rdp"``),
        ``secure_mode_bound`` (the theorem), ``epsilon_secure_planned`` (RDP ε after
        ``num_rounds`` rounds), ``epsilon_float_pld`` (the float Gaussian's PLD ε at the same
        σ and rounds) and ``epsilon_ratio`` (the first over the second, >= 1 up to the PLD's
        discretization).
    """
    float_spec = float_counterpart(spec)
    if float_spec is None:
        return {}
    secure, floating = spec.epsilon(num_rounds), float_spec.epsilon(num_rounds)
    return {
        "secure_mode_accountant": spec.accountant.value,
        "secure_mode_bound": SKELLAM_BOUND if isinstance(spec, SkellamSpec) else LATTICE_BOUND,
        "epsilon_secure_planned": secure,
        "epsilon_float_pld": floating,
        "epsilon_ratio": secure / floating if floating > 0 else float("inf"),
    }


def secure_accounting_line(facts: dict[str, Any], num_rounds: int) -> str:
    """The one line a run prints at its start for :func:`secure_accounting`'s ``facts``
    (``""`` when empty)."""
    if not facts:
        return ""
    return (
        "fedpriv: privacy.secure_mode=true: accounted by RDP "
        f"({facts['secure_mode_bound']}): ε={facts['epsilon_secure_planned']:.4g} after "
        f"{num_rounds} rounds, "
        f"{facts['epsilon_ratio']:.3f}x the float Gaussian's PLD ε="
        f"{facts['epsilon_float_pld']:.4g} at the same σ"
    )
