"""Client-level DP-FedAvg with integer Skellam noise shares: its spec.

Each client encodes its clipped delta (L2 <= C, flattened) as integers and adds its share
Sk(μ/m) of the Skellam noise; the modular sum over the m clients carries Sk(μ), μ = (s z C)²/2:
one Skellam release per round in which a client (the privacy unit) contributes ONE rounded
vector. The scale, mechanism and events are those of the record-level
:class:`fedpriv.accounting.skellam.SkellamSpec` with ``steps=1``, ``sample_rate=1``,
``local_samples=1`` and ``max_grad_norm`` = C, exactly what ``fedpriv-account skellam``
builds from the same settings.

References
----------
Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially Private Federated Learning"
(arXiv:2110.04995), Thm 3.5; McMahan et al. 2018 (arXiv:1710.06963), Alg. 1.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

from fedpriv.accounting.client_level.spec import ClientLevelSpec
from fedpriv.accounting.core.privacy_spec import EventRuns
from fedpriv.accounting.core.vocabulary import Accountant
from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.mechanisms.modular_range import DEFAULT_WRAP_STDDEVS, ScaleRule, SignalGrowth
from fedpriv.mechanisms.skellam_noise import DEFAULT_BETA, SkellamMechanism


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientLevelSkellamSpec(ClientLevelSpec):
    """:class:`ClientLevelSpec` (family ``client_level_skellam``) whose noise is integer Skellam
    shares: the events are the Skellam release's (RDP only), not the Gaussian's.

    ``privacy=client_level_skellam`` (which ``client=client_level_skellam`` selects) builds it
    with the client-level ``privacy`` keys and the RDP accountant by default; the client binds
    every field below (its config keys and the model dimension), none is a ``privacy`` key.

    Parameters
    ----------
    accountant : {"rdp"}
        The Skellam mechanism's only analysis is an RDP bound (``pld`` is refused).
    bits : int
        Width of the modular secure sum (2..62).
    rotation : bool
        Randomized Hadamard rotation before rounding (required by the probabilistic rule).
    scale_rule, wrap_stddevs, signal_growth
        How the scale is chosen (:mod:`fedpriv.mechanisms.modular_range`).
    beta : float
        Conditional rounding parameter in [0, 1).
    dropout_tolerance : int
        Clients that may drop out while the survivors' shares still sum to Sk(μ).
    num_params : int
        Model dimension d (0 while unbound).
    (and the fields of :class:`ClientLevelSpec`; ``noise_shares`` is the m of the shares)

    Raises
    ------
    ConfigError
        As :class:`ClientLevelSpec`, and as :class:`SkellamSpec` (``privacy.accountant`` must
        be rdp; ``client.bits`` too small for the sum not to wrap, ...).
    """

    family: ClassVar[str] = "client_level_skellam"
    bound_fields: ClassVar[tuple[str, ...]] = (
        *ClientLevelSpec.bound_fields,
        "bits",
        "rotation",
        "beta",
        "dropout_tolerance",
        "num_params",
        "scale_rule",
        "wrap_stddevs",
        "signal_growth",
    )

    accountant: Accountant = Accountant.RDP
    bits: int = 32
    rotation: bool = True
    scale_rule: ScaleRule = ScaleRule.PROBABILISTIC
    wrap_stddevs: float = DEFAULT_WRAP_STDDEVS
    signal_growth: SignalGrowth = SignalGrowth.LINEAR
    beta: float = DEFAULT_BETA
    dropout_tolerance: int = 0
    num_params: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        # validates the Skellam fields (σ pending calibration: any positive value)
        skellam = self.skellam_with(self.noise_multiplier or 1.0)
        if self.num_params and self.noise_shares and self.noise_multiplier:
            skellam.mechanism  # noqa: B018 - validates bits now, before training

    def skellam_with(self, noise_multiplier: float) -> SkellamSpec:
        """The record-level Skellam spec of one rounded vector per client per round at
        ``noise_multiplier`` (σ of the summed noise per unit C)."""
        return SkellamSpec(
            noise_multiplier=noise_multiplier,
            sample_rate=1.0,
            steps=1,
            max_grad_norm=self.clipping_norm,
            num_clients=self.noise_shares or 1,
            normalizer=1.0,
            accountant=self.accountant,
            conversion=self.conversion,
            target_delta=self.target_delta,
            bits=self.bits,
            num_params=self.num_params,
            rotation=self.rotation,
            beta=self.beta,
            dropout_tolerance=self.dropout_tolerance,
            local_samples=1,
            scale_rule=self.scale_rule,
            wrap_stddevs=self.wrap_stddevs,
            signal_growth=self.signal_growth,
        )

    @functools.cached_property
    def skellam(self) -> SkellamSpec:
        """THE Skellam spec of the run (the noise multiplier must be set)."""
        return self.skellam_with(self.sigma)

    @property
    def mechanism(self) -> SkellamMechanism:
        """The clients' (and decoder's) mechanism."""
        return self.skellam.mechanism

    def round_events(self) -> EventRuns:
        """One Skellam release of the sum of the clients' rounded vectors."""
        return self.skellam.round_events()

    def degraded_round_events(self, contributors: int) -> EventRuns:
        """Only ``contributors`` clients' shares in the sum (``SkellamSpec``'s)."""
        return self.skellam.degraded_round_events(contributors)

    def _hint(self, target: float, num_rounds: int) -> None:
        """No bracket: the Skellam release (one per round, rate 1) is as fast to account
        under every cohort sampling."""
        return None

    def extra_summary(self) -> dict[str, Any]:
        """:class:`ClientLevelSpec`'s and the Skellam mechanism's parameters."""
        out = super().extra_summary()
        if self.noise_multiplier and self.num_params and self.noise_shares:
            skip = ("normalizer", "family")
            skellam = {k: v for k, v in self.skellam.summary().items() if k not in skip}
            out.update(skellam)
        out["mechanism"] = "skellam"
        return out
