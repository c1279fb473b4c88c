"""SecAgg+ aggregator: Flower's real SecAgg+ protocol, passing integer vectors exactly.

The server runs Flower's :class:`flwr.server.workflow.SecAggPlusWorkflow` (in flwr 1.42 a
legacy workflow: it reads a ``LegacyContext`` and a legacy ``Strategy``), and each client
runs ``flwr.client.mod.secaggplus_mod`` (registered by
:data:`fedpriv.run.secagg_codec.SECAGG_MODS`). Only the sum of the clients' masked vectors is
ever unmasked (Bell et al. 2020, SecAgg+).

How integers pass through exactly. The workflow is built for float models: a client clips a
value ``v`` to ``[-c, c]``, computes ``(v + c) · T / (2c)`` (``T`` = quantization range),
rounds it stochastically, casts to int32 and masks it modulo ``M`` (modulus range); the
server unmasks ``Σ`` modulo ``M``, computes ``(Σ − n c) · T / (n T)`` and returns that mean.
With ``c = T / 2`` the map is the identity on integers, an integer input is never rounded,
and with every client reporting weight ``num_examples = max_weight = 1`` the weight factor
is exactly 1. Each client's residue in ``[0, 2**bits)`` is split into ``K`` limbs of ``L``
bits (``L ≤ 31`` for the int32 cast), sent as the float ``limb − c``; ``M = 2**32`` and
``L ≤ 32 − ceil(log2(n + 1))`` keep both the limb sums and the summed weight factor ``n T``
below ``M``, so nothing wraps. The server recovers every limb sum as
``round(mean · n) + n c`` (float64 is exact here: all magnitudes stay below 2**33) and
recombines ``Σ_k 2**(kL) · limbsum_k``: the exact integer sum of the residues, the same
array the ideal aggregator returns.

Caveats of the underlying Flower code (1.42): masks are drawn with numpy's ``RandomState``
seeded from 32 bits (not a cryptographic PRG) over ``[0, M − 2]``; metrics a client reports
travel outside the secure sum, in the clear (diagnostics only).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation import secaggplus_workflow as _flower_workflow
from flwr.serverapp import Grid

from fedpriv.common.errors import ConfigError, check
from fedpriv.run.aggregation import AggregateResult, Aggregator, RoundFailed
from fedpriv.run.secagg_codec import (
    BITS_KEY,
    CONTENT_KEY,
    LAYOUT_KEY,
    LIMB_KEY,
    MODULUS_BITS,
    join_limb_means,
    limb_bits_for,
    pack_content,
)

#: ``num_shares="auto"``: the largest allowed probability that a round fails (some client keeps
#: fewer live share-holders than the threshold) or that some client's secrets are exposed (the
#: threshold of its share-holders colludes with the server).
AUTO_BOUND = 1e-6


def _threshold_of(threshold: int | float, shares: int) -> int:
    """Flower's threshold for ``shares`` shares: an int as is, a fraction rounded (at least 2)."""
    if isinstance(threshold, float) or threshold == 1:
        return max(round(float(threshold) * shares), 2)
    return int(threshold)


def auto_num_shares(n: int, threshold: int | float, max_dropout: float, max_corrupt: float) -> int:
    """The fewest shares (an odd ``k`` ≥ 3, or ``n``: every client) for which a round of ``n``
    clients fails, or exposes a client, with probability at most :data:`AUTO_BOUND`.

    Flower's SecAgg+ places the clients on a randomly permuted ring (the random Harary graph of
    Bell et al. 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead",
    arXiv:1912.05897, Sec. 4) and shares each client's two secrets among the ``k`` clients
    around it, itself included. With each client dropping out independently with probability
    ``max_dropout`` and corrupt with probability ``max_corrupt``, a union bound over the ``n``
    clients on the ``k − 1`` other holders of each: ``n · P[Bin(k − 1, 1 − max_dropout) < t]
    ≤ AUTO_BOUND`` (a dropped client's secret can be reconstructed; a live one's holds its own
    share too) and ``n · P[Bin(k − 1, max_corrupt) ≥ t] ≤ AUTO_BOUND`` (an honest client's
    cannot), with ``t`` the threshold for ``k`` shares. Cost: each client splits its secrets
    into ``k`` shares and agrees ``k − 1`` keys, the server reconstructs ``n`` secrets from
    ``t`` shares; ``k = n`` (the complete graph) is quadratic in ``n``.
    """
    from scipy.stats import binom

    for k in range(3, n, 2):
        t = _threshold_of(threshold, k)
        if t > k:
            continue
        lost = n * binom.cdf(t - 1, k - 1, 1.0 - max_dropout)
        exposed = n * binom.sf(t - 1, k - 1, max_corrupt)
        if lost <= AUTO_BOUND and exposed <= AUTO_BOUND:
            return k
    return n


