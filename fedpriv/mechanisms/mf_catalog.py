"""The catalogue of correlated-noise strategies a run can name (``privacy.factorization``).

:func:`make_factorization` builds the strategy for n rounds and a participation pattern:
optimised strategies (banded Toeplitz, BLT, dense) come from :mod:`mf_optimize`, cached on
disk under a hash of their inputs, and their optimisation time is printed.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from functools import lru_cache

from fedpriv.common.errors import check
from fedpriv.mechanisms import correlated_noise as cn
from fedpriv.mechanisms import mf_optimize as opt
from fedpriv.mechanisms.participation import Participation

#: The dense optimiser with several participations: at most this many rounds.
DENSE_MULTI_MAX_ROUNDS = 500


class FactorizationKind(StrEnum):
    """The strategies (closed set: each has an analytic sensitivity the run checks)."""

    IDENTITY = "identity"  # fresh noise each round: DP-FedAvg
    TREE_ONLINE = "tree_online"  # binary-tree aggregation, online estimator
    TREE_HONAKER = "tree_honaker"  # binary-tree aggregation, Honaker's efficient estimator
    BANDED = "banded"  # BandMF: banded Toeplitz, column-normalised, L-BFGS optimised
    BLT = "blt"  # buffered linear Toeplitz, optimised
    DENSE = "dense"  # the optimal dense factorization, n <= 2,000


@lru_cache(maxsize=16)
def make_factorization(
    kind: FactorizationKind,
    num_rounds: int,
    participation: Participation,
    bands: int,
    buffers: int,
) -> cn.Factorization:
    """The strategy ``kind`` for ``num_rounds`` rounds under ``participation`` (one per
    process and inputs: calibration builds many specs of the same strategy).

    Raises
    ------
    ConfigError
        For a strategy that cannot be built (e.g. dense beyond 2,000 rounds).
    """
    if kind is FactorizationKind.IDENTITY:
        return cn.IdentityFactorization()
    if kind in (FactorizationKind.TREE_ONLINE, FactorizationKind.TREE_HONAKER):
        est = cn.TreeEstimator.ONLINE
        if kind is FactorizationKind.TREE_HONAKER:
            est = cn.TreeEstimator.HONAKER
        return cn.TreeAggregation(estimator=est)
    if kind is FactorizationKind.BANDED:
        params = {"num_rounds": num_rounds, "bands": bands, "participation": participation}
        sol = opt.cached("banded_toeplitz", params)
        _said(kind, num_rounds, sol.seconds, sol.from_cache)
        coefs = tuple(float(c) for c in sol.coefficients)  # type: ignore[union-attr]
        return cn.BandedToeplitz(coefficients=coefs, column_normalized_for=num_rounds)
    if kind is FactorizationKind.BLT:
        params = {"num_rounds": num_rounds, "buffers": buffers, "participation": participation}
        blt = opt.cached("blt", params)
        _said(kind, num_rounds, blt.seconds, blt.from_cache)
        return cn.BufferedLinearToeplitz(
            buffer_decays=tuple(float(x) for x in blt.buffer_decays),  # type: ignore[union-attr]
            output_scales=tuple(float(x) for x in blt.output_scales),  # type: ignore[union-attr]
        )
    multi = participation.max_participations_in(num_rounds) > 1
    check(
        not multi or num_rounds <= DENSE_MULTI_MAX_ROUNDS,
        "num_rounds",
        num_rounds,
        f"must be <= {DENSE_MULTI_MAX_ROUNDS} for privacy.factorization=dense with several "
        "participations (its optimisation takes many minutes beyond: 51 s at 500 rounds on 2 "
        "cores); use privacy.factorization=banded (BandMF) or blt",
    )
    dense = opt.cached("dense", {"num_rounds": num_rounds, "participation": participation})
    _said(kind, num_rounds, dense.seconds, dense.from_cache)
    return cn.DenseFactorization(matrix=dense.matrix)  # type: ignore[union-attr]


def _said(kind: FactorizationKind, num_rounds: int, seconds: float, cached: bool) -> None:
    """One line on stderr: where the strategy came from and what it cost."""
    how = "from the cache" if cached else f"optimised in {seconds:.1f} s"
    print(f"fedpriv: factorization={kind.value} for {num_rounds} rounds {how}", file=sys.stderr)
