"""Lower bounds on ε: how much room an upper bound leaves.

For each event kind below, a pair of neighbouring datasets realises the event's worst-case
pair of output distributions in EVERY round (so the rounds compose as that pair does), and
that pair's PLD, discretized OPTIMISTICALLY (probability mass rounded towards smaller loss,
tails dropped), gives a δ(ε) that is at most the true one. The ε it answers is therefore at
most the ε of the mechanism: a valid lower bound, however the upper bound was computed.

* Gaussian without sampling: exact (μ-GDP), lower bound = upper bound (an optimistic PLD
  when composed with other events).
* Poisson-sampled Gaussian: the remove and add pairs of dataset D and D minus one client
  whose clipped contribution is C every round, others contributing 0.
* Fixed size without replacement (replace-one): the two pairs of
  :mod:`fedpriv.accounting.samplers.fixed_size` (``lower_pld``).
* Random allocation: ``pld-accounting``'s lower PLD (``BoundType.IS_DOMINATED``); a partial
  epoch: its first round alone (a Poisson-sampled Gaussian at rate 1/t); k > 1: the first
  round alone, or (whole epochs only) a 99 %-confidence Monte Carlo bound of the k-of-t pair
  (:mod:`fedpriv.accounting.accountants.monte_carlo`).
* Random check-ins with central Gaussian slot sums: a pass's first slot alone (the Gaussian
  sampled at ``p0 / m``).

Any fedpriv event with a ``lower_pld()`` method is covered the same way; other events have no
lower bound here (``None``). The events must come from an analysis whose sensitivity is
attained: DP-FTRL's accounted Gaussians are not (its sensitivity can be an upper bound, the |X|
relaxation of :mod:`fedpriv.mechanisms.mf_sensitivity`); :mod:`fedpriv.accounting.ftrl.lower`
gives this function events that are, from the noise its stream generates.

References
----------
Doroshenko, Ghazi, Kamath, Kumar, Manurangsi (arXiv:2207.04380), optimistic PLDs; Feldman,
Shenfeld (arXiv:2602.17284), random allocation's lower bound; Wang, Mahloujifar, Wu, Jia,
Mittal (arXiv:2304.07927), Monte Carlo accounting.
"""

from __future__ import annotations

from typing import Any

from dp_accounting import dp_event

from fedpriv.accounting.accountants.gdp import gaussian_mu, gaussian_noise_multiplier, gdp_epsilon
from fedpriv.accounting.accountants.monte_carlo import allocation_epsilon_estimate
from fedpriv.accounting.accountants.pld_grid import (
    LOWER_DISCRETIZATION,
    compose_on_common_grid,
    optimistic_gaussian_pld,
)
from fedpriv.accounting.samplers.fixed_size import WithoutReplacementGaussianEvent
from fedpriv.common.errors import check

#: First pass: an optimistic loss grid of at most LOWER_DISCRETIZATION and at most this
#: budget over the composed occurrences (each loss is rounded down by less than the grid, so
#: the composed ε by less than the budget)...
LOWER_ROUNDING_BUDGET = 0.05
#: ...never finer than this (memory and time)...
FIRST_FINEST = 5e-6
#: ...second pass: a budget of this fraction of the first pass's ε (itself a lower bound, so
#: at most this fraction of the true ε is lost to rounding: 12 of 6,000 clients, z = 7.558,
#: 500 rounds, δ = 1e-5, first pass 0.0092 on 1e-4, second 0.0339 on 1e-6, upper 0.0372)...
LOWER_ROUNDING_FRACTION = 0.01
#: ...on a grid never finer than this (memory and time: 1.3 s and 125 MB there)...
LOWER_FINEST = 1e-6
#: ...nor than the first ε over this many points (the composed PLD's size: 9,370 steps at
#: q = 0.001, z = 1 stay on the first pass's 5.3e-6, 0.436, 25 s, where 1e-6 would take
#: 150 s and 1.5 GB); the second pass runs only where its grid is at least twice as fine...
LOWER_MAX_POINTS = 100_000
#: ...and the first pass's rounding budget exceeds this fraction of its answer (q = 0.02,
#: z = 1, 500 rounds: budget 0.05 against 2.748, which a 3e-5 grid leaves unchanged at 4x
#: the time).
LOWER_REFINE_ABOVE = 0.1
#: The smallest δ the optimistic PLDs answer at: a smaller target is answered at this δ (a
#: valid, looser lower bound). At δ = 1e-14 dp-accounting's FFT composition of 10 Poisson
#: steps (q = 0.01, z = 1) put its rounding noise into δ and answered 3.029 where the exact
#: ε lies in [3.013, 3.015].
LOWER_MIN_DELTA = 1e-8


