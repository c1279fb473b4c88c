"""Side-by-side table: pfl 0.6.0 vs fedpriv on the client-level DP workload (project venv).

Accuracy: pfl's from ``run_pfl_client_level.py``'s JSON, fedpriv's from a run's
``metrics.csv`` (columns ``server_round``, ``accuracy``, ``epsilon``). Privacy: ε at
δ = 1e-5 after ``rounds`` rounds of the Gaussian sum (σ = 1, clip C = 1) for each way of
choosing 120 of 6,000 clients, every figure computed here with dp-accounting:

* Poisson sampling, q = 120/6000, add/remove neighbours (sensitivity C): PLD and RDP. This is
  what fedpriv's ``client_sampling=poisson`` earns, and what pfl's accountants compute for
  *any* sampler (they take only ``sampling_probability``).
* Fixed-size sampling WITHOUT replacement of 120 of 6,000, replace-one neighbours: the sum's
  replace-one sensitivity is 2C, so the event noise multiplier is σ/2; RDP
  (``SampledWithoutReplacementDpEvent``; Wang, Balle, Kasiviswanathan, "Subsampled Rényi
  Differential Privacy and Analytical Moments Accountant", arXiv:1808.00087, Theorem 27), with a
  lower bound from one concrete pair of neighbouring datasets.
* pfl's ``random`` user sampler (pfl/data/sampling.py): the 120 slots are drawn independently
  and uniformly, i.e. WITH replacement. dp-accounting has no analysis of it; this script gives a
  rigorous LOWER bound: the ε of one concrete pair of neighbouring datasets (see
  :func:`with_replacement_epsilon_lower`). A lower bound above pfl's printed ε proves that pfl
  under-reports.
* pfl's ``minimize_reuse`` sampler: a fixed cycle over the user ids, no randomness; every user
  is in ``ceil(rounds * 120 / 6000)`` rounds (10 for 500), each a Gaussian release with
  replace-one sensitivity 2C: the exact ε is that of ``k`` composed Gaussians with noise
  multiplier σ/2 (PLD).

Usage: compare.py PFL_JSON [FEDPRIV_METRICS_CSV] [--rounds=R] [--markdown]
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import dp_accounting
import numpy as np
from dp_accounting.pld import common as pld_common
from scipy import stats

NUM_CLIENTS, COHORT, SIGMA, DELTA, ROUNDS = 6000, 120, 1.0, 1e-5, 500
NeighborRel = dp_accounting.NeighboringRelation


def poisson_epsilon_pld(q: float, sigma: float, steps: int, delta: float) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian sums (add/remove, sensitivity 1), PLD.

    Parameters
    ----------
    q : float
        Sampling probability of each client, in (0, 1].
    sigma : float
        Noise standard deviation over the sum's add/remove sensitivity (the clip norm C).
    steps : int
        Number of rounds composed.
    delta : float
        Target δ.

    Returns
    -------
    float
        ε (pessimistic PLD: an upper bound up to dp-accounting's discretization).
    """
    acc = dp_accounting.pld.PLDAccountant(NeighborRel.ADD_OR_REMOVE_ONE)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    return float(acc.compose(event, steps).get_epsilon(delta))


def poisson_epsilon_rdp(q: float, sigma: float, steps: int, delta: float) -> float:
    """ε of the same Poisson-subsampled Gaussian composition from the RDP accountant.

    References
    ----------
    Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
    arXiv:1908.10530.
    """
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=NeighborRel.ADD_OR_REMOVE_ONE)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    return float(acc.compose(event, steps).get_epsilon(delta))


def poisson_replace_one_epsilon_pld(q: float, sigma: float, steps: int, delta: float) -> float:
    """ε of Poisson-subsampled Gaussian sums under replace-one neighbours, PLD (reference row).

    dp-accounting's REPLACE_ONE PLD moves the sampled client's contribution from +C to -C (a 2C
    shift), so the event keeps noise multiplier ``sigma``; its pair
    (1-q)N(0,1) + qN(1/σ,1) vs (1-q)N(0,1) + qN(-1/σ,1) is the one :func:`wor_epsilon_lower`
    evaluates (rounding down instead of up).
    """
    acc = dp_accounting.pld.PLDAccountant(NeighborRel.REPLACE_ONE)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    return float(acc.compose(event, steps).get_epsilon(delta))


