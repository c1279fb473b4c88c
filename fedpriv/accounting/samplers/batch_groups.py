"""Fixed-size batches cut into clipped groups, shuffled or subsampled: the law of ``c²``.

A client holds ``N = num_samples`` records. Each epoch has ``R = N // (m s)`` local rounds
(``m = num_groups`` groups of ``s = group_size`` records per round; the ``N - R m s`` records
left over by a shuffled epoch are not used in it). For data sets differing in
``g = group_privacy`` records (replace-one relation, applied ``g`` times), a round whose
differing records fall into ``k`` of its groups changes ``k`` clipped group updates. This
module computes the law ``q`` of ``t = c² = Σ_rounds k²`` EXACTLY (integers), the amplification
the sampler gives: the loss model it feeds is
:mod:`fedpriv.accounting.loss_models.gaussian_mixture`.

* shuffling: per epoch the ``g`` differing records occupy a uniformly random ``g``-subset of
  the ``N`` positions of the permutation; the count of subsets per value of ``t`` is the
  coefficient of ``x^g`` in ``P(x, z)^R (1 + x)^L`` where ``P`` is the one-round generating
  polynomial ``Σ_{j,k} C(m,k) surj(k, s, j) x^j z^{k²}`` (``j`` records in ``k`` occupied
  groups). Epochs use independent permutations, so the run is the epoch law convolved.
* subsampling: each round draws ``S_b`` (``m s`` of ``N``) independently; ``j`` is
  hypergeometric and ``k | j`` follows the same occupancy count; rounds are convolved.

Convolution powers use repeated squaring. Upper tails whose total probability is below
``tail_tol`` (default 1e-30) are moved to the largest possible ``t`` -- a conservative
(stochastically larger) law, reported as ``lumped_mass``; ``tail_tol = 0`` disables it.

Hypothesis shared by every law here: the positions of the differing records are independent
of the data (the sampler draws them without looking at it), so ``q`` is the same under both
datasets of a neighbouring pair; under replace-one ``N`` is the same in both, which is why
the relation is replace-one. Poisson sampling is not covered (refused).

References
----------
van Dijk, Nguyen, Nguyen, Phan, "Generalizing DP-SGD with Shuffling and Batch Clipping"
(arXiv:2212.05796): Algorithm 1, Section 5 (definition of q_E(c), Lemma B.1), whose bounds on
q_E this module replaces by the exact law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
import scipy.special

from fedpriv.common.errors import ConfigError, check

__all__ = [
    "MAX_GROUP_PRIVACY",
    "SAMPLINGS",
    "SumSquaresLaw",
    "occupancy_counts",
    "shuffle_epoch_law",
    "subsample_round_law",
    "sum_squares_law",
    "validate_sizes",
]

#: The samplers whose law is computed here (fixed-size batches; Poisson is refused).
SAMPLINGS = ("shuffle", "subsample")
#: Largest group_privacy computed exactly (the shuffling polynomial costs ~g^7 operations:
#: 3 s at g = 64 with individual clipping on this machine).
MAX_GROUP_PRIVACY = 64


# --------------------------------------------------------------------------- combinatorics
@lru_cache(maxsize=4096)
def _surj(k: int, s: int, j: int) -> int:
    """Ways to choose ``j`` of the ``k s`` slots of ``k`` groups (size ``s``) hitting all ``k``."""
    return sum((-1) ** (k - i) * math.comb(k, i) * math.comb(i * s, j) for i in range(k + 1))


def occupancy_counts(num_groups: int, group_size: int, j: int) -> dict[int, int]:
    """Exact counts ``{k: #ways}`` of placing ``j`` marked records into a round.

    A round has ``num_groups`` groups of ``group_size`` slots; the ``j`` records take ``j``
    distinct slots; ``k`` is the number of groups holding at least one. The counts sum to
    ``C(m s, j)``.
    """
    m, s = num_groups, group_size
    out = {}
    for k in range(min(j, m) + 1):
        v = math.comb(m, k) * _surj(k, s, j)
        if v:
            out[k] = v
    return out


def _log_int(v: int) -> float:
    return math.log(v) if v > 0 else -math.inf


# --------------------------------------------------------------------------- law container
@dataclass(frozen=True)
class SumSquaresLaw:
    """Distribution of ``t = c^2 = sum_rounds k^2`` over a number of rounds.

    Attributes
    ----------
    probs : numpy.ndarray, shape (T,)
        ``probs[t]`` = P(sum k^2 = t) for ``t < T`` (the exact part).
    lumped_mass : float
        Probability moved up to ``t_max`` by tail truncation (0 when exact).
    t_max : int
        Largest possible value of ``t`` (where the lumped mass sits).
    """

    probs: np.ndarray
    lumped_mass: float
    t_max: int

    def as_dict(self) -> dict[int, float]:
        """``{t: probability}`` over the support (the lumped mass added at ``t_max``)."""
        out = {int(t): float(p) for t, p in enumerate(self.probs) if p > 0.0}
        if self.lumped_mass > 0.0:
            out[self.t_max] = out.get(self.t_max, 0.0) + self.lumped_mass
        return out

    def components(self) -> tuple[np.ndarray, np.ndarray]:
        """``(t values, probabilities)`` as arrays, normalised to sum to 1."""
        d = self.as_dict()
        t = np.fromiter(d.keys(), dtype=float, count=len(d))
        p = np.fromiter(d.values(), dtype=float, count=len(d))
        return t, p / p.sum()

    def mean(self) -> float:
        """Expected value of ``t`` (the lumped mass counted at ``t_max``)."""
        t, p = self.components()
        return float(np.dot(t, p))


def _point_law() -> SumSquaresLaw:
    return SumSquaresLaw(np.ones(1), 0.0, 0)


def _truncate(probs: np.ndarray, lumped: float, t_max: int, tol: float) -> SumSquaresLaw:
    """Move the largest upper tail with mass <= tol to ``t_max`` (conservative)."""
    probs = np.maximum(probs, 0.0)
    nz = np.flatnonzero(probs)
    probs = probs[: (nz[-1] + 1 if nz.size else 1)]
    if tol > 0.0 and probs.size > 1:
        tail = np.cumsum(probs[::-1])[::-1]  # tail[i] = sum probs[i:]
        cut = int(np.searchsorted(-tail, -tol, side="left"))  # first i with tail[i] <= tol
        cut = max(cut, 1)
        if cut < probs.size:
            lumped += float(tail[cut])
            probs = probs[:cut]
    return SumSquaresLaw(probs, lumped, t_max)


def _combine(a: SumSquaresLaw, b: SumSquaresLaw, tol: float) -> SumSquaresLaw:
    """Law of the sum of independent variables; cross terms with a lump go to the lump."""
    probs = np.convolve(a.probs, b.probs)
    exact = max(1.0 - a.lumped_mass, 0.0) * max(1.0 - b.lumped_mass, 0.0)
    lumped = a.lumped_mass + b.lumped_mass - a.lumped_mass * b.lumped_mass
    # Renormalise the exact part to its intended mass (guards float drift).
    total = float(probs.sum())
    if total > 0.0:
        probs = probs * (exact / total)
    return _truncate(probs, lumped, a.t_max + b.t_max, tol)


def _power(law: SumSquaresLaw, n: int, tol: float) -> SumSquaresLaw:
    """``n``-fold convolution by repeated squaring."""
    result = _point_law()
    base = law
    while n > 0:
        if n & 1:
            result = _combine(result, base, tol)
        n >>= 1
        if n:
            base = _combine(base, base, tol)
    return result


# --------------------------------------------------------------------------- validation
def validate_sizes(
    sampling: str, num_samples: int, num_groups: int, group_size: int, group_privacy: int
) -> int:
    """Check the sampler and sizes; return the number of rounds per epoch."""
    if sampling == "poisson":
        raise ConfigError(
            "sampling",
            sampling,
            "is not covered by the batch-clipping analysis (fixed-size batches); "
            "use the poisson-gaussian analysis for Poisson sampling with "
            "individual clipping and noise N(0,(C sigma)^2)",
        )
    check(sampling in SAMPLINGS, "sampling", sampling, "must be one of: shuffle, subsample")
    for name, v in (
        ("num_samples", num_samples),
        ("num_groups", num_groups),
        ("group_size", group_size),
        ("group_privacy", group_privacy),
    ):
        check(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1,
            name,
            v,
            "must be an integer >= 1",
        )
    batch = num_groups * group_size
    check(
        batch <= num_samples,
        "num_groups",
        num_groups,
        f"times group_size={group_size} must be <= num_samples={num_samples}",
    )
    check(
        group_privacy <= num_samples,
        "group_privacy",
        group_privacy,
        f"must be <= num_samples={num_samples}",
    )
    check(
        group_privacy <= MAX_GROUP_PRIVACY,
        "group_privacy",
        group_privacy,
        f"must be <= {MAX_GROUP_PRIVACY} (exact q_E is computed up to that size)",
    )
    return num_samples // batch


# --------------------------------------------------------------------------- shuffling
def _round_poly(m: int, s: int, g: int, log_theta: float) -> np.ndarray:
    """``Q[j, t]`` = scaled count of placing ``j >= 1`` records in a round with ``t = k^2``.

    The width is ``g min(g, m) + 1``: ``sum k^2 <= min(g, m) sum k <= g min(g, m)``.
    """
    q = np.zeros((g + 1, g * min(g, m) + 1))
    for j in range(1, min(g, m * s) + 1):
        for k, v in occupancy_counts(m, s, j).items():
            q[j, k * k] = math.exp(_log_int(v) + j * log_theta)
    return q


def _poly_mul(a: np.ndarray, b: np.ndarray, reach: list[int]) -> np.ndarray:
    """Product of bivariate polynomials ``[j, t]`` truncated at the shape of ``a``.

    ``reach[j]`` bounds the largest ``t`` with a nonzero coefficient at ``x^j``.
    """
    g, width = a.shape[0] - 1, a.shape[1]
    out = np.zeros_like(a)
    for j1 in range(g + 1):
        if not a[j1].any():
            continue
        for j2 in range(g + 1 - j1):
            if b[j2].any():
                r1, r2 = reach[j1] + 1, reach[j2] + 1
                prod = np.convolve(a[j1, :r1], b[j2, :r2])[:width]
                out[j1 + j2, : prod.size] += prod
    return out


def shuffle_epoch_law(
    num_samples: int,
    num_groups: int,
    group_size: int,
    group_privacy: int = 1,
    rounds: int | None = None,
) -> SumSquaresLaw:
    """Exact law of ``sum_b k_b^2`` over one shuffled epoch (or its first ``rounds`` rounds).

    The exact ``q_E`` of van Dijk et al. (arXiv:2212.05796, Section 5) for one shuffled epoch.
    Hypotheses: the replace-one relation, ``g`` times; the permutation is uniform and
    independent of the data, so the ``g`` differing records sit at a uniform ``g``-subset of
    positions, the same law under both datasets; ``N``, ``m``, ``s`` are public.

    Parameters
    ----------
    num_samples, num_groups, group_size : int
        ``N``, ``m``, ``s`` (``m s <= N``).
    group_privacy : int
        ``g``, the number of differing records (``g <= N``).
    rounds : int, optional
        Rounds of the epoch that have run (default all ``N // (m s)``).

    Returns
    -------
    SumSquaresLaw
        Exact (``lumped_mass = 0``), support in ``[0, g^2]``.

    Raises
    ------
    ConfigError
        On invalid sizes.

    Notes
    -----
    The count of ``g``-subsets of positions per value ``t`` is ``[x^g] P^r (1+x)^L`` with
    ``P = 1 + Q`` and ``L = N - r m s``; since ``Q`` has no ``x^0`` term,
    ``P^r = sum_{i<=g} C(r, i) Q^i`` truncated at ``x^g``. ``x`` is scaled by ``1/N`` to
    keep floats in range; the counts are normalised by their total ``C(N, g)``.
    """
    per_epoch = validate_sizes("shuffle", num_samples, num_groups, group_size, group_privacy)
    r = per_epoch if rounds is None else int(rounds)
    check(0 <= r <= per_epoch, "rounds", rounds, f"must be in [0, {per_epoch}]")
    m, s, g, n = num_groups, group_size, group_privacy, num_samples
    log_theta = -math.log(n)
    q = _round_poly(m, s, g, log_theta)
    reach = [min(j * min(j, m), q.shape[1] - 1) for j in range(g + 1)]
    acc = np.zeros_like(q)
    acc[0, 0] = 1.0
    power = acc.copy()
    for i in range(1, min(g, r) + 1):
        power = _poly_mul(power, q, reach)
        acc += float(scipy.special.comb(r, i, exact=False)) * power
    unused = n - r * m * s
    counts = np.zeros(q.shape[1])
    for j in range(g + 1):
        if g - j <= unused:
            log_c = (
                scipy.special.gammaln(unused + 1)
                - scipy.special.gammaln(g - j + 1)
                - scipy.special.gammaln(unused - g + j + 1)
            )
            counts += math.exp(log_c + (g - j) * log_theta) * acc[j]
    counts = counts / counts.sum()
    t_max = int(np.flatnonzero(counts)[-1])
    return _truncate(counts, 0.0, t_max, 0.0)


# --------------------------------------------------------------------------- subsampling
def subsample_round_law(
    num_samples: int, num_groups: int, group_size: int, group_privacy: int = 1
) -> SumSquaresLaw:
    """Exact law of ``k^2`` for one subsampled round.

    ``j`` (differing records in ``S_b``) is hypergeometric(N, g, m s); given ``j`` the
    split into groups is uniform, so ``P(k | j) = C(m,k) surj(k,s,j) / C(m s, j)``.

    The exact ``q_E`` of van Dijk et al. (arXiv:2212.05796, Section 5) for one round drawn
    without replacement. Hypotheses: the replace-one relation, ``g`` times; ``S_b`` is a
    uniform ``m s``-subset drawn independently of the data and of the other rounds, and its
    split into groups is uniform.

    Raises
    ------
    ConfigError
        On invalid sizes.
    """
    validate_sizes("subsample", num_samples, num_groups, group_size, group_privacy)
    m, s, g, n = num_groups, group_size, group_privacy, num_samples
    b = m * s
    kmax = min(g, m)
    probs = np.zeros(kmax * kmax + 1)
    log_total = (
        scipy.special.gammaln(n + 1)
        - scipy.special.gammaln(b + 1)
        - scipy.special.gammaln(n - b + 1)
    )
    for j in range(0, min(g, b) + 1):
        if b - j > n - g:
            continue
        log_h = (_lcomb(g, j) + _lcomb(n - g, b - j)) - log_total
        total_j = math.comb(b, j)
        for k, v in occupancy_counts(m, s, j).items():
            probs[k * k] += math.exp(log_h) * float(Fraction(v, total_j))
    probs = probs / probs.sum()
    return _truncate(probs, 0.0, kmax * kmax, 0.0)


def _lcomb(n: int, k: int) -> float:
    return float(
        scipy.special.gammaln(n + 1)
        - scipy.special.gammaln(k + 1)
        - scipy.special.gammaln(n - k + 1)
    )


# --------------------------------------------------------------------------- whole run
@lru_cache(maxsize=64)  # calibration asks for the same law at every σ it tries
def sum_squares_law(
    sampling: str,
    num_samples: int,
    num_groups: int,
    group_size: int,
    num_rounds: int,
    group_privacy: int = 1,
    tail_tol: float = 1e-30,
) -> SumSquaresLaw:
    """Law ``q`` of ``c^2 = sum k^2`` after ``num_rounds`` local rounds.

    The law ``q_E(c)`` of van Dijk et al. (arXiv:2212.05796, Section 5), computed exactly
    (their bounds on it are not used). Hypotheses: the replace-one relation, ``g`` times;
    epochs (shuffling) or rounds (subsampling) draw their batches independently of each other
    and of the data, so the total is the convolution of their laws; the lumped tail only makes
    the law stochastically larger, which keeps the mixture an upper bound.

    Parameters
    ----------
    sampling : {"shuffle", "subsample"}
        Sampler of Algorithm 1 (``"poisson"`` is refused: not covered here).
    num_samples, num_groups, group_size, group_privacy : int
        ``N``, ``m``, ``s``, ``g``.
    num_rounds : int
        Local rounds run so far (``E`` epochs = ``E * (N // (m s))`` rounds); shuffling
        treats them as full epochs followed by a partial one.
    tail_tol : float
        Upper-tail mass below which the tail is moved to the maximum (conservative).

    Returns
    -------
    SumSquaresLaw

    Raises
    ------
    ConfigError
        On invalid or uncovered parameters.
    """
    per_epoch = validate_sizes(sampling, num_samples, num_groups, group_size, group_privacy)
    check(
        isinstance(num_rounds, (int, np.integer)) and num_rounds >= 0,
        "num_rounds",
        num_rounds,
        "must be an integer >= 0",
    )
    check(0.0 <= tail_tol < 1e-6, "tail_tol", tail_tol, "must be in [0, 1e-6)")
    # A truncated tail is reused at most num_rounds times per level of repeated squaring.
    tol = tail_tol / ((int(num_rounds) + 1) * (2 * int(num_rounds).bit_length() + 2))
    if sampling == "subsample":
        return _power(
            subsample_round_law(num_samples, num_groups, group_size, group_privacy),
            int(num_rounds),
            tol,
        )
    epochs, rest = divmod(int(num_rounds), per_epoch)
    law = _power(shuffle_epoch_law(num_samples, num_groups, group_size, group_privacy), epochs, tol)
    if rest:
        part = shuffle_epoch_law(num_samples, num_groups, group_size, group_privacy, rest)
        law = _combine(law, part, tol)
    return law
