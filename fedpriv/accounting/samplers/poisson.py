"""Poisson subsampling as an amplification operator on any RDP curve (integer orders).

Each record enters the batch independently with probability ``q``; the mechanism runs on the
batch. Given the RDP curve ``ε(j)`` of the unsampled mechanism at the integer orders
``j = 2..α``, :func:`poisson_subsampled_rdp` returns an RDP curve of the subsampled one. It is
applied to the Skellam mechanism
(:class:`~fedpriv.accounting.loss_models.skellam.SkellamEvent`) and the discrete Gaussian
(:class:`~fedpriv.accounting.loss_models.discrete_gaussian.DiscreteGaussianEvent`); the
continuous Gaussian's Poisson subsampling is dp-accounting's ``PoissonSampledDpEvent``
(:func:`fedpriv.accounting.dpsgd.poisson_gaussian_event`).

References
----------
Steinke (2022), "Composition of Differential Privacy & Privacy Amplification by Subsampling",
arXiv:2210.00597 (RDP of Poisson subsampling, integer orders, add/remove); Mironov, Talwar,
Zhang (2019), "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
arXiv:1908.10530 (the same expansion, exact for the Gaussian); Zhu, Wang (2019), "Poisson
Subsampled Rényi Differential Privacy", ICML (a general bound with a factor 3 on the terms
j >= 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import special

from fedpriv.common.errors import ConfigError, check

__all__ = ["integer_orders", "poisson_subsampled_rdp"]


def integer_orders(orders: np.ndarray) -> np.ndarray:
    """``orders`` as floats, refused unless every one is an integer >= 2.

    Raises
    ------
    ConfigError
        Naming ``orders``, for an empty array or a non-integer or < 2 order.
    """
    orders = np.asarray(orders, dtype=float)
    if orders.size == 0 or np.any(orders < 2) or np.any(orders != np.round(orders)):
        raise ConfigError("orders", orders.tolist(), "must be integers >= 2 (Skellam/Steinke RDP)")
    return orders


def poisson_subsampled_rdp(
    orders: np.ndarray, sample_rate: float, base_rdp: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """RDP of a mechanism run on a Poisson subsample (rate q), add/remove, integer α.

    ``ε'(α) = 1/(α−1) ln[(1−q)^{α−1}(1+(α−1)q) + Σ_{j=2..α} C(α,j)(1−q)^{α−j} q^j e^{(j−1)ε(j)}]``
    (Steinke 2022, arXiv:2210.00597, RDP of Poisson subsampling at integer orders; for the
    Gaussian, ``ε(j) = j/(2σ²)``, it is the exact integer-order formula of Mironov, Talwar,
    Zhang 2019, arXiv:1908.10530), and never more than the unsampled ``ε(α)`` (the subsampled
    pair is a mixture of the base pairs: joint quasi-convexity of the Rényi divergence).

    Hypotheses:

    * the add/remove relation (a record is in the dataset or not), not replace-one;
    * ``base_rdp(j)`` bounds the divergence of the base mechanism in BOTH orders,
      ``D_j(M(D)‖M(D'))`` and ``D_j(M(D')‖M(D))``, for every neighbouring pair and every
      integer ``j`` in ``2..max(orders)``: the remove and the add direction of the subsampled
      pair each expand into the base pair in one order;
    * integer orders (checked here: :func:`integer_orders`).

    The second hypothesis cannot be checked on a callable; each caller states why it holds:
    :class:`~fedpriv.accounting.loss_models.skellam.SkellamEvent` (symmetric noise ``Sk(μ)``:
    the reflection ``x ↦ Δ − x`` swaps the pair, so one curve bounds both orders; checked
    numerically in both directions by
    ``tests/test_accounting_skellam.py::test_skellam_bound_dominates_exact_1d_divergence``) and
    :class:`~fedpriv.accounting.loss_models.discrete_gaussian.DiscreteGaussianEvent` (Canonne,
    Kamath, Steinke arXiv:2004.00010 Thm 4 is symmetric in the two means).

    Parameters
    ----------
    orders : array of int, shape (k,)
        Integer orders α >= 2.
    sample_rate : float
        q in [0, 1].
    base_rdp : callable
        Integer orders (array) -> RDP ε(j) of the unsampled mechanism (same shape).

    Returns
    -------
    np.ndarray, shape (k,)

    Raises
    ------
    ConfigError
        For non-integer orders or q outside [0, 1].
    """
    a = integer_orders(orders)
    check(0 <= sample_rate <= 1, "sample_rate", sample_rate, "must be in [0, 1]")
    base = np.asarray(base_rdp(a), dtype=float)
    if sample_rate == 1:
        return base
    if sample_rate == 0:
        return np.zeros_like(a)
    q = float(sample_rate)
    j = np.arange(2, int(a.max()) + 1, dtype=float)
    eps_j = np.asarray(base_rdp(j), dtype=float)
    A = a[:, None]
    J = j[None, :]
    with np.errstate(invalid="ignore", over="ignore"):
        log_terms = (
            special.gammaln(A + 1)
            - special.gammaln(J + 1)
            - special.gammaln(A - J + 1)
            + (A - J) * math.log1p(-q)
            + J * math.log(q)
            + (J - 1) * eps_j[None, :]
        )
    log_terms = np.where(J <= A, log_terms, -np.inf)
    log0 = (a - 1) * math.log1p(-q) + np.log1p((a - 1) * q)
    total = special.logsumexp(np.concatenate([log0[:, None], log_terms], axis=1), axis=1)
    return np.asarray(np.minimum(total / (a - 1), base), dtype=float)