def wor_replace_one_epsilon_rdp(n: int, m: int, sigma: float, steps: int, delta: float) -> float:
    """ε of ``steps`` sums over a uniform ``m``-subset of ``n`` clients, replace-one, RDP.

    A clipped sum changes by at most 2C when one client's data is replaced, so the event's
    noise multiplier (noise std over sensitivity) is ``sigma / 2``.

    Parameters
    ----------
    n, m : int
        Population and cohort size (``m <= n``).
    sigma : float
        Noise standard deviation over the clip norm C.
    steps : int
        Rounds composed.
    delta : float
        Target δ.

    Returns
    -------
    float
        An upper bound on ε (RDP).

    References
    ----------
    Wang, Balle, Kasiviswanathan, "Subsampled Rényi Differential Privacy and Analytical Moments
    Accountant", arXiv:1808.00087, Theorem 27.
    """
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=NeighborRel.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        n, m, dp_accounting.GaussianDpEvent(sigma / 2)
    )
    return float(acc.compose(event, steps).get_epsilon(delta))


def cyclic_participations(n: int, m: int, steps: int) -> int:
    """Most rounds any client is in when cohorts of ``m`` walk a fixed cycle of ``n`` ids."""
    return math.ceil(steps * m / n)


def cyclic_replace_one_epsilon_pld(n: int, m: int, sigma: float, steps: int, delta: float) -> float:
    """Exact ε (PLD) of pfl's ``minimize_reuse`` cohorts: a client in ``k`` fixed rounds.

    No sampling randomness, so no amplification: ``k`` = :func:`cyclic_participations`
    Gaussian releases with replace-one sensitivity 2C (noise multiplier ``sigma / 2``).
    """
    k = cyclic_participations(n, m, steps)
    # One Gaussian release's PLD depends only on |f(D) - f(D')| / std <= 2C / (σC): dp-accounting's
    # GaussianDpEvent(σ/2) under ADD_OR_REMOVE_ONE is that shift. (Its PLD REPLACE_ONE already
    # doubles the shift, so GaussianDpEvent(σ/2) there would count 2C twice.)
    acc = dp_accounting.pld.PLDAccountant(NeighborRel.ADD_OR_REMOVE_ONE)
    return float(acc.compose(dp_accounting.GaussianDpEvent(sigma / 2), k).get_epsilon(delta))


def gaussian_epsilon_analytic(mu: float, delta: float) -> float:
    """ε(δ) of one Gaussian mechanism with sensitivity/std ratio ``mu`` (closed form, bisection).

    δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2): Balle and Wang, "Improving the Gaussian Mechanism
    for Differential Privacy: Analytical Calibration and Optimal Denoising", arXiv:1805.06530,
    Theorem 8.
    """

    def d(eps: float) -> float:
        return float(
            stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        )

    lo, hi = 0.0, 1.0
    while d(hi) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