def resolve_shares(
    num_shares: int | float | str,
    threshold: int | float,
    n: int,
    max_dropout: float = 0.1,
    max_corrupt: float = 0.1,
) -> tuple[int, int]:
    """Flower's run-time share count and reconstruction threshold for ``n`` clients
    (``num_shares="auto"``: :func:`auto_num_shares`)."""
    if num_shares == "auto":
        shares = auto_num_shares(n, threshold, max_dropout, max_corrupt)
    elif isinstance(num_shares, float) or num_shares == 1:
        shares = round(float(num_shares) * n)
        if shares < n and shares % 2 == 0:
            shares += 1
        shares = n if shares <= 2 else shares
    else:
        shares = int(num_shares)
    return shares, _threshold_of(threshold, shares)


# ---- server side ------------------------------------------------------------------------
class _CaptureStrategy(Strategy):
    """Legacy strategy the workflow talks to: hands out our FitIns, keeps the unmasked sum."""

    def __init__(self, grid: Grid, fitins: dict[int, FitIns]) -> None:
        self.grid = grid
        self.fitins = fitins
        self.results: list[tuple[ClientProxy, FitRes]] | None = None

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        run_id = getattr(getattr(self.grid, "run", None), "run_id", 0)
        return [(GridClientProxy(nid, self.grid, run_id), ins) for nid, ins in self.fitins.items()]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: list[Any]
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self.results = list(results)
        return None, {}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[Any]:
        return []

    def aggregate_evaluate(
        self, server_round: int, results: list[Any], failures: list[Any]
    ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return None


#: The reconstruction threshold of the unmask stage running in this context (else None).
_THRESHOLD: ContextVar[int | None] = ContextVar("secaggplus_threshold", default=None)
_flower_combine_shares = _flower_workflow.combine_shares


def _combine_threshold_shares(share_list: list[bytes]) -> bytes:
    """Flower's ``combine_shares`` on the first ``t`` shares (``t``: the running unmask stage's
    threshold). Any ``t`` shares of a Shamir secret with threshold ``t`` interpolate the same
    degree ``t − 1`` polynomial, and pycryptodome's interpolation is quadratic in the shares
    given: 0.78 s from 100 shares, 0.20 s from 50 (measured, 2-core machine)."""
    t = _THRESHOLD.get()
    return _flower_combine_shares(share_list if t is None else share_list[:t])


_flower_workflow.combine_shares = _combine_threshold_shares


class _TimedWorkflow(SecAggPlusWorkflow):
    """SecAgg+ with one timeout for the training stage and another for the key stages; keeps
    the clients' error reasons (``failures``) for the RoundFailed message."""

    def __init__(self, *args: Any, train_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stage_timeout = self.timeout
        self._train_timeout = train_timeout
        self.failures: list[str] = []

    def setup_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        return self._noted(super().setup_stage(grid, context, state), state)

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        return self._noted(super().share_keys_stage(grid, context, state), state)

    def collect_masked_vectors_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        self.timeout = self._train_timeout
        try:
            return self._noted(super().collect_masked_vectors_stage(grid, context, state), state)
        finally:
            self.timeout = self._stage_timeout

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        token = _THRESHOLD.set(int(state.threshold))
        try:
            return self._noted(super().unmask_stage(grid, context, state), state)
        finally:
            _THRESHOLD.reset(token)

    def _noted(self, ok: bool, state: Any) -> bool:
        self.failures = [str(f) for f in state.failures]
        return ok


@dataclass
class SecAggPlusAggregator(Aggregator):
    """Sum integer client updates with Flower's SecAgg+ protocol; exact, like the ideal sum.

    Declares ``requires_integer_updates`` (its ``bits`` must equal the client's) and
    ``uses_secagg_mods`` (every client registers :data:`fedpriv.run.secagg_codec.SECAGG_MODS`).

    Every client's ``update`` arrays must hold integers in ``[0, 2**bits)`` (e.g. Skellam
    residues, :meth:`fedpriv.mechanisms.skellam_noise.SkellamMechanism.encode`); the returned
    ``total`` is their exact int64 sum over the clients that survived the protocol (reduce it
    modulo ``2**bits`` to decode). The round's clients must register
    :data:`fedpriv.run.secagg_codec.SECAGG_MODS`.

    Parameters
    ----------
    num_shares : int | float | str
        Shares of each client's secrets (its neighbours, itself included): ``"auto"`` (the
        fewest that survive ``max_dropout`` and resist ``max_corrupt``:
        :func:`auto_num_shares`), an int ≥ 3, or a float in (0, 1] as a fraction of the
        round's clients (1.0: every client; its cost grows as the square of the clients).
    reconstruction_threshold : int | float
        Shares needed to reconstruct a secret: an int ≥ 2 (below ``num_shares`` when that is an
        int), or a float in (0, 1] as a fraction of the shares. A round tolerates a client
        dropping out as long as every client keeps at least this many live neighbours.
    max_dropout : float
        ``"auto"``: the probability, in [0, 1), that a client drops out after the key stages.
    max_corrupt : float
        ``"auto"``: the probability, in [0, 1), that a client colludes with the server.
    bits : int
        Width of the residues, 1 ≤ bits ≤ 62.
    stage_timeout : float
        Seconds to wait for replies in each key stage (setup, share keys, unmask; the first
        stage of a run also waits for the Ray actors to start); the training stage waits the
        ``timeout`` given to :meth:`sum_updates`, so a round takes at most
        ``timeout + 3 * stage_timeout`` seconds (plus the server's unmasking).
    num_clients : int, optional
        If given, the constructor already checks the threshold against it (the option binds
        it to the run's ``num_clients``).

    Raises
    ------
    ConfigError
        For out-of-range fields, or a threshold above the number of clients.
    """

    requires_integer_updates: ClassVar[bool] = True
    uses_secagg_mods: ClassVar[bool] = True
    num_shares: int | float | str = "auto"
    reconstruction_threshold: int | float = 0.5
    max_dropout: float = 0.1
    max_corrupt: float = 0.1
    bits: int = 32
    stage_timeout: float = 180.0
    num_clients: int | None = None
    last_num_dropped: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        s, t = self.num_shares, self.reconstruction_threshold
        check(
            not isinstance(s, bool)
            and (
                s in ("auto", 1)
                or (isinstance(s, int) and s >= 3)
                or (isinstance(s, float) and 0 < s <= 1)
            ),
            "num_shares",
            s,
            "must be 'auto', an int >= 3 or a float in (0, 1]",
        )
        for name in ("max_dropout", "max_corrupt"):
            value = getattr(self, name)
            check(0 <= value < 1, name, value, "must be in [0, 1)")
        check(
            not isinstance(t, bool)
            and ((isinstance(t, int) and t >= 1) or (isinstance(t, float) and 0 < t <= 1)),
            "reconstruction_threshold",
            t,
            "must be an int >= 2 or a float in (0, 1]",
        )
        if isinstance(s, int) and s >= 3 and isinstance(t, int) and t != 1:
            check(t < s, "reconstruction_threshold", t, f"must be < num_shares={s}")
        check(
            isinstance(self.bits, int) and 1 <= self.bits <= 62,
            "bits",
            self.bits,
            "must be an integer in [1, 62]",
        )
        check(self.stage_timeout > 0, "stage_timeout", self.stage_timeout, "must be > 0")
        if self.num_clients is not None:
            self.shares_for(self.num_clients)

    def shares_for(self, n: int) -> tuple[int, int]:
        """``(shares, threshold)`` of a round of ``n`` clients, as Flower resolves them.

        Raises
        ------
        ConfigError
            If the round cannot work (fewer than 2 clients, an int64 sum that could overflow,
            a threshold above the shares).
        """
        check(n >= 2, "num_clients", n, "must be >= 2 for SecAgg+")
        check(
            self.bits + math.ceil(math.log2(n)) <= 62,
            "bits",
            self.bits,
            f"is too large for an int64 sum of {n} clients",
        )
        shares, threshold = resolve_shares(
            self.num_shares, self.reconstruction_threshold, n, self.max_dropout, self.max_corrupt
        )
        if threshold > min(shares, n):
            raise ConfigError(
                "reconstruction_threshold",
                self.reconstruction_threshold,
                f"needs {threshold} shares but each client has only {min(shares, n)} "
                f"(num_shares={self.num_shares}, {n} clients)",
            )
        return shares, threshold

    def sum_updates(
        self, grid: Grid, messages: Sequence[Message], *, server_round: int, timeout: float
    ) -> AggregateResult:
        """Run one SecAgg+ round over ``messages`` and return the exact sum of the updates.

        Raises
        ------
        RoundFailed
            If too many clients drop out for the masks to be removed, a reply is malformed, or
            the replies disagree on the update layout.
        ConfigError
            If the round has fewer than 2 clients or the threshold exceeds the clients.
        """
        shares, _ = self.shares_for(len(messages))
        limb_bits = limb_bits_for(self.bits, len(messages))
        strategy = _CaptureStrategy(
            grid, {int(m.metadata.dst_node_id): self._fitins(m, limb_bits) for m in messages}
        )
        workflow = _TimedWorkflow(
            shares if shares < len(messages) else 1.0,
            self.reconstruction_threshold,  # Flower resolves it to `threshold` for the shares
            max_weight=1.0,
            clipping_range=float(1 << (limb_bits - 1)),
            quantization_range=1 << limb_bits,
            modulus_range=1 << MODULUS_BITS,
            timeout=self.stage_timeout,
            train_timeout=timeout,
        )
        try:
            workflow(grid, self._legacy_context(strategy, server_round))
        except (KeyError, TypeError, ValueError) as exc:  # a malformed reply or share
            raise RoundFailed(f"round {server_round}: SecAgg+ protocol error: {exc!r}") from exc
        if not strategy.results:
            raise RoundFailed(
                f"round {server_round}: SecAgg+ halted (too many dropouts for "
                f"reconstruction_threshold={self.reconstruction_threshold}); "
                f"client errors: {workflow.failures[:3]}"
            )
        self.last_num_dropped = len(messages) - len(strategy.results)
        return self._decode(strategy.results, limb_bits)

    def _fitins(self, msg: Message, limb_bits: int) -> FitIns:
        config: dict[str, Scalar] = {
            CONTENT_KEY: pack_content(msg.content),
            BITS_KEY: self.bits,
            LIMB_KEY: limb_bits,
        }
        return FitIns(parameters=Parameters(tensors=[], tensor_type=""), config=config)

    @staticmethod
    def _legacy_context(strategy: _CaptureStrategy, server_round: int) -> LegacyContext:
        context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
        manager = SimpleClientManager()
        for proxy, _ in strategy.configure_fit(server_round, Parameters([], ""), manager):
            manager.register(proxy)
        legacy = LegacyContext(context, strategy=strategy, client_manager=manager)
        legacy.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
            {WorkflowKey.CURRENT_ROUND: server_round}
        )
        return legacy

    def _decode(self, results: list[tuple[ClientProxy, FitRes]], limb_bits: int) -> AggregateResult:
        layouts = {str(res.metrics.get(LAYOUT_KEY)) for _, res in results}
        if len(layouts) != 1:
            raise RoundFailed(
                f"SecAgg+ clients disagree on the update layout: {sorted(layouts)[:2]}"
            )
        flat = join_limb_means(
            parameters_to_ndarrays(results[0][1].parameters), len(results), limb_bits
        )
        total, offset = {}, 0
        for key, shape in json.loads(layouts.pop()):
            size = int(np.prod(shape, dtype=np.int64))
            total[key] = flat[offset : offset + size].reshape(shape)
            offset += size
        metrics: dict[str, float] = {}
        for _, res in results:
            for key, val in res.metrics.items():
                if (
                    key != LAYOUT_KEY
                    and isinstance(val, (int, float))
                    and not isinstance(val, bool)
                ):
                    metrics[key] = metrics.get(key, 0.0) + float(val)
        return AggregateResult(total=total, num_clients=len(results), metrics=metrics)
