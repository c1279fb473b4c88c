"""A Gaussian mechanism whose sensitivity is random and revealed: the mixture of ``G_μ``.

A run whose privacy loss, given a random outcome ``c`` of its sampler, is exactly the Gaussian
``G_{c/σ}`` (Dong, Roth, Su, arXiv:1905.02383: Gaussian rounds compose to
``G_{√(Σ k²)/σ}``, Cor. 3.3), where the adversary may learn ``c``, is dominated by the pair
``(c, M_c(D))`` / ``(c, M_c(D'))``. When the law ``q`` of ``c`` is the same under both
datasets, its privacy profile is the mixture ``δ(ε) = Σ_t q(t) δ_{G_{√t/σ}}(ε)`` with
``t = c²`` (:func:`fedpriv.accounting.accountants.gdp.mixture_delta`). Generalized DP-SGD with
batch clipping (:mod:`fedpriv.accounting.batch_clipping.spec`) is this case, with ``q`` the law
of :mod:`fedpriv.accounting.samplers.batch_groups`.

References
----------
van Dijk, Nguyen, Nguyen, Phan, "Generalizing DP-SGD with Shuffling and Batch Clipping"
(arXiv:2212.05796), Section 5 (q_E(c), Lemma B.1, Theorems 5.5 / 5.6, eq. (6)); Dong, Roth,
Su, "Gaussian Differential Privacy" (arXiv:1905.02383).
"""

from __future__ import annotations

import math

import numpy as np

from fedpriv.accounting.accountants import gdp
from fedpriv.accounting.samplers.batch_groups import SumSquaresLaw
from fedpriv.common.errors import check

__all__ = [
    "batch_clipping_delta",
    "batch_clipping_epsilon",
    "check_noise_multiplier",
    "worst_case_mu",
]


def check_noise_multiplier(noise_multiplier: float) -> float:
    """``noise_multiplier`` as a float, refused unless finite and >= 0.

    Raises
    ------
    ConfigError
        Naming ``noise_multiplier``.
    """
    sigma = float(noise_multiplier)
    check(
        math.isfinite(sigma) and sigma >= 0.0,
        "noise_multiplier",
        noise_multiplier,
        "must be a finite number >= 0",
    )
    return sigma


def _mixture(law: SumSquaresLaw, noise_multiplier: float) -> tuple[np.ndarray, np.ndarray]:
    t, p = law.components()
    if noise_multiplier == 0.0:
        mus = np.where(t > 0, np.inf, 0.0)
    else:
        mus = np.sqrt(t) / noise_multiplier
    return mus, p


def batch_clipping_epsilon(
    law: SumSquaresLaw, noise_multiplier: float, target_delta: float
) -> float:
    """Smallest epsilon with ``sum_t q(t) delta_{G_{sqrt(t)/sigma}}(epsilon) <= target_delta``.

    Hypotheses (van Dijk et al., arXiv:2212.05796, Lemma B.1): the replace-one relation,
    applied ``g`` times for groups; a round whose differing records fall into ``k`` groups
    moves the released sum by at most ``2kC`` under noise ``N(0, (2Cσ)²)``, i.e. it is
    ``G_{k/σ}``, and the rounds compose to ``G_{c/σ}`` (Dong, Roth, Su, arXiv:1905.02383,
    Corollary 3.3); ``law`` is the law of ``t = c²``, the same under both datasets (the
    sampler ignores the data), and revealing ``c`` only helps the adversary.

    Raises
    ------
    ConfigError
        If ``noise_multiplier < 0`` or ``target_delta`` not in (0, 1).

    References
    ----------
    van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping"
    (arXiv:2212.05796), Lemma B.1 and eq. (6).
    """
    mus, p = _mixture(law, check_noise_multiplier(noise_multiplier))
    return gdp.mixture_epsilon(target_delta, mus, p)


def batch_clipping_delta(
    law: SumSquaresLaw, noise_multiplier: float, target_epsilon: float
) -> float:
    """``delta(eps) = sum_t q(t) delta_{G_{sqrt(t)/sigma}}(eps)`` (exact mixture profile).

    van Dijk et al., arXiv:2212.05796, Lemma B.1 and eq. (6); hypotheses as
    :func:`batch_clipping_epsilon` (replace-one relation, ``G_{k/σ}`` rounds, a law ``q`` of
    ``c²`` that does not depend on the data).

    Raises
    ------
    ConfigError
        If ``noise_multiplier < 0`` or ``target_epsilon < 0``.
    """
    mus, p = _mixture(law, check_noise_multiplier(noise_multiplier))
    return gdp.mixture_delta(target_epsilon, mus, p)


def worst_case_mu(law: SumSquaresLaw, noise_multiplier: float) -> float:
    """``sqrt(max t)/sigma``: the guarantee if every sampling outcome were the worst one.

    ``G_{√t_max/σ}`` is below every component of the mixture, so it bounds the run too (a
    looser bound, reported for comparison). Hypotheses: those of
    :func:`batch_clipping_epsilon` (replace-one relation; ``G_{k/σ}`` rounds composed by
    Dong, Roth, Su, arXiv:1905.02383, Corollary 3.3).
    """
    sigma = check_noise_multiplier(noise_multiplier)
    t_max = max(law.as_dict().keys())
    if t_max == 0:
        return 0.0
    return math.inf if sigma == 0 else math.sqrt(t_max) / sigma