def _one_step_losses(
    p: Sequence[tuple[float, float]], q: Sequence[tuple[float, float]], h: float, span: float
) -> tuple[int, np.ndarray]:
    """Privacy loss L = log p(y)/q(y) under P, rounded DOWN to multiples of ``h``.

    ``p``, ``q``: mixtures of unit-variance normals as (weight, mean). Output: (index of the
    first loss bin, mass per bin). Losses above ``span`` are moved down to ``span``; mass with
    loss below ``-span`` and the far tails of y are dropped. Every change lowers the hockey-stick
    divergence, so the ε computed from it is a lower bound on the pair's ε.
    """
    wp, mp = (np.array(v, dtype=float) for v in zip(*p, strict=True))
    wq, mq = (np.array(v, dtype=float) for v in zip(*q, strict=True))
    lo = min(mp.min(), mq.min()) - 12.0
    hi = max(mp.max(), mq.max()) + 12.0
    edges = np.arange(lo, hi + h / 4, h / 4)  # y cells 4x finer than the loss grid

    def log_mix(w: np.ndarray, m: np.ndarray, y: np.ndarray) -> np.ndarray:
        terms = np.log(w[None, :]) - 0.5 * (y[:, None] - m[None, :]) ** 2
        return np.logaddexp.reduce(terms, axis=1)

    loss_at_edges = log_mix(wp, mp, edges) - log_mix(wq, mq, edges)
    cdf = (wp[None, :] * stats.norm.cdf(edges[:, None] - mp[None, :])).sum(axis=1)
    mass = np.diff(cdf)
    cell_min = np.minimum(loss_at_edges[:-1], loss_at_edges[1:])  # min over a cell if monotone
    steps_up = np.diff(loss_at_edges)
    assert (steps_up >= -1e-12).all() or (steps_up <= 1e-12).all(), "loss not monotone in y"
    keep = cell_min >= -span
    idx = np.floor(np.minimum(cell_min[keep], span) / h).astype(np.int64)
    first = int(idx.min())
    return first, np.bincount(idx - first, weights=mass[keep])


