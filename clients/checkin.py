"""Random check-ins, client side: the check-in decision and one locally randomized update.

Second paper (Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random
Check-Ins", ../shared/papers/random-check-ins.txt; PRIVACY-SPEC section 2). The server never
samples clients: it sends a check-in query (a Flower ``query`` message) to every node, and
each client, with ITS OWN randomness, participates with probability ``checkin_probability``
``p0`` and picks a slot uniformly from its window ``R_j`` (Definition of an ``(R_j, p_j)``
check-in). It remembers the slot in its Flower ``Context.state`` and answers with the slot or
``ABSTAIN``. When the server later asks it for the update of that slot it computes, at the
model it receives, the gradient of its mean loss over its own data, clips it to
``clipping_norm`` ``L`` and applies a local randomizer:

* ``gaussian``: l2 clip, ``N(0, sigma^2 I)`` with ``sigma`` the analytic-Gaussian calibration
  (Balle & Wang 2018) to (``local_epsilon``, ``local_delta``) at l2 sensitivity ``2L``
  (replace-one: one client's clipped gradient can move anywhere in a ball of radius ``L``);
* ``laplace``: l1 clip, i.i.d. ``Laplace(2L / local_epsilon)`` per coordinate: a pure
  ``local_epsilon``-DP randomizer (l1 sensitivity ``2L``), so the pure theorems apply.

A dummy update is the randomizer applied to no data (the zero vector): pure noise.

Variants (``client.variant``; the privacy event follows it): ``fixed`` (Algorithm 1,
Theorem 3.2), ``averaged`` (Algorithm 2, Theorem 4.1, ``p0 = 1``), ``sliding-window``
(Section 4.2, Theorem 4.3, client ``j`` checks into ``{j, ..., j+m-1}``, ``p0 = 1``), and the
baseline ``poisson``: server-side Poisson subsampling of clients at ``client_sample_rate``
(not possible in real FL; accounted as a mixture over how often the target reports,
:class:`PoissonLocalEvent`). A client is one Flower node; its privacy unit is all its rows
(neighbouring data sets differ in one client's data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import scipy.stats
import torch
from dp_accounting import dp_event
from flwr.app import ConfigRecord, Context, Message, RecordDict
from torch import nn

from clients.base import ClientAlgorithm, ClientData, TrainContext
from fedpriv.accounting.checkin import CheckinEvent, optimal_composition_delta
from fedpriv.accounting.gdp import analytic_gaussian_sigma, gdp_delta
from fedpriv.accounting.ledger import FedprivEvent
from fedpriv.clipping import clip_tensors
from fedpriv.errors import ConfigError, check
from fedpriv.wire import ABSTAIN, CHECKIN_KEY

__all__ = [
    "VARIANTS",
    "RANDOMIZERS",
    "ABSTAIN",
    "CHECKIN_KEY",
    "checkin_window",
    "checkin_rng",
    "draw_checkin",
    "LocalRandomizer",
    "LocalReleaseEvent",
    "PoissonLocalEvent",
    "CheckinClient",
]

VARIANTS = ("fixed", "averaged", "sliding-window", "poisson")
RANDOMIZERS = ("gaussian", "laplace")
_CHECKIN_STREAM = 0x636B  # domain separation of the check-in RNG from the noise RNG


# --------------------------------------------------------------------------- check-in
def checkin_window(variant: str, num_slots: int, partition_id: int) -> tuple[int, int]:
    """Client ``j``'s window ``R_j`` as an inclusive 1-based slot range ``(first, last)``.

    ``fixed`` / ``averaged``: ``[1, m]`` (``R_j = [m]``); ``sliding-window``: client ``j =
    partition_id + 1`` wakes at time ``j`` and its window is ``{j, ..., j + m - 1}`` (Section
    4.2). ``poisson`` has no check-in.

    Raises
    ------
    ConfigError
        For an unknown variant or a negative ``partition_id``.
    """
    check(partition_id >= 0, "partition_id", partition_id, "must be >= 0")
    if variant in ("fixed", "averaged"):
        return 1, int(num_slots)
    if variant == "sliding-window":
        j = int(partition_id) + 1
        return j, j + int(num_slots) - 1
    raise ConfigError(
        "client.variant",
        variant,
        "has no check-in window (one of: fixed, averaged, sliding-window)",
    )


def checkin_rng(
    seed: int, server_round: int, partition_id: int, secure_mode: bool
) -> np.random.Generator:
    """The client's own check-in RNG: seeded from ``(seed, pass, partition_id)`` or OS entropy."""
    if secure_mode:
        return np.random.default_rng()
    return np.random.default_rng([int(seed), int(server_round), int(partition_id), _CHECKIN_STREAM])


