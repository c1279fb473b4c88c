"""Correlated noise of DP-FTRL: matrix-factorization strategies and their streaming noise.

The prefix-sum workload A (n x n, lower triangular ones) is factorized A = B C. The mechanism
releases C G + Z sigma (G: the n x d stream of clipped, summed client updates; Z iid N(0, 1));
equivalently the server adds the noise W = M Z sigma to the updates (round t gets row t of W)
and any optimizer post-processes the noisy updates. A strategy here is the linear map M (n x m,
m fresh draws) with W = M Z and M C = I: for a square lower-triangular C, M = C^-1; for the
tree (m nodes > n rounds) M is the estimator's causal left inverse of C.

Sensitivity is computed from M (the matrix that actually generates the noise): the released
updates G + M Z sigma are a Gaussian mechanism with covariance sigma^2 M M^T, so the Gram
matrix of the mechanism is X = (M M^T)^-1 (= C^T C for square C), and the sensitivity for a
participation pattern is sup over patterns of sqrt(u^T X u) (:mod:`mf_sensitivity`).

Every family states an ANALYTIC strategy matrix (closed form, a code path independent of the
streaming code) and a STREAM; the run compares the sensitivity from the materialised stream
with the analytic one at start-up. Draws are counted per round in order; the stream of round t
calls ``draw`` for each fresh vector it needs (the tree: one per node completing at t).

References
----------
Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, "Practical and Private (Deep) Learning without
Sampling or Shuffling" (arXiv:2103.00039), Sec. 3 and App. B: tree aggregation; Honaker,
"Efficient Use of Differentially Private Binary Trees" (TPDP 2015): the efficient estimator
(as in TensorFlow Federated's ``EfficientTreeAggregator``); Choquette-Choo et al. 2023
(arXiv:2211.06530, Sec. 2; arXiv:2306.08153, Sec. 4 and Alg. 9): BandMF; Kalinin, Lampert,
"Banded Square Root Matrix Factorization" (arXiv:2405.13763), Thm. 2: Toeplitz min-sep
sensitivity; Dvijotham, McMahan, Pillutla, Steinke, Thakurta, "Efficient and Near-Optimal
Noise Generation for Streaming Differential Privacy" (arXiv:2404.16706), Sec. 3: BLT;
McKenna 2024 (arXiv:2405.15913): column-normalised banded Toeplitz.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
import scipy.linalg
import scipy.signal

from fedpriv.common.errors import check
from fedpriv.common.validate import parse_enum
from fedpriv.mechanisms.mf_sensitivity import (
    gram_from_noise_matrix,
    max_pattern_sum,
    sensitivity_squared,
    toeplitz_first_column,
    toeplitz_sensitivity_squared,
)
from fedpriv.mechanisms.participation import Participation, ParticipationKind

#: A source of fresh standard-normal vectors, each ``(dim,)`` float64 (the run: seeded
#: draws; materialisation: basis vectors).
Draw = Callable[[], np.ndarray]

#: The largest n for which a gram-matrix bound (``O(n^2)`` memory) is computed.
GRAM_MAX_ROUNDS = 4096
#: The largest dense strategy accepted (its stream holds every past vector).
DENSE_MAX_ROUNDS = 2000


class NoiseStream(ABC):
    """The streaming state of one strategy for vectors of ``dim`` coordinates."""

    @abstractmethod
    def step(self, draw: Draw) -> np.ndarray:
        """Round t's noise ``w_t`` (``(dim,)`` float64): row t of ``M Z``, calling ``draw``
        for each fresh standard-normal vector it needs (rounds are stepped in order 1, 2, ...)."""

    @property
    @abstractmethod
    def vectors_held(self) -> int:
        """How many ``(dim,)`` vectors the state holds now (the noise memory)."""


def _rounds(num_rounds: int, limit: int | None = None, why: str = "") -> int:
    """``num_rounds`` as an int >= 1 (and <= ``limit``), else a one-line ConfigError."""
    ok = isinstance(num_rounds, (int, np.integer)) and not isinstance(num_rounds, bool)
    check(ok and num_rounds >= 1, "num_rounds", num_rounds, "must be an integer >= 1")
    if limit is not None:
        check(num_rounds <= limit, "num_rounds", num_rounds, f"must be <= {limit} {why}")
    return int(num_rounds)


def _floats(field_name: str, values: Any) -> tuple[float, ...]:
    """A tuple of finite floats, else a ConfigError naming ``field_name``."""
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        check(False, field_name, values, "must be a sequence of finite numbers")
        raise AssertionError from None  # pragma: no cover (check raised)
    check(all(math.isfinite(v) for v in out), field_name, values, "must be finite numbers")
    return out


def _gram_bound(strategy: np.ndarray, participation: Participation) -> float:
    """``sqrt`` of :func:`sensitivity_squared` of ``C^T C`` (``strategy``: ``(m, n)`` C)."""
    n = strategy.shape[1]
    _rounds(n, GRAM_MAX_ROUNDS, "for a sensitivity bound from the n x n Gram matrix")
    return math.sqrt(sensitivity_squared(strategy.T @ strategy, participation))


def _toeplitz_bound(coefficients: np.ndarray, participation: Participation) -> float | None:
    """The exact sensitivity of a lower-triangular Toeplitz C with nonnegative non-increasing
    ``coefficients`` (arXiv:2405.13763 Thm. 2), or None for other coefficients."""
    c = np.asarray(coefficients, dtype=np.float64)
    if np.any(c < 0) or np.any(np.diff(c) > 0):
        return None
    return math.sqrt(toeplitz_sensitivity_squared(c, participation))


class _ToeplitzMaterialized:
    """Materialised sensitivity of a Toeplitz family: when ``C = M^-1`` of the materialised
    stream is (to 1e-9) Toeplitz with nonnegative non-increasing coefficients, the exact value
    of arXiv:2405.13763 Thm. 2 on ITS coefficients; otherwise the generic Gram bound."""

    def materialized_sensitivity(self, participation: Participation, num_rounds: int) -> float:
        f = self
        assert isinstance(f, Factorization)
        if participation.kind is not ParticipationKind.SINGLE:
            m = f.noise_matrix(num_rounds)
            if not np.triu(m, 1).any():
                c = scipy.linalg.solve_triangular(m, np.eye(m.shape[0]), lower=True)
                col = toeplitz_first_column(c)
                if col is not None:
                    return math.sqrt(toeplitz_sensitivity_squared(col, participation))
        return Factorization.materialized_sensitivity(f, participation, num_rounds)


class Factorization(ABC):
    """A correlated-noise strategy (see the module docstring)."""

    name: ClassVar[str]

    @abstractmethod
    def stream(self, dim: int) -> NoiseStream:
        """A fresh streaming state for ``dim`` coordinates (round 1 next)."""

    @abstractmethod
    def strategy_matrix(self, num_rounds: int) -> np.ndarray:
        """The analytic C (``(m, n)`` float64) of the first ``num_rounds`` rounds."""

    @abstractmethod
    def num_draws(self, num_rounds: int) -> int:
        """m: the fresh ``(dim,)`` draws the stream makes over ``num_rounds`` rounds."""

    @abstractmethod
    def noise_vectors(self, num_rounds: int) -> int:
        """The most ``(dim,)`` vectors the stream holds between rounds over ``num_rounds``."""

    def noise_matrix(self, num_rounds: int) -> np.ndarray:
        """M (``(n, m)``) materialised by running :meth:`stream` on basis-vector draws.

        Draw j (0-based, in the order the stream makes them) is the basis vector ``e_j`` of
        ``R^m``, so row t of the output is row t of M.

        Raises
        ------
        RuntimeError
            When the stream makes a number of draws other than :meth:`num_draws`.
        """
        n = _rounds(num_rounds)
        m = self.num_draws(n)
        count = [0]

        def draw() -> np.ndarray:
            if count[0] >= m:
                raise RuntimeError(f"{self.name}: the stream drew more than {m} vectors")
            e = np.zeros(m)
            e[count[0]] = 1.0
            count[0] += 1
            return e

        stream = self.stream(m)
        rows = [np.array(stream.step(draw), dtype=np.float64) for _ in range(n)]
        if count[0] != m:
            raise RuntimeError(f"{self.name}: the stream drew {count[0]} vectors, not {m}")
        return np.stack(rows)

    def analytic_sensitivity(self, participation: Participation, num_rounds: int) -> float:
        """Sensitivity of C G under ``participation`` over ``num_rounds`` rounds (per unit
        clipping norm), from the analytic matrix (closed form where one exists).

        The default: the largest column norm (single) or :func:`sensitivity_squared` of
        ``C^T C`` (n <= :data:`GRAM_MAX_ROUNDS`).
        """
        c = self.strategy_matrix(num_rounds)
        if participation.kind is ParticipationKind.SINGLE:
            return float(np.linalg.norm(c, axis=0).max())
        return _gram_bound(c, participation)

    def materialized_sensitivity(self, participation: Participation, num_rounds: int) -> float:
        """The same bound from X = (M M^T)^-1 of the materialised stream."""
        gram = gram_from_noise_matrix(self.noise_matrix(num_rounds))
        return math.sqrt(sensitivity_squared(gram, participation))

    def prefix_noise_variances(self, num_rounds: int) -> np.ndarray:
        """``(n,)`` squared norms of the rows of ``A M``: the variance of the noise on the
        prefix sum of rounds 1..t per unit noise std (default: from :meth:`noise_matrix`)."""
        prefix = np.cumsum(self.noise_matrix(num_rounds), axis=0)
        return np.asarray(np.einsum("ij,ij->i", prefix, prefix), dtype=np.float64)

    def workload_error(self, participation: Participation, num_rounds: int) -> float:
        """RMSE of the n prefix sums per unit noise multiplier and clipping norm:
        sens * sqrt(||A M||_F^2 / n) (sens: :meth:`analytic_sensitivity`)."""
        sens = self.analytic_sensitivity(participation, num_rounds)
        return sens * math.sqrt(float(np.mean(self.prefix_noise_variances(num_rounds))))

    def max_workload_error(self, participation: Participation, num_rounds: int) -> float:
        """The largest prefix-sum error: sens * max_t ||(A M)_t|| (same units)."""
        sens = self.analytic_sensitivity(participation, num_rounds)
        return sens * math.sqrt(float(np.max(self.prefix_noise_variances(num_rounds))))


# ---- identity ------------------------------------------------------------------------------
class _IdentityStream(NoiseStream):
    def step(self, draw: Draw) -> np.ndarray:
        return draw()  # unchanged: bit-identical to DP-FedAvg's noise

    @property
    def vectors_held(self) -> int:
        return 0


@dataclass(frozen=True)
class IdentityFactorization(Factorization):
    """C = I: fresh noise every round (DP-FedAvg); sensitivity ``sqrt(k_n)`` with ``k_n`` the
    most participations in n rounds."""

    name: ClassVar[str] = "identity"

    def stream(self, dim: int) -> NoiseStream:
        return _IdentityStream()

    def strategy_matrix(self, num_rounds: int) -> np.ndarray:
        return np.eye(_rounds(num_rounds))

    def num_draws(self, num_rounds: int) -> int:
        return _rounds(num_rounds)

    def noise_vectors(self, num_rounds: int) -> int:
        return 0

    def analytic_sensitivity(self, participation: Participation, num_rounds: int) -> float:
        return math.sqrt(participation.max_participations_in(_rounds(num_rounds)))

    def prefix_noise_variances(self, num_rounds: int) -> np.ndarray:
        return np.arange(1, _rounds(num_rounds) + 1, dtype=np.float64)


# ---- binary tree -------------------------------------------------------------------------
class TreeEstimator(StrEnum):
    """How a prefix sum is read off the noisy tree."""

    ONLINE = "online"  # the sum of the raw nodes of t's dyadic decomposition
    HONAKER = "honaker"  # each node: inverse-variance mix of itself and its children


def honaker_variances(levels: int) -> np.ndarray:
    """``(levels,)`` variances ``v_h`` of Honaker's node estimates (unit node noise).

    ``v_0 = 1``, ``v_h = 2 v_{h-1} / (2 v_{h-1} + 1) = 2^h / (2^{h+1} - 1)``: the estimate of a
    level-h node mixes its own value (variance 1) and its children's estimates (variance
    ``2 v_{h-1}``) with weights ``v_h`` and ``1 - v_h``.

    References
    ----------
    Honaker 2015, Sec. 3; TensorFlow Federated ``EfficientTreeAggregator`` (noise std at depth d
    ``sigma sqrt(2^{d-1} / (2^d - 1))``).
    """
    v = np.ones(max(levels, 1))
    for h in range(1, levels):
        v[h] = 2 * v[h - 1] / (2 * v[h - 1] + 1)
    return v[:levels]


class _TreeStream(NoiseStream):
    """Round t: draws its leaf and the ``tz(t)`` ancestors completing at t (bottom-up) and
    returns ``prefix(t) - prefix(t-1)`` = the new top node minus the nodes it replaces."""

    def __init__(self, honaker: bool) -> None:
        self._honaker = honaker
        self._t = 0
        self._nodes: list[np.ndarray | None] = []  # level h: the pending left node, if any

    def step(self, draw: Draw) -> np.ndarray:
        self._t += 1
        top = (self._t & -self._t).bit_length() - 1  # trailing zeros: levels completing
        est = np.asarray(draw(), dtype=np.float64)
        replaced = np.zeros_like(est)
        weights = honaker_variances(top + 1)
        for h in range(1, top + 1):
            left = self._nodes[h - 1]
            assert left is not None  # bit h-1 of t-1 is set
            self._nodes[h - 1] = None
            replaced += left
            own = np.asarray(draw(), dtype=np.float64)
            est = weights[h] * own + (1 - weights[h]) * (left + est) if self._honaker else own
        if len(self._nodes) <= top:
            self._nodes.extend([None] * (top + 1 - len(self._nodes)))
        self._nodes[top] = est
        return est - replaced

    @property
    def vectors_held(self) -> int:
        return sum(v is not None for v in self._nodes)


@dataclass(frozen=True)
class TreeAggregation(Factorization):
    """Binary-tree aggregation over rounds (DP-FTRL's tree, arXiv:2103.00039 Sec. 3).

    C has one row per node completed by round n (``2n - popcount(n)`` rows, in completion
    order: at round t the leaf, then its ``tz(t)`` ancestors that complete at t, bottom-up),
    with ones on the rounds the node covers. Each node gets one fresh draw when it completes
    (the online estimator draws and discards the right children it never reads, so both
    estimators see the same tree noise). The stream holds ``popcount(t)`` vectors (the pending
    left nodes): at most ``floor(log2(n + 1))``.

    Parameters
    ----------
    estimator : TreeEstimator
        ``online`` or ``honaker``.

    Raises
    ------
    ConfigError
        For an unknown estimator (``factorization.estimator``).
    """

    estimator: TreeEstimator = TreeEstimator.ONLINE
    name: ClassVar[str] = "tree"

    def __post_init__(self) -> None:
        est = parse_enum(TreeEstimator, "factorization.estimator", self.estimator)
        object.__setattr__(self, "estimator", est)

    def stream(self, dim: int) -> NoiseStream:
        return _TreeStream(self.estimator is TreeEstimator.HONAKER)

    def strategy_matrix(self, num_rounds: int) -> np.ndarray:
        n = _rounds(num_rounds)
        rows = []
        for t in range(1, n + 1):
            for h in range((t & -t).bit_length()):
                row = np.zeros(n)
                row[t - 2**h : t] = 1.0  # the node covering rounds t - 2^h + 1 .. t
                rows.append(row)
        return np.stack(rows)

    def num_draws(self, num_rounds: int) -> int:
        n = _rounds(num_rounds)
        return 2 * n - bin(n).count("1")

    def noise_vectors(self, num_rounds: int) -> int:
        return (_rounds(num_rounds) + 1).bit_length() - 1

    def analytic_sensitivity(self, participation: Participation, num_rounds: int) -> float:
        """single: ``sqrt(floor(log2 n) + 1)`` (the completed ancestors of round 1; equal to
        ``sqrt(ceil(log2 n) + 1)`` for n a power of two). Otherwise the per-level bound
        ``sum_h k min(k, ceil(2^h / b))`` (a level-h node covers at most ``ceil(2^h / b)``
        rounds b apart; ``sum cnt^2 <= max cnt * sum cnt``; an upper bound). It bounds the
        release C G + Z, of which the estimator's noisy updates are a post-processing, so the
        materialised bound of the stream is at most it (checked in the tests).
        """
        n = _rounds(num_rounds)
        levels = n.bit_length()
        k = participation.max_participations_in(n)
        if participation.kind is ParticipationKind.SINGLE or k == 1:
            return math.sqrt(levels)
        b = participation.separation
        return math.sqrt(sum(k * min(k, math.ceil(2**h / b)) for h in range(levels)))

    def prefix_noise_variances(self, num_rounds: int) -> np.ndarray:
        n = _rounds(num_rounds)
        v = np.ones(n.bit_length())
        if self.estimator is TreeEstimator.HONAKER:
            v = honaker_variances(n.bit_length())
        t = np.arange(1, n + 1)
        bits = (t[:, None] >> np.arange(v.size)[None, :]) & 1
        return np.asarray(bits @ v, dtype=np.float64)


# ---- banded Toeplitz (BandMF) ------------------------------------------------------------
class _BandedStream(NoiseStream):
    """``u = C^-1 z`` by forward substitution over a ring buffer of the last ``bands - 1``
    ``u``'s (arXiv:2306.08153 Alg. 9); the output is ``scale_t u_t`` (column normalisation)."""

    def __init__(self, coefficients: np.ndarray, scales: np.ndarray | None) -> None:
        self._c = coefficients
        self._scales = scales
        self._past: deque[np.ndarray] = deque(maxlen=max(coefficients.size - 1, 0))
        self._t = 0

    def step(self, draw: Draw) -> np.ndarray:
        if self._scales is not None:
            _rounds(self._t + 1, self._scales.size, "(the horizon of the column normalisation)")
        z = np.asarray(draw(), dtype=np.float64)
        acc = z.copy()
        for i, past in enumerate(self._past, start=1):  # past[0] = u_{t-1}
            acc -= self._c[i] * past
        u = acc / self._c[0]
        if self._past.maxlen:
            self._past.appendleft(u)
        out = u if self._scales is None else self._scales[self._t] * u
        self._t += 1
        return np.asarray(out, dtype=np.float64)

    @property
    def vectors_held(self) -> int:
        return len(self._past)


@dataclass(frozen=True)
class BandedToeplitz(_ToeplitzMaterialized, Factorization):
    """Lower-triangular banded Toeplitz C: ``C_ij = c_{i-j}`` for ``0 <= i - j < bands``.

    Parameters
    ----------
    coefficients : tuple of float
        ``(c_0, ..., c_{bands-1})``, ``c_0 > 0``.
    column_normalized_for : int, optional
        H: use ``C D`` with ``D_jj = 1 / ||C_H[:, j]||`` (each column of the H x H matrix
        scaled to norm 1, as jax_privacy ``ColumnNormalizedBanded``/``column_normalize_for_n``
        and arXiv:2405.15913); its noise is ``D^-1 C^-1 Z`` (row t scaled by
        ``||c[:min(bands, H - t)]||``) and the stream refuses round H + 1.

    Raises
    ------
    ConfigError
        ``factorization.coefficients`` empty, not finite or ``c_0 <= 0``;
        ``factorization.column_normalized_for`` not an integer >= 1.

    Notes
    -----
    Sensitivity (single, or b-min-separation / cyclic with ``bands <= b``: columns b apart are
    orthogonal) is exact: ``max_S sum_{j in S} ||C_n[:, j]||^2`` over the closed-form column
    norms ``||c[:min(bands, n - j)]||`` (``<= sqrt(min(k, ceil(n/b))) max_j ||C[:, j]||``, equal
    for the column-normalised H = n). With ``bands > b`` it falls back to the Gram bound.
    The stream holds ``bands - 1`` vectors.
    """

    coefficients: tuple[float, ...]
    column_normalized_for: int | None = None
    name: ClassVar[str] = "banded"

    def __post_init__(self) -> None:
        f = "factorization.coefficients"
        c = _floats(f, self.coefficients)
        check(len(c) >= 1 and c[0] > 0, f, self.coefficients, "must be nonempty with c_0 > 0")
        object.__setattr__(self, "coefficients", c)
        h = self.column_normalized_for
        if h is not None:
            ok = isinstance(h, int) and not isinstance(h, bool) and h >= 1
            check(ok, "factorization.column_normalized_for", h, "must be an int >= 1")

    @property
    def bands(self) -> int:
        return len(self.coefficients)

    def column_normalized(self, num_rounds: int) -> BandedToeplitz:
        """The column-normalised variant for a horizon of ``num_rounds`` rounds."""
        return BandedToeplitz(self.coefficients, column_normalized_for=_rounds(num_rounds))

    def _column_norms(self, rows: int, count: int) -> np.ndarray:
        """``(count,)`` norms of the first ``count`` columns of the ``rows``-row Toeplitz C."""
        cum = np.cumsum(np.square(np.asarray(self.coefficients)))
        length = np.minimum(self.bands, rows - np.arange(count))
        return np.asarray(np.sqrt(cum[length - 1]), dtype=np.float64)

    def _scales(self, num_rounds: int) -> np.ndarray | None:
        """``D^-1`` (``(n,)``) of the column normalisation, or None."""
        h = self.column_normalized_for
        if h is None:
            return None
        n = _rounds(num_rounds, h, "(the horizon of the column normalisation)")
        return self._column_norms(h, n)

    def stream(self, dim: int) -> NoiseStream:
        scales = (
            None if self.column_normalized_for is None else self._scales(self.column_normalized_for)
        )
        return _BandedStream(np.asarray(self.coefficients), scales)

    def strategy_matrix(self, num_rounds: int) -> np.ndarray:
        n = _rounds(num_rounds)
        col = np.zeros(n)
        col[: min(n, self.bands)] = self.coefficients[:n]
        c = np.asarray(scipy.linalg.toeplitz(col, np.zeros(n)), dtype=np.float64)
        scales = self._scales(n)
        return c if scales is None else c / scales[None, :]

    def num_draws(self, num_rounds: int) -> int:
        return _rounds(num_rounds)

    def noise_vectors(self, num_rounds: int) -> int:
        return min(_rounds(num_rounds), self.bands) - 1

    def analytic_sensitivity(self, participation: Participation, num_rounds: int) -> float:
        n = _rounds(num_rounds)
        single = participation.kind is ParticipationKind.SINGLE
        if not single and self.bands > participation.separation:
            col = self.strategy_matrix(n)[:, 0]
            exact = None if self.column_normalized_for else _toeplitz_bound(col, participation)
            return _gram_bound(self.strategy_matrix(n), participation) if exact is None else exact
        norms = self._column_norms(n, n)
        scales = self._scales(n)
        if scales is not None:
            norms = norms / scales
        return math.sqrt(max_pattern_sum(np.square(norms), participation))

    def prefix_noise_variances(self, num_rounds: int) -> np.ndarray:
        """From the impulse response ``r`` of ``C^-1`` (``O(n bands)``; the column-normalised
        rows near the horizon are corrected one by one)."""
        n = _rounds(num_rounds)
        impulse = np.zeros(n)
        impulse[0] = 1.0
        r = scipy.signal.lfilter([1.0], np.asarray(self.coefficients), impulse)
        cr = np.cumsum(r)
        var = np.cumsum(np.square(cr))
        scales = self._scales(n)
        if scales is None:
            return np.asarray(var, dtype=np.float64)
        base = float(scales[0])
        var = base**2 * var
        tail = [s for s in range(n) if scales[s] != base]
        for t in range(tail[0] if tail else n, n):
            row = base * cr[t::-1]  # entry j: sum_{s=j}^{t} base r[s - j]
            for s in tail:
                if s <= t:
                    row[: s + 1] += (scales[s] - base) * r[s::-1]
            var[t] = row @ row
        return np.asarray(var, dtype=np.float64)


# ---- buffered linear Toeplitz (BLT) ------------------------------------------------------
class _BLTStream(NoiseStream):
    """Solves ``C w = z`` with one buffer per decay: ``w_t = z_t - sum_j omega_j s_j``, then
    ``s_j <- theta_j s_j + w_t`` (so ``s_j = sum_{s<t} theta_j^{t-1-s} w_s``)."""

    def __init__(self, decays: tuple[float, ...], scales: tuple[float, ...]) -> None:
        self._decays = decays
        self._scales = scales
        self._buffers: list[np.ndarray] = []

    def step(self, draw: Draw) -> np.ndarray:
        z = np.asarray(draw(), dtype=np.float64)
        if not self._buffers:
            self._buffers = [np.zeros_like(z) for _ in self._decays]
        w = z.copy()
        for omega, s in zip(self._scales, self._buffers):
            w -= omega * s
        for theta, s in zip(self._decays, self._buffers):
            s *= theta
            s += w
        return w

    @property
    def vectors_held(self) -> int:
        return len(self._buffers)


@dataclass(frozen=True)
class BufferedLinearToeplitz(_ToeplitzMaterialized, Factorization):
    """BLT strategy (arXiv:2404.16706 Sec. 3): lower-triangular Toeplitz C with ``c_0 = 1``
    and ``c_i = sum_j omega_j theta_j^(i-1)`` for ``i >= 1``.

    Parameters
    ----------
    buffer_decays : tuple of float
        ``theta_j`` in ``[0, 1)``.
    output_scales : tuple of float
        ``omega_j`` (finite), as many as the decays.

    Raises
    ------
    ConfigError
        ``factorization.buffer_decays`` / ``output_scales`` empty, of different
        lengths, not finite, or a decay outside ``[0, 1)``.

    Notes
    -----
    The stream holds one vector per buffer. Sensitivity under b-min-separation or cyclic
    participation is the closed form ``||sum_{i<k} C[:, i b]||`` (arXiv:2405.13763 Thm. 2)
    when the coefficients are nonnegative and non-increasing (``omega >= 0``,
    ``sum omega <= 1``); otherwise the Gram bound (n <= :data:`GRAM_MAX_ROUNDS`).
    """

    buffer_decays: tuple[float, ...]
    output_scales: tuple[float, ...]
    name: ClassVar[str] = "blt"

    def __post_init__(self) -> None:
        fd, fs = "factorization.buffer_decays", "factorization.output_scales"
        d, s = _floats(fd, self.buffer_decays), _floats(fs, self.output_scales)
        check(len(d) >= 1, fd, self.buffer_decays, "must hold at least one decay")
        check(len(s) == len(d), fs, self.output_scales, f"must hold {len(d)} values")
        check(all(0 <= v < 1 for v in d), fd, self.buffer_decays, "must be in [0, 1)")
        object.__setattr__(self, "buffer_decays", d)
        object.__setattr__(self, "output_scales", s)

    def coefficients(self, num_rounds: int) -> np.ndarray:
        """``(n,)`` Toeplitz coefficients ``c_0 .. c_{n-1}`` (closed form)."""
        n = _rounds(num_rounds)
        i = np.arange(1, n)
        c = np.ones(n)
        theta, omega = np.asarray(self.buffer_decays), np.asarray(self.output_scales)
        c[1:] = (omega[None, :] * theta[None, :] ** (i[:, None] - 1)).sum(axis=1)
        return c

    def stream(self, dim: int) -> NoiseStream:
        return _BLTStream(self.buffer_decays, self.output_scales)

    def strategy_matrix(self, num_rounds: int) -> np.ndarray:
        c = self.coefficients(num_rounds)
        return np.asarray(scipy.linalg.toeplitz(c, np.zeros_like(c)), dtype=np.float64)

    def num_draws(self, num_rounds: int) -> int:
        return _rounds(num_rounds)

    def noise_vectors(self, num_rounds: int) -> int:
        _rounds(num_rounds)
        return len(self.buffer_decays)

    def analytic_sensitivity(self, participation: Participation, num_rounds: int) -> float:
        c = self.coefficients(num_rounds)
        n = c.size
        if participation.kind is ParticipationKind.SINGLE:
            return float(np.linalg.norm(c))
        exact = _toeplitz_bound(c, participation)
        return _gram_bound(self.strategy_matrix(n), participation) if exact is None else exact

    def prefix_noise_variances(self, num_rounds: int) -> np.ndarray:
        """From the impulse response of ``C^-1 = Q / P`` (``C(x) = P(x) / Q(x)``,
        ``Q = prod_j (1 - theta_j x)``): ``O(n buffers)``."""
        n = _rounds(num_rounds)
        q = np.ones(1)
        for theta in self.buffer_decays:
            q = np.convolve(q, [1.0, -theta])
        p = np.concatenate([q, [0.0]])
        for j, omega in enumerate(self.output_scales):
            rest = np.ones(1)
            for i, theta in enumerate(self.buffer_decays):
                rest = rest if i == j else np.convolve(rest, [1.0, -theta])
            p[1 : 1 + rest.size] += omega * rest
        impulse = np.zeros(n)
        impulse[0] = 1.0
        r = scipy.signal.lfilter(q, p, impulse)
        return np.asarray(np.cumsum(np.square(np.cumsum(r))), dtype=np.float64)


# ---- dense -------------------------------------------------------------------------------
class _DenseStream(NoiseStream):
    """``w = C^-1 z`` by forward substitution over every past ``w`` (``O(t)`` vectors)."""

    def __init__(self, matrix: np.ndarray) -> None:
        self._c = matrix
        self._past: np.ndarray | None = None
        self._t = 0

    def step(self, draw: Draw) -> np.ndarray:
        t = self._t
        _rounds(t + 1, self._c.shape[0], "(the size of the dense strategy)")
        z = np.asarray(draw(), dtype=np.float64)
        if self._past is None:
            self._past = np.empty((min(16, self._c.shape[0]), z.size))
        if t == self._past.shape[0]:
            grown = np.empty((min(2 * t, self._c.shape[0]), z.size))
            grown[:t] = self._past
            self._past = grown
        w = (z - self._c[t, :t] @ self._past[:t]) / self._c[t, t]
        self._past[t] = w
        self._t += 1
        return np.asarray(w, dtype=np.float64)

    @property
    def vectors_held(self) -> int:
        return self._t


@dataclass(frozen=True, eq=False)
class DenseFactorization(Factorization):
    """Any lower-triangular invertible C (``n_max x n_max``, n_max <= 2,000); the first n
    rounds use its leading n x n block. The stream holds every past noise vector (``O(n)``).

    Parameters
    ----------
    matrix : array_like
        ``(n_max, n_max)`` lower-triangular C with a nonzero diagonal.

    Raises
    ------
    ConfigError
        ``factorization.matrix`` not square, larger than 2,000, not finite, not lower
        triangular or singular.
    """

    matrix: np.ndarray = field(repr=False)
    name: ClassVar[str] = "dense"

    def __post_init__(self) -> None:
        f = "factorization.matrix"
        c = np.array(self.matrix, dtype=np.float64)
        shape = c.shape
        check(c.ndim == 2 and shape[0] == shape[1] >= 1, f, shape, "must be a square matrix")
        check(shape[0] <= DENSE_MAX_ROUNDS, f, shape, f"must be at most {DENSE_MAX_ROUNDS}^2")
        check(bool(np.isfinite(c).all()), f, shape, "must hold finite numbers")
        check(not np.triu(c, 1).any(), f, shape, "must be lower triangular")
        check(bool(np.all(np.diag(c) != 0)), f, shape, "must have a nonzero diagonal")
        c.setflags(write=False)
        object.__setattr__(self, "matrix", c)

    def stream(self, dim: int) -> NoiseStream:
        return _DenseStream(self.matrix)

    def strategy_matrix(self, num_rounds: int) -> np.ndarray:
        n = _rounds(num_rounds, self.matrix.shape[0], "(the size of the dense strategy)")
        return np.array(self.matrix[:n, :n])

    def num_draws(self, num_rounds: int) -> int:
        return _rounds(num_rounds, self.matrix.shape[0], "(the size of the dense strategy)")

    def noise_vectors(self, num_rounds: int) -> int:
        return self.num_draws(num_rounds)