def _epsilon_from_losses(losses: np.ndarray, probs: np.ndarray, delta: float) -> float:
    """Smallest ε with Σ_{L>ε} p (1 - e^(ε-L)) <= δ (bisection; the sum falls in ε)."""
    pos = probs > 0
    losses, probs = losses[pos], probs[pos]

    def d(eps: float) -> float:
        sel = losses > eps
        return float(np.sum(probs[sel] * -np.expm1(eps - losses[sel])))

    if d(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, float(losses.max())
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return lo


def mixture_pair_epsilon_lower(
    p: Sequence[tuple[float, float]],
    q: Sequence[tuple[float, float]],
    steps: int,
    delta: float,
    h: float = 1e-4,
    span: float = 4.0,
) -> float:
    """A lower bound on ε(δ) of ``steps`` independent releases of the pair (P, Q), both ways.

    Parameters
    ----------
    p, q : sequence of (weight, mean)
        The output distributions on neighbouring datasets: mixtures of N(mean, 1) (means in
        units of the noise std). Weights of each sum to 1.
    steps : int
        Releases composed.
    delta : float
        Target δ.
    h : float
        Loss grid (losses are rounded down to it, so the result is a lower bound).
    span : float
        Per-release losses are capped at ``span`` (moved down) and dropped below ``-span``.

    Returns
    -------
    float
        max over the two directions of the ε computed from the rounded-down loss distribution
        (a lower bound on the true ε of this pair, hence on the ε of any mechanism having the
        pair as outputs on neighbouring datasets, up to floating-point error).
    """
    out = 0.0
    for a, b in ((p, q), (q, p)):
        first, probs = _one_step_losses(a, b, h, span)
        low, composed = pld_common.self_convolve(probs, steps, tail_mass_truncation=1e-15)
        composed = np.maximum(np.asarray(composed), 0.0)
        losses = (np.arange(len(composed)) + low + first * steps) * h
        out = max(out, _epsilon_from_losses(losses, composed, delta))
    return out


def with_replacement_pair(n: int, m: int, sigma: float, kmax: int = 8) -> tuple[list, list]:
    """Outputs on neighbouring datasets for ``m`` slots drawn uniformly WITH replacement.

    The replaced client's clipped delta is +C·e on one dataset and -C·e on the other; every
    other client's delta is 0. The client fills K ~ Binomial(m, 1/n) slots (K = k has the same
    probability on both), so the sum along e is N(±kC, σ²C²): P = Σ_k b_k N(k/σ, 1),
    Q = Σ_k b_k N(-k/σ, 1) in noise-std units (K > ``kmax`` dropped, which only lowers ε).
    """
    b = stats.binom.pmf(np.arange(kmax + 1), m, 1.0 / n)
    return [(float(w), k / sigma) for k, w in enumerate(b)], [
        (float(w), -k / sigma) for k, w in enumerate(b)
    ]


def with_replacement_epsilon_lower(n: int, m: int, sigma: float, steps: int, delta: float) -> float:
    """Lower bound on ε of pfl's ``random`` sampler (``m`` slots drawn with replacement).

    The ε of one concrete pair of replace-one neighbouring datasets
    (:func:`with_replacement_pair`); the mechanism's ε is at least this.
    """
    p, q = with_replacement_pair(n, m, sigma)
    return mixture_pair_epsilon_lower(p, q, steps, delta)


def wor_epsilon_lower(n: int, m: int, sigma: float, steps: int, delta: float) -> float:
    """Lower bound on ε for a uniform ``m``-subset of ``n`` (the replaced client is in the
    cohort with probability m/n; its delta is +C·e on one dataset, -C·e on the other)."""
    r = m / n
    p = [(1 - r, 0.0), (r, 1.0 / sigma)]
    q = [(1 - r, 0.0), (r, -1.0 / sigma)]
    return mixture_pair_epsilon_lower(p, q, steps, delta)


def epsilon_table(rounds: int = ROUNDS) -> dict[str, float]:
    """Every ε of the comparison at (n, m, σ, δ) = (6000, 120, 1, 1e-5) after ``rounds``."""
    n, m, s, d = NUM_CLIENTS, COHORT, SIGMA, DELTA
    q = m / n
    return {
        "poisson_pld": poisson_epsilon_pld(q, s, rounds, d),
        "poisson_rdp": poisson_epsilon_rdp(q, s, rounds, d),
        "poisson_replace_one_pld": poisson_replace_one_epsilon_pld(q, s, rounds, d),
        "wor_replace_one_rdp": wor_replace_one_epsilon_rdp(n, m, s, rounds, d),
        "wor_replace_one_lower": wor_epsilon_lower(n, m, s, rounds, d),
        "with_replacement_lower": with_replacement_epsilon_lower(n, m, s, rounds, d),
        "cyclic_exact_pld": cyclic_replace_one_epsilon_pld(n, m, s, rounds, d),
        "cyclic_participations": float(cyclic_participations(n, m, rounds)),
    }


def read_fedpriv_metrics(path: Path) -> dict[int, tuple[float, float]]:
    """``{round: (accuracy, epsilon)}`` from a fedpriv ``metrics.csv`` (rows with accuracy)."""
    out: dict[int, tuple[float, float]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            acc = row.get("accuracy") or ""
            if acc:
                eps = row.get("epsilon") or "nan"
                out[int(row["server_round"])] = (float(acc), float(eps))
    return out


def _stat(values: Sequence[float]) -> str:
    """``mean (min-max)`` of accuracies as fractions, printed in percent."""
    v = 100 * np.asarray(values, dtype=float)
    if len(v) == 1:
        return f"{v[0]:.2f}"
    return f"{v.mean():.2f} ({v.min():.2f}-{v.max():.2f})"


def tail_mean(acc: dict[int, float], rounds: int, last: int = 50) -> float:
    """Mean accuracy over the evaluations in rounds ``rounds-last+1 .. rounds`` (10 apart)."""
    vals = [a for r, a in acc.items() if rounds - last < r <= rounds and r % 10 == 0]
    return float(np.mean(vals))


def main() -> int:
    """Print the accuracy and ε tables (markdown) for the given runs."""
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict((a[2:].split("=", 1) + [""])[:2] for a in sys.argv[1:] if a.startswith("--"))
    pfl_runs = [json.loads(Path(a).read_text()) for a in args if a.endswith(".json")]
    fed_runs = [read_fedpriv_metrics(Path(a)) for a in args if a.endswith(".csv")]
    if not pfl_runs:
        raise SystemExit("usage: compare.py PFL_JSON... [FEDPRIV_METRICS_CSV...] [--rounds=R]")
    rounds = int(opts.get("rounds") or pfl_runs[0]["rounds"])
    pfl_acc = [{int(k): v for k, v in run["accuracy"].items()} for run in pfl_runs]
    fed_acc = [{r: a for r, (a, _) in run.items()} for run in fed_runs]
    samplers = sorted({run["user_sampler"] for run in pfl_runs})
    seeds = [run.get("seed", 0) for run in pfl_runs]
    print(
        f"Test accuracy (%, 10,000 images): pfl user sampler {'/'.join(samplers)}, "
        f"{len(pfl_runs)} run(s) (seeds {seeds}); fedpriv {len(fed_runs)} run(s). "
        "Several runs: mean (min-max)."
    )
    print()
    print("| round | pfl | fedpriv | fedpriv - pfl (points) |")
    print("|---:|---:|---:|---:|")
    marks = [r for r in range(50, rounds + 1, 50)] or [rounds]
    for r in marks:
        p = [a[r] for a in pfl_acc if r in a]
        f = [a[r] for a in fed_acc if r in a]
        diff = f"{100 * (np.mean(f) - np.mean(p)):+.2f}" if f and p else "-"
        print(f"| {r} | {_stat(p) if p else '-'} | {_stat(f) if f else '-'} | {diff} |")
    p_tail = [tail_mean(a, rounds) for a in pfl_acc]
    f_tail = [tail_mean(a, rounds) for a in fed_acc if rounds in a]
    diff = f"{100 * (np.mean(f_tail) - np.mean(p_tail)):+.2f}" if f_tail else "-"
    f_str = _stat(f_tail) if f_tail else "-"
    print(f"| mean of rounds {rounds - 40}-{rounds} | {_stat(p_tail)} | {f_str} | {diff} |")
    eps = epsilon_table(rounds)
    pfl0 = pfl_runs[0]
    fed_eps = [run[max(run)][1] for run in fed_runs if max(run) == rounds]
    print()
    print(
        f"ε at δ = {DELTA:g} after {rounds} rounds (σ = {SIGMA:g}, C = 1, cohorts of 120 of 6,000)"
    )
    print()
    print("| sampler and analysis | ε |")
    print("|---|---:|")
    rows = [
        ("pfl prints, `PLDPrivacyAccountant` (assumes Poisson q = 0.02, add/remove)",
         f"{pfl0['epsilon_pfl_pld']:.3f}"),
        ("pfl prints, `RDPPrivacyAccountant` (assumes Poisson q = 0.02, add/remove)",
         f"{pfl0['epsilon_pfl_rdp']:.3f}"),
        ("fedpriv reports (its ledger, last round)",
         ", ".join(f"{e:.3f}" for e in fed_eps) if fed_eps else "-"),
        ("Poisson q = 0.02 (fedpriv's sampler), add/remove, dp-accounting PLD",
         f"{eps['poisson_pld']:.3f}"),
        ("Poisson q = 0.02 (fedpriv's sampler), add/remove, dp-accounting RDP",
         f"{eps['poisson_rdp']:.3f}"),
        ("Poisson q = 0.02, replace-one (for reference), dp-accounting PLD",
         f"{eps['poisson_replace_one_pld']:.3f}"),
        ("fixed size 120 WITHOUT replacement, replace-one (noise mult. σ/2), RDP upper bound",
         f"{eps['wor_replace_one_rdp']:.3f}"),
        ("fixed size 120 WITHOUT replacement, replace-one, lower bound (one neighbouring pair)",
         f"{eps['wor_replace_one_lower']:.3f}"),
        ("pfl `random` (120 slots WITH replacement), replace-one, lower bound (one pair)",
         f"≥ {eps['with_replacement_lower']:.3f}"),
        (f"pfl `minimize_reuse` (fixed cycle: {int(eps['cyclic_participations'])} rounds per "
         "client, no sampling), replace-one, exact (PLD)", f"{eps['cyclic_exact_pld']:.3f}"),
    ]  # fmt: skip
    for what, v in rows:
        print(f"| {what} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