def draw_checkin(
    rng: np.random.Generator, checkin_probability: float, window: tuple[int, int]
) -> int:
    """An ``(R_j, p0)`` check-in: with probability ``p0`` a slot uniform on ``window``, else ``ABSTAIN``."""
    if rng.random() >= checkin_probability:
        return ABSTAIN
    first, last = window
    return int(rng.integers(first, last + 1))


# --------------------------------------------------------------------------- randomizer
def _laplace(
    shape: torch.Size, scale: float, generator: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """i.i.d. Laplace(0, scale) as the difference of two Exp(1) draws (no log(0) possible)."""
    e1 = torch.empty(shape, dtype=torch.float64, device=generator.device).exponential_(
        generator=generator
    )
    e2 = torch.empty(shape, dtype=torch.float64, device=generator.device).exponential_(
        generator=generator
    )
    return (scale * (e1 - e2)).to(dtype)


@dataclass(frozen=True)
class LocalRandomizer:
    """The local randomizer ``A_ldp``: clip to ``clipping_norm`` and add calibrated noise.

    Parameters
    ----------
    kind : {"gaussian", "laplace"}
        ``gaussian``: l2 clip, Gaussian noise calibrated by the analytic Gaussian mechanism to
        (``local_epsilon``, ``local_delta``) at l2 sensitivity ``2 clipping_norm``;
        ``laplace``: l1 clip, Laplace noise of scale ``2 clipping_norm / local_epsilon``
        (pure ``local_epsilon``-DP; needs ``local_delta = 0``).
    clipping_norm : float
        ``L > 0`` (norm of the clipped update; l2 or l1 by ``kind``).
    local_epsilon : float
        ``eps0 > 0``.
    local_delta : float
        ``delta0``: in (0, 1) for ``gaussian``, 0 for ``laplace``.

    Raises
    ------
    ConfigError
        On out-of-range values (field names as in the ``privacy`` group).

    References
    ----------
    Balle & Wang (2018), Theorem 8 (analytic Gaussian); Dwork et al. (2006) (Laplace).
    """

    kind: str
    clipping_norm: float
    local_epsilon: float
    local_delta: float = 0.0

    def __post_init__(self) -> None:
        check(
            self.kind in RANDOMIZERS,
            "client.randomizer",
            self.kind,
            "must be one of: gaussian, laplace",
        )
        check(
            math.isfinite(self.clipping_norm) and self.clipping_norm > 0,
            "privacy.clipping_norm",
            self.clipping_norm,
            "must be > 0",
        )
        check(
            math.isfinite(self.local_epsilon) and self.local_epsilon > 0,
            "privacy.local_epsilon",
            self.local_epsilon,
            "must be > 0",
        )
        if self.kind == "gaussian":
            check(
                0.0 < self.local_delta < 1.0,
                "privacy.local_delta",
                self.local_delta,
                "must be in (0, 1) for the gaussian randomizer (use client.randomizer=laplace for pure eps0-DP)",
            )
        else:
            check(
                self.local_delta == 0.0,
                "privacy.local_delta",
                self.local_delta,
                "must be 0 for the laplace randomizer (pure eps0-DP)",
            )

    @property
    def sensitivity(self) -> float:
        """Replace-one sensitivity of the clipped update: ``2L`` (l2 or l1 by ``kind``)."""
        return 2.0 * self.clipping_norm

    @property
    def noise_stddev(self) -> float:
        """Per-coordinate noise std: ``sigma`` (gaussian) or ``sqrt(2) b`` (laplace)."""
        if self.kind == "gaussian":
            return analytic_gaussian_sigma(self.local_epsilon, self.local_delta, self.sensitivity)
        return math.sqrt(2.0) * self.laplace_scale

    @property
    def laplace_scale(self) -> float:
        """Laplace scale ``b = 2L / eps0`` (laplace only)."""
        return self.sensitivity / self.local_epsilon

    def clip(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Clip the concatenation of ``tensors`` to l2 (gaussian) or l1 (laplace) norm ``L``."""
        keys = list(tensors)
        if self.kind == "gaussian":
            return dict(
                zip(keys, clip_tensors([tensors[k] for k in keys], self.clipping_norm), strict=True)
            )
        norm = sum(float(t.double().abs().sum()) for t in tensors.values())
        factor = min(1.0, self.clipping_norm / norm) if norm > 0 else 1.0
        return {k: t * factor for k, t in tensors.items()}

    def noise(
        self,
        shapes: dict[str, tuple[int, ...]],
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
    ) -> dict[str, torch.Tensor]:
        """The randomizer applied to no data (a dummy update): noise of the given shapes."""
        out: dict[str, torch.Tensor] = {}
        for k, shape in shapes.items():
            size = torch.Size(shape)
            if self.kind == "gaussian":
                out[k] = (
                    self.noise_stddev
                    * torch.randn(
                        size, generator=generator, dtype=torch.float64, device=generator.device
                    )
                ).to(dtype)
            else:
                out[k] = _laplace(size, self.laplace_scale, generator, dtype)
        return out

    def randomize(
        self, tensors: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """``A_ldp``: clip, then add the noise (shapes and dtypes kept)."""
        clipped = self.clip(tensors)
        noise = self.noise({k: tuple(t.shape) for k, t in clipped.items()}, generator)
        return {k: clipped[k] + noise[k].to(clipped[k].dtype) for k in clipped}

    def local_event(self) -> LocalReleaseEvent:
        """One release of this randomizer: noise in units of its sensitivity ``2L``."""
        scale = self.noise_stddev if self.kind == "gaussian" else self.laplace_scale
        return LocalReleaseEvent(self.kind, scale / self.sensitivity)


@dataclass(frozen=True)
class LocalReleaseEvent(FedprivEvent):
    """A client's own releases of its local randomizer (its local DP), in sensitivity units.

    ``noise_multiplier`` is the Gaussian std (or Laplace scale) divided by the replace-one
    sensitivity ``2L``; ``count`` releases compose exactly through dp-accounting's PLD of the
    sensitivity-1 Gaussian / Laplace mechanism (the two neighbouring outputs differ by at
    most one sensitivity unit, which is what dp-accounting's add/remove case models).
    """

    kind: str
    noise_multiplier: float

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one", "add_remove"})

    def _pld(self, count: int) -> Any:
        from dp_accounting.pld import pld_privacy_accountant

        event: dp_event.DpEvent = (
            dp_event.GaussianDpEvent(self.noise_multiplier)
            if self.kind == "gaussian"
            else dp_event.LaplaceDpEvent(self.noise_multiplier)
        )
        acc = pld_privacy_accountant.PLDAccountant()
        acc.compose(event, int(count))
        return acc

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        return 0.0 if count == 0 else float(self._pld(count).get_epsilon(target_delta))

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        return 0.0 if count == 0 else float(self._pld(count).get_delta(target_epsilon))


# --------------------------------------------------------------------------- poisson baseline event
@dataclass(frozen=True)
class PoissonLocalEvent(FedprivEvent):
    """``steps`` model steps, each averaging the local reports of Poisson-sampled clients.

    The server samples each client at rate ``q = sample_rate`` per step and releases the mean
    of the sampled clients' randomized reports. Unlike a check-in slot (which always carries
    exactly one report, a dummy when empty), the number of reports is not fixed, so the
    target's participation may be visible: the worst case reveals it. Over ``T = count *
    steps`` steps the target reports ``K ~ Binomial(T, q)`` times (independently of its
    data) and, given ``K = k``, the release is the ``k``-fold composition of the randomizer:

    ``delta(eps) = sum_k P(K = k) delta_k(eps)`` (PRIVACY-SPEC section 0, mixture with the
    component revealed), with ``delta_k`` the optimal composition of ``k`` pure ``eps0``-DP
    mechanisms (Kairouz, Oh, Viswanath 2015, Theorem 3.3; ``mu is None``) or exactly
    ``delta_{G_{sqrt(k) mu}}(eps)`` for the Gaussian randomizer with ``mu = 2L / sigma``.
    The Binomial tail beyond ``k_max`` (at most ``1e-3 target_delta``) is charged to delta.

    Raises
    ------
    ConfigError
        On out-of-range fields.
    """

    local_epsilon: float
    sample_rate: float
    steps: int
    mu: float | None = None

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one"})

    def __post_init__(self) -> None:
        check(self.local_epsilon > 0, "privacy.local_epsilon", self.local_epsilon, "must be > 0")
        check(
            0 < self.sample_rate <= 1,
            "client.client_sample_rate",
            self.sample_rate,
            "must be in (0, 1]",
        )
        check(
            int(self.steps) == self.steps and self.steps >= 1,
            "steps",
            self.steps,
            "must be an integer >= 1",
        )
        check(self.mu is None or self.mu > 0, "mu", self.mu, "must be > 0 or None")

    def _delta_k(self, k: int, eps: float) -> float:
        if self.mu is not None:
            return float(gdp_delta(eps, math.sqrt(k) * self.mu))
        return optimal_composition_delta(self.local_epsilon, 0.0, k, eps)

    def _mixture(self, count: int, target_delta: float) -> tuple[np.ndarray, np.ndarray, float]:
        total = int(count) * int(self.steps)
        kmax = min(
            total, int(scipy.stats.binom.isf(1e-3 * target_delta, total, self.sample_rate)) + 1
        )
        ks = np.arange(1, kmax + 1)
        return (
            ks,
            scipy.stats.binom.pmf(ks, total, self.sample_rate),
            float(scipy.stats.binom.sf(kmax, total, self.sample_rate)),
        )

    def _delta_at(self, eps: float, ks: np.ndarray, w: np.ndarray, tail: float) -> float:
        return tail + float(
            sum(wk * self._delta_k(int(k), eps) for k, wk in zip(ks, w, strict=True) if wk > 0)
        )

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        check(0 < target_delta < 1, "target_delta", target_delta, "must be in (0, 1)")
        if count == 0:
            return 0.0
        ks, w, tail = self._mixture(count, target_delta)
        if self._delta_at(0.0, ks, w, tail) <= target_delta:
            return 0.0
        hi = 1.0
        while self._delta_at(hi, ks, w, tail) > target_delta:
            hi *= 2.0
            if hi > 1e4:
                return math.inf
        lo = 0.0
        while hi - lo > 1e-9 * max(hi, 1.0):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if self._delta_at(mid, ks, w, tail) <= target_delta else (mid, hi)
        return hi

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        check(target_epsilon >= 0, "target_epsilon", target_epsilon, "must be >= 0")
        if count == 0:
            return 0.0
        ks, w, tail = self._mixture(count, 1e-12)
        return min(1.0, self._delta_at(target_epsilon, ks, w, tail))


# --------------------------------------------------------------------------- algorithm
def mean_cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the client's data (its empirical loss)."""
    return nn.functional.cross_entropy(out, y)


_FIELD_PREFIX = {
    "local_epsilon": "privacy.",
    "local_delta": "privacy.",
    "checkin_probability": "privacy.",
    "num_slots": "client.",
    "variant": "client.",
    "delta1": "privacy.",
    "delta2": "privacy.",
}


@dataclass(frozen=True)
class CheckinClient(ClientAlgorithm):
    """A random check-in client: one clipped, locally randomized gradient per check-in.

    Parameters
    ----------
    variant : {"fixed", "averaged", "sliding-window", "poisson"}
        The protocol (and theorem) the run uses; the server strategy follows it.
    num_slots : int
        ``m >= 1``: slots of a pass (``fixed``, ``averaged``, ``poisson``: model steps of a
        pass) or the window length (``sliding-window``, ``m <= num_clients``).
    randomizer : {"gaussian", "laplace"}
        The local randomizer (:class:`LocalRandomizer`).
    window : [first, last] or None
        ``R_j`` as an inclusive 1-based slot range for ``fixed`` / ``averaged`` (default
        ``[1, m]``). It must lie inside the run's slots, and Theorems 3.2 / 4.1 cover only the
        full window, so any other value is refused; the sliding window's ``R_j`` is
        ``{j, ..., j+m-1}`` (leave ``window`` null).
    client_sample_rate : float or None
        ``poisson`` only: the server's per-step client sampling rate ``q`` (default
        ``checkin_probability / num_slots``, the rate at which a client checks into a slot).
    privacy : dict
        The run's ``privacy`` group: ``local_epsilon``, ``local_delta``, ``clipping_norm``,
        ``checkin_probability`` (``p0``), ``secure_mode``.
    num_clients : int
        ``n``.

    Raises
    ------
    ConfigError
        One line naming the field: ``p0`` not in (0, 1] (or != 1 where the theorem needs 1),
        ``m < 1``, ``m > n`` for the sliding window, ``eps0 <= 0``, ``delta0`` failing the
        theorem's precondition, an unknown variant or randomizer.
    """

    variant: str = "fixed"
    num_slots: int = 100
    randomizer: str = "laplace"
    window: list[int] | None = None
    client_sample_rate: float | None = None
    privacy: dict[str, Any] = field(default_factory=dict)
    num_clients: int = 1

    #: The central ledger's neighbouring relation (the paper's: replace one client's data).
    neighboring_relation: ClassVar[str] = "replace_one"

    def __post_init__(self) -> None:
        check(
            self.variant in VARIANTS,
            "client.variant",
            self.variant,
            "must be one of: " + ", ".join(VARIANTS),
        )
        check(
            isinstance(self.num_slots, (int, np.integer))
            and not isinstance(self.num_slots, bool)
            and self.num_slots >= 1,
            "client.num_slots",
            self.num_slots,
            "must be an integer >= 1",
        )
        check(
            isinstance(self.num_clients, (int, np.integer)) and self.num_clients >= 1,
            "num_clients",
            self.num_clients,
            "must be >= 1",
        )
        p0 = self.checkin_probability
        check(0.0 < p0 <= 1.0, "privacy.checkin_probability", p0, "must be in (0, 1]")
        if self.variant == "sliding-window":
            check(
                self.num_slots <= self.num_clients,
                "client.num_slots",
                self.num_slots,
                f"must be <= num_clients={self.num_clients} for the sliding window (window of m slots, "
                "n - m + 1 updates)",
            )
        if self.window is not None:
            self._check_window()
        if self.client_sample_rate is not None:
            check(
                self.variant == "poisson",
                "client.client_sample_rate",
                self.client_sample_rate,
                "is only used by client.variant=poisson",
            )
        _ = self.local_randomizer  # validates the randomizer fields
        try:
            _ = self.event
        except ConfigError as exc:
            raise ConfigError(
                _FIELD_PREFIX.get(exc.field, "") + exc.field, exc.value, exc.allowed
            ) from None

    def _check_window(self) -> None:
        """``window`` must be ``[1, m]`` (the only window Theorems 3.2 / 4.1 cover)."""
        w = list(self.window or [])
        check(
            self.variant in ("fixed", "averaged"),
            "client.window",
            w,
            f"must be null for client.variant={self.variant} (the sliding window's R_j = {{j..j+m-1}} "
            "is set by num_slots)",
        )
        check(
            len(w) == 2 and all(isinstance(v, int) for v in w) and w[0] <= w[1],
            "client.window",
            w,
            "must be [first, last] slot numbers",
        )
        check(
            1 <= w[0] and w[1] <= self.num_slots,
            "client.window",
            w,
            f"lies outside the run's slots [1, {self.num_slots}]",
        )
        check(
            w == [1, self.num_slots],
            "client.window",
            w,
            f"must be the whole run [1, {self.num_slots}]: the check-in theorems cover only R_j = [m]",
        )

    # -- parameters ----------------------------------------------------------------
    @property
    def local_epsilon(self) -> float:
        value = self.privacy.get("local_epsilon")
        check(
            value is not None,
            "privacy.local_epsilon",
            value,
            "must be set (> 0) for check-in clients",
        )
        return float(value)

    @property
    def local_delta(self) -> float:
        return float(self.privacy.get("local_delta") or 0.0)

    @property
    def clipping_norm(self) -> float:
        return float(self.privacy.get("clipping_norm", 1.0))

    @property
    def checkin_probability(self) -> float:
        return float(self.privacy.get("checkin_probability", 1.0))

    @property
    def sample_rate(self) -> float:
        """``poisson``: the per-step client sampling rate ``q``."""
        if self.window is not None:
            self._check_window()
        if self.client_sample_rate is not None:
            return float(self.client_sample_rate)
        return self.checkin_probability / self.num_slots

    @property
    def local_randomizer(self) -> LocalRandomizer:
        return LocalRandomizer(
            self.randomizer, self.clipping_norm, self.local_epsilon, self.local_delta
        )

    @property
    def event(self) -> FedprivEvent:
        """The central privacy event of one pass (CheckinEvent of H2's engine, or the baseline's)."""
        if self.variant == "poisson":
            r = self.local_randomizer
            mu = r.sensitivity / r.noise_stddev if r.kind == "gaussian" else None
            return PoissonLocalEvent(self.local_epsilon, self.sample_rate, int(self.num_slots), mu)
        return CheckinEvent(
            self.variant,
            self.local_epsilon,
            int(self.num_clients),
            int(self.num_slots),
            self.checkin_probability,
            self.local_delta,
        )

    @property
    def steps(self) -> int:
        """Model-update slots per pass (``n - m + 1`` for the sliding window)."""
        if self.variant == "sliding-window":
            return int(self.num_clients) - int(self.num_slots) + 1
        return int(self.num_slots)

    # -- privacy --------------------------------------------------------------------
    def round_events(self) -> list[tuple[Any, int]]:
        """One pass (fresh check-ins) per server round: ``[(event, 1)]``."""
        return [(self.event, 1)]

    def local_events(self) -> list[tuple[Any, int]]:
        """A client sends at most one randomized update per pass."""
        return [(self.local_randomizer.local_event(), 1)]

    def privacy_report(self, rounds: int, target_delta: float) -> dict[str, float]:
        """Each client's local ``eps0`` (and ``delta0``) per release, printed with every pass."""
        out = {"local_epsilon0": self.local_epsilon}
        if self.local_delta > 0:
            out["local_delta0"] = self.local_delta
        return out

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> CheckinClient:
        """A copy whose ``local_epsilon`` is the largest with central epsilon <= target after ``num_rounds`` passes.

        Raises
        ------
        ConfigError
            If even a tiny ``eps0`` misses the target.
        """

        def eps_at(e0: float) -> float:
            algo = replace(self, privacy={**self.privacy, "local_epsilon": e0})
            return algo.event.epsilon(target_delta, num_rounds)

        lo, hi = 1e-4, 1.0
        check(
            eps_at(lo) <= target_epsilon,
            "privacy.target_epsilon",
            target_epsilon,
            f"cannot be met even with local_epsilon={lo}",
        )
        while eps_at(hi) <= target_epsilon and hi < 50:
            lo, hi = hi, 2 * hi
        for _ in range(40):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if eps_at(mid) <= target_epsilon else (lo, mid)
        return replace(self, privacy={**self.privacy, "local_epsilon": lo, "target_epsilon": None})

    # -- client computation -----------------------------------------------------------
    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """``A_ldp(theta; d_j)``: the randomized clipped gradient of the mean loss at ``model``."""
        params = dict(model.named_parameters())
        x, y = data.x.to(ctx.device), data.y.to(ctx.device)
        loss = mean_cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(params.values()))
        grad = {k: g.detach() for k, g in zip(params, grads, strict=True)}
        update = self.local_randomizer.randomize(grad, ctx.generator)
        return {k: v.cpu() for k, v in update.items()}, {
            "examples": float(len(data)),
            "loss": float(loss.detach()),
        }

    def query_handler(self, cfg: dict[str, Any], msg: Message, context: Context) -> Message:
        """Answer a check-in query: draw the check-in with the client's own RNG and remember it.

        The query's ConfigRecord ``checkin`` carries ``server_round`` (the pass),
        ``variant`` and ``num_slots``; they must match this client's protocol. The reply's
        ``checkin`` record has ``slot`` (``ABSTAIN`` = -1) and a random ``ticket`` from the same
        RNG (independent of the data): the server orders a slot's check-ins by ticket before its
        uniform pick, so seeded runs repeat exactly although Flower's node ids change per run.
        """
        q = msg.content.config_records[CHECKIN_KEY]
        server_round = int(q["server_round"])
        if str(q["variant"]) != self.variant or int(q["num_slots"]) != int(self.num_slots):
            raise RuntimeError(
                f"check-in query for variant={q['variant']} num_slots={q['num_slots']} does not "
                f"match this client's protocol ({self.variant}, {self.num_slots})"
            )
        partition_id = int(context.node_config["partition-id"])
        rng = checkin_rng(
            int(cfg["seed"]), server_round, partition_id, bool(cfg["privacy"].get("secure_mode"))
        )
        slot = draw_checkin(
            rng,
            self.checkin_probability,
            checkin_window(self.variant, self.num_slots, partition_id),
        )
        ticket = int(rng.integers(2**62))
        context.state[CHECKIN_KEY] = ConfigRecord({"server_round": server_round, "slot": slot})
        return Message(
            content=RecordDict({CHECKIN_KEY: ConfigRecord({"slot": slot, "ticket": ticket})}),
            reply_to=msg,
        )

    def train_message_handler(self, cfg: dict[str, Any], msg: Message, context: Context) -> Message:
        """Send the update of a slot, but only for the (pass, slot) this client checked into.

        The train message's ``config`` record carries ``server_round`` and ``slot``; a request
        for any other slot is refused (the server cannot pick clients). ``poisson`` (the
        server-sampled baseline) has no check-in to verify.

        Raises
        ------
        RuntimeError
            If the (pass, slot) is not the one this client checked into.
        """
        from fedpriv.wire import CONFIG_KEY

        conf = msg.content.config_records[CONFIG_KEY]
        want = (int(conf["server_round"]), int(conf["slot"]))
        if self.variant != "poisson":
            mine = context.state.config_records.get(CHECKIN_KEY)
            have = None if mine is None else (int(mine["server_round"]), int(mine["slot"]))
            if have != want or want[1] == ABSTAIN:
                raise RuntimeError(
                    f"asked for the update of (pass, slot)={want} but checked into {have}"
                )
        return slot_update(self, cfg, msg, int(context.node_config["partition-id"]), *want)


def slot_update(
    algorithm: CheckinClient,
    cfg: dict[str, Any],
    msg: Message,
    partition_id: int,
    server_round: int,
    slot: int,
) -> Message:
    """Reply to a slot's train message with ``A_ldp`` at the received model.

    The noise is seeded from ``(seed, pass, slot, partition_id)`` (OS entropy in
    ``secure_mode``), so two reports of one client (the Poisson baseline may sample it in
    several slots of a pass) never share noise.
    """
    import json

    from flwr.app import ArrayRecord, MetricRecord

    from clients.app import _client_data
    from fedpriv.noise import make_generator
    from fedpriv.setup import build_model_for, resolve_device
    from fedpriv.wire import METRICS_KEY, MODEL_KEY, UPDATE_KEY

    torch.set_num_threads(1)
    device = resolve_device(cfg)
    data = _client_data(json.dumps(cfg, sort_keys=True), partition_id)
    model = build_model_for(cfg).to(device)
    model.load_state_dict(msg.content.array_records[MODEL_KEY].to_torch_state_dict())
    secure = bool(cfg["privacy"].get("secure_mode"))
    rng = np.random.default_rng(
        None if secure else [int(cfg["seed"]), server_round, slot, partition_id]
    )
    generator = make_generator(int(rng.integers(2**62)), device=device, secure_mode=secure)
    update, metrics = algorithm.train(
        model, data, TrainContext(server_round, rng, generator, device)
    )
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({k: v.detach().cpu().contiguous() for k, v in update.items()}),
            METRICS_KEY: MetricRecord({k: float(v) for k, v in metrics.items()}),
        }
    )
    return Message(content=content, reply_to=msg)
