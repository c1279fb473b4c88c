"""A check-in client's local randomizer as accounting sees it: its calibration and its event.

Every report a check-in client sends is its local randomizer's output
(:class:`fedpriv.mechanisms.randomizers.LocalRandomizer`), locally differentially private on
its own: the privacy unit is the client, replace-one sensitivity ``2 clipping_norm``. This
module sizes the randomizer's noise for a budget (``local_epsilon``, ``local_delta``) =
(ε0, δ0) and states the event of a client's own releases (its local DP), so the noise a
client draws and the event the ledger composes come from the same numbers.

References
----------
Balle, Wang, "Improving the Gaussian Mechanism for Differential Privacy: Analytical
Calibration and Optimal Denoising" (arXiv:1805.06530), Theorem 8 (analytic Gaussian);
Dwork, McSherry, Nissim, Smith (2006) (Laplace); Dong, Roth, Su, "Gaussian Differential
Privacy" (arXiv:1905.02383), Corollary 2; Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy
Amplification via Random Check-Ins" (arXiv:2007.06605), Section 3 (``A_ldp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from dp_accounting import dp_event

from fedpriv.accounting.accountants.gdp import analytic_gaussian_sigma, gdp_delta, gdp_epsilon
from fedpriv.accounting.core.event import FedprivEvent
from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite, check_positive, parse_enum
from fedpriv.mechanisms.randomizers import LocalRandomizer, RandomizerKind

__all__ = ["randomizer_noise_scale", "calibrated_randomizer", "release_event", "LocalReleaseEvent"]


def randomizer_noise_scale(
    kind: RandomizerKind | str, clipping_norm: float, local_epsilon: float, local_delta: float
) -> float:
    """The noise scale that makes one report (``local_epsilon``, ``local_delta``)-DP.

    ``gaussian``: the analytic Gaussian's std at l2 sensitivity ``2L`` (needs ``delta0`` in
    (0, 1)); ``laplace``: the scale ``b = 2L / eps0`` at l1 sensitivity ``2L`` (pure
    ``eps0``-DP; needs ``delta0 = 0``).

    Bounds: the analytic Gaussian mechanism (Balle, Wang, arXiv:1805.06530, Theorem 8) and the
    Laplace mechanism (Dwork, Roth 2014, Theorem 3.6). Hypotheses: local DP, i.e. any two
    inputs of one client (the replace-one relation at the client): two clipped reports differ
    by at most ``2L`` in l2 (Gaussian) or l1 (Laplace), so ``L`` must be the clip the
    randomizer applies in that norm.

    Parameters
    ----------
    kind : RandomizerKind or str
    clipping_norm : float
        ``L > 0`` (the l2 or l1 clip of a report).
    local_epsilon, local_delta : float
        ``eps0 > 0`` and ``delta0``.

    Returns
    -------
    float
        The Gaussian std or the Laplace scale, in the units of the update.

    Raises
    ------
    ConfigError
        Naming ``client.randomizer`` or ``privacy.<field>`` for an out-of-range value or a
        budget the randomizer cannot meet.
    """
    kind = parse_enum(RandomizerKind, "client.randomizer", kind)
    clip = check_finite("privacy.clipping_norm", clipping_norm)
    eps0 = check_finite("privacy.local_epsilon", local_epsilon)
    delta0 = check_finite("privacy.local_delta", local_delta)
    check(clip > 0, "privacy.clipping_norm", clipping_norm, "must be > 0")
    check(eps0 > 0, "privacy.local_epsilon", local_epsilon, "must be > 0")
    if kind is RandomizerKind.GAUSSIAN:
        check(
            0.0 < delta0 < 1.0,
            "privacy.local_delta",
            local_delta,
            "must be in (0, 1) for the gaussian randomizer "
            "(use client.randomizer=laplace for pure eps0-DP)",
        )
        return analytic_gaussian_sigma(eps0, delta0, 2.0 * clip)
    check(
        delta0 == 0.0,
        "privacy.local_delta",
        local_delta,
        "must be 0 for the laplace randomizer (pure eps0-DP)",
    )
    return 2.0 * clip / eps0


def calibrated_randomizer(
    kind: RandomizerKind | str, clipping_norm: float, local_epsilon: float, local_delta: float
) -> LocalRandomizer:
    """The :class:`LocalRandomizer` whose every report is (``local_epsilon``,
    ``local_delta``)-DP (:func:`randomizer_noise_scale`: Balle, Wang, arXiv:1805.06530,
    Theorem 8, or the Laplace mechanism; hypotheses: local DP, replace-one relation at the
    client, sensitivity ``2 clipping_norm``).

    Raises
    ------
    ConfigError
        As :func:`randomizer_noise_scale`.
    """
    scale = randomizer_noise_scale(kind, clipping_norm, local_epsilon, local_delta)
    return LocalRandomizer(kind, clipping_norm, scale)  # type: ignore[arg-type]


def release_event(randomizer: LocalRandomizer) -> LocalReleaseEvent:
    """One release of ``randomizer``: its noise scale in units of its sensitivity ``2L``.

    The event's bound is :class:`LocalReleaseEvent`'s (Dong, Roth, Su, arXiv:1905.02383, for
    the Gaussian; dp-accounting's Laplace PLD); hypotheses: the replace-one relation at the
    client, whose two clipped reports differ by at most ``2L``.
    """
    return LocalReleaseEvent(randomizer.kind.value, randomizer.noise_scale / randomizer.sensitivity)


@dataclass(frozen=True)
class LocalReleaseEvent(FedprivEvent):
    """A client's own releases of its local randomizer (its local DP), in sensitivity units.

    ``noise_multiplier`` is the Gaussian std (or Laplace scale) divided by the replace-one
    sensitivity ``2L``. ``count`` Gaussian releases are exactly ``G_mu`` with
    ``mu = sqrt(count) / noise_multiplier`` (Gaussian differential privacy); ``count`` Laplace
    releases compose through dp-accounting's PLD of the sensitivity-1 Laplace mechanism (the
    two neighbouring outputs differ by at most one sensitivity unit, dp-accounting's
    add/remove case), or by basic composition ``count / noise_multiplier`` (= ``count eps0``)
    when ``eps0 > 20``, where the PLD grid would not fit in memory and basic composition is
    within a rounding of it.

    Raises
    ------
    ConfigError
        For an unknown ``kind`` or a ``noise_multiplier`` that is not finite and > 0.

    References
    ----------
    Dong, Roth, Su, "Gaussian Differential Privacy" (arXiv:1905.02383), Corollary 2
    (composition of Gaussian mechanisms).
    """

    kind: str
    noise_multiplier: float

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one", "add_remove"})

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "kind", parse_enum(RandomizerKind, "kind", self.kind).value)
        nm = check_positive("noise_multiplier", self.noise_multiplier, "must be finite and > 0")
        set_(self, "noise_multiplier", nm)

    def _pld(self, count: int) -> Any:
        from dp_accounting.pld import pld_privacy_accountant

        acc = pld_privacy_accountant.PLDAccountant()
        acc.compose(dp_event.LaplaceDpEvent(self.noise_multiplier), int(count))
        return acc

    def _basic(self) -> bool:
        return self.kind == RandomizerKind.LAPLACE and 1.0 / self.noise_multiplier > 20.0

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        if self.kind == RandomizerKind.GAUSSIAN:
            return gdp_epsilon(target_delta, math.sqrt(count) / self.noise_multiplier)
        if self._basic():
            return count / self.noise_multiplier
        return float(self._pld(count).get_epsilon(target_delta))

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        if self.kind == RandomizerKind.GAUSSIAN:
            return float(gdp_delta(target_epsilon, math.sqrt(count) / self.noise_multiplier))
        if self._basic():
            return 0.0 if target_epsilon >= count / self.noise_multiplier else 1.0
        return float(self._pld(count).get_delta(target_epsilon))