def epsilon_lower_bound(events: list[tuple[Any, int]], target_delta: float) -> float | None:
    """A lower bound on the ε at ``target_delta`` of ``events`` (``[(event, count), ...]``)
    composed; ``None`` when an event has no lower bound here.

    Whole epochs of random allocation with ``k > 1`` (and nothing else): the larger of the
    first-round PLD bound and the Monte Carlo lower bound of the k-of-t pair itself
    (:func:`~fedpriv.accounting.accountants.monte_carlo.allocation_epsilon_estimate`: empirical
    Bernstein,
    Maurer and Pontil, arXiv:0907.3740, Thm. 4), which holds with probability at least
    :data:`~fedpriv.accounting.accountants.monte_carlo.MC_CONFIDENCE` (99 %) over its seeded
    sample: a
    statistical bound, not a sure one (2 of 4 rounds, σ = 1, δ = 1e-3: 3.488, where round
    one alone gives 2.272 and the estimate is 3.541). Every other answer is a sure bound.

    Two passes: the optimistic PLDs on a grid whose rounding costs at most
    :data:`LOWER_ROUNDING_BUDGET` in all (floor :data:`FIRST_FINEST`), then on one whose
    rounding costs at most :data:`LOWER_ROUNDING_FRACTION` of the first answer where the
    first budget exceeds :data:`LOWER_REFINE_ABOVE` of it (floors
    :data:`LOWER_FINEST`, :data:`LOWER_MAX_POINTS`); the larger of the two, each a lower
    bound (every loss rounded down, by less than the grid).

    Source: optimistic PLDs (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi,
    arXiv:2207.04380); exact μ-GDP for Gaussians without sampling (Dong, Roth, Su,
    arXiv:1905.02383, Corollary 2.13). Hypotheses: under the ledger's neighbouring relation
    (add/remove for Poisson sampling and random allocation, replace-one for fixed-size
    cohorts), one pair of neighbouring datasets realises each event's lower pair in EVERY
    occurrence (a record at full sensitivity all along), so the occurrences compose as that
    pair does; an event whose sensitivity is only an upper bound must not be passed here.

    Raises
    ------
    ConfigError
        If ``target_delta`` is not in (0, 1).
    """
    bound = _pld_lower_bound(events, target_delta)
    if bound is None or not any(getattr(e, "num_selected", 1) > 1 for e, _ in events):
        return bound
    estimate = allocation_epsilon_estimate(events, target_delta)
    return bound if estimate is None else max(bound, estimate.lower)


def _pld_lower_bound(events: list[tuple[Any, int]], target_delta: float) -> float | None:
    """The sure lower bound: exact GDP, or the optimistic PLDs in two passes."""
    mu = gaussian_mu(events)
    if mu is not None:
        return gdp_epsilon(target_delta, mu)
    check(0 < target_delta < 1, "target_delta", target_delta, "must be in (0, 1)")
    # ε(δ) falls as δ grows, so the bound at a larger δ is a lower bound at δ too; below
    # LOWER_MIN_DELTA the FFT convolutions' rounding noise is of the order of δ itself.
    target_delta = max(float(target_delta), LOWER_MIN_DELTA)
    occurrences = max(1, sum(count for _, count in events))
    coarse = max(FIRST_FINEST, min(LOWER_DISCRETIZATION, LOWER_ROUNDING_BUDGET / occurrences))
    first = _composed_lower(events, coarse, target_delta)
    if first is None or coarse * occurrences <= LOWER_REFINE_ABOVE * first:
        return first
    fine = max(
        LOWER_FINEST,
        first / LOWER_MAX_POINTS,
        min(coarse, LOWER_ROUNDING_FRACTION * first / occurrences),
    )
    if fine > coarse / 2:
        return first
    second = _composed_lower(events, fine, target_delta)
    return first if second is None else max(first, second)


def _composed_lower(events: list[tuple[Any, int]], interval: float, delta: float) -> float | None:
    """ε at ``delta`` of the events' optimistic PLDs on a loss grid of ``interval``, composed
    (every loss rounded down: a lower bound at any grid); ``None`` without a lower PLD."""
    total = None
    for event, count in events:
        pld = _lower_pld(event, interval)
        if pld is None:
            return None
        pld = pld.self_compose(count)
        total = pld if total is None else compose_on_common_grid(total, pld, pessimistic=False)
    if total is None:
        return None
    return max(0.0, float(total.get_epsilon_for_delta(delta)))


def _lower_pld(event: Any, interval: float) -> Any:
    """The optimistic PLD of one occurrence on a loss grid of ``interval``, or ``None``."""
    if hasattr(event, "lower_pld"):  # a fedpriv event that knows a dominated PLD
        return event.lower_pld(interval)
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent):  # the RDP path's event
        inner = gaussian_noise_multiplier(event.event)  # z/2 per unit of the 2C sensitivity
        if inner is None or inner <= 0:
            return None
        m, n = event.sample_size, event.source_dataset_size
        return WithoutReplacementGaussianEvent(2 * inner, m, n).lower_pld(interval)
    sampled = isinstance(event, dp_event.PoissonSampledDpEvent)
    sigma = gaussian_noise_multiplier(event.event if sampled else event)
    if sigma is None or sigma <= 0:
        return None
    rate = float(event.sampling_probability) if sampled else 1.0
    return optimistic_gaussian_pld(sigma, rate, interval)
