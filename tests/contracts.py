"""Reusable contract test classes (issue 11), in the style of dp-accounting's
``privacy_accountant_test.PrivacyAccountantTest``: a base class holds the test methods, every
member of a family subclasses it and fills in the hooks.

* :class:`EventContract` -- every privacy event type the ledger accepts: ε monotone in the
  noise and in the count, JSON round trip with an identical ε, refusals (raise, never a number)
  for what it cannot account, golden values from independent computations.
* :class:`ClientAlgorithmContract` -- every client algorithm: the effective noise multiplier of
  the most influential record, measured from the SERIALIZED replies (Flower 1.42 protobuf
  serde) summed as the aggregator sums them, is >= the accounted σ; calibration meets its
  target within 1% under every accountant x conversion it accepts; noise draws = events.
* :class:`AggregatorContract` -- every aggregator returns the same sum for the same updates and
  never sums a non-finite update.

The base classes are not collected themselves (their names do not start with ``Test``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from scipy.stats import norm

from fedpriv.accounting.core.cli_runner import spec_from_params
from fedpriv.accounting.core.event import IntegerRdpEvent
from fedpriv.accounting.core.ledger import IncompatibleEventsError, PrivacyLedger
from fedpriv.common.errors import ConfigError
from fedpriv.common.wire import METRICS_KEY, UPDATE_KEY

# --------------------------------------------------------------------------- closed forms


def gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism with sensitivity/σ = ``mu`` (Balle & Wang 2018,
    Thm 8; equivalently μ-GDP, Dong, Roth, Su 2019, Cor. 2.13)."""
    return float(
        norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
    )


def gaussian_epsilon(delta: float, mu: float) -> float:
    """Exact ε at ``delta`` of μ-GDP, by bisection of :func:`gaussian_delta` (to 1e-12)."""
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, mu) > delta:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_delta(mid, mu) > delta else (lo, mid)
        if hi - lo < 1e-12:
            break
    return hi


# --------------------------------------------------------------------------- events


class EventContract:
    """Contract of one privacy event family; subclass and fill the hooks.

    Hooks
    -----
    make_event(noise) -> event
        The event at noise level ``noise`` (σ, μ, 1/ε0 ...: larger = more private).
    noise_levels : tuple of float, increasing
    counts : tuple of int, increasing
    accountant, conversion, relation : ledger settings the family is accounted under.
    target_delta : float
    unsupported_relation : str or None
        A neighbouring relation the event must be refused under.
    unsupported_accountant : str or None
        An accountant the event must be refused under (alone in the ledger).
    incompatible_partner() -> event or None
        An event that no implemented theorem composes with this one.
    non_finite_noise : tuple
        Noise values whose event must be refused when built (ConfigError).
    golden() -> list of (event, count, expected ε, rel_tol)
        Independent values (dp-accounting, closed forms, the papers).
    monotone_rtol : float
        Slack allowed in the monotonicity checks (0 = exact).
    """

    #: The event class the contract covers (enrollment: tests/test_contract_enrollment.py).
    event_class: ClassVar[type] = object
    noise_levels: ClassVar[tuple[float, ...]] = ()
    counts: ClassVar[tuple[int, ...]] = (1, 3, 10)
    accountant: ClassVar[str] = "pld"
    conversion: ClassVar[str] = "default"
    relation: ClassVar[str] = "add_remove"
    target_delta: ClassVar[float] = 1e-5
    unsupported_relation: ClassVar[str | None] = None
    unsupported_accountant: ClassVar[str | None] = None
    non_finite_noise: ClassVar[tuple[float, ...]] = (math.nan, math.inf)
    monotone_rtol: ClassVar[float] = 0.0

    def make_event(self, noise: float) -> Any:
        raise NotImplementedError

    def test_event_class_is_declared(self) -> None:
        assert type(self.make_event(self.noise_levels[-1])) is self.event_class

    def incompatible_partner(self) -> Any:
        return None

    def golden(self) -> list[tuple[Any, int, float, float]]:
        return []

    # ---- helpers
    def ledger(self, **kw: Any) -> PrivacyLedger:
        settings: dict[str, Any] = {
            "accountant": self.accountant,
            "conversion": self.conversion,
            "neighboring_relation": self.relation,
        }
        settings.update(kw)
        return PrivacyLedger(**settings)

    def epsilon(self, event: Any, count: int) -> float:
        ledger = self.ledger()
        ledger.record(event, count)
        return float(ledger.get_epsilon(self.target_delta))

    # ---- the contract
    def test_epsilon_non_increasing_in_noise(self) -> None:
        assert len(self.noise_levels) >= 3, "give at least three increasing noise levels"
        for count in (self.counts[0], self.counts[-1]):
            eps = [self.epsilon(self.make_event(s), count) for s in self.noise_levels]
            assert all(math.isfinite(e) and e >= 0 for e in eps), eps
            for a, b in zip(eps, eps[1:], strict=False):
                assert b <= a * (1 + self.monotone_rtol), (count, self.noise_levels, eps)
            assert eps[-1] < eps[0], f"ε does not depend on the noise: {eps}"

    def test_epsilon_non_decreasing_in_count(self) -> None:
        event = self.make_event(self.noise_levels[len(self.noise_levels) // 2])
        eps = [self.epsilon(event, c) for c in self.counts]
        for a, b in zip(eps, eps[1:], strict=False):
            assert b >= a * (1 - self.monotone_rtol), (self.counts, eps)
        assert eps[-1] > eps[0], f"ε does not depend on the count: {eps}"

    def test_recording_in_pieces_equals_one_run(self) -> None:
        """``record(e, a); record(e, b)`` is the same ledger as ``record(e, a + b)``."""
        event = self.make_event(self.noise_levels[0])
        a, b = self.counts[0], self.counts[1]
        split = self.ledger()
        split.record(event, a)
        split.record(event, b)
        assert split.get_epsilon(self.target_delta) == self.epsilon(event, a + b)

    def test_json_round_trip_gives_identical_epsilon(self) -> None:
        event = self.make_event(self.noise_levels[1])
        ledger = self.ledger()
        ledger.record(event, self.counts[1])
        text = json.dumps(ledger.to_dict())
        back = PrivacyLedger.from_dict(json.loads(text))
        assert back.runs == ledger.runs
        assert back.get_epsilon(self.target_delta) == ledger.get_epsilon(self.target_delta)
        assert back.get_delta(1.0) == ledger.get_delta(1.0)

    @pytest.mark.parametrize("count", [0, -1, 2.5, True, "3"])
    def test_refuses_a_count_that_is_not_a_positive_integer(self, count: Any) -> None:
        ledger = self.ledger()
        with pytest.raises(ConfigError, match="count"):
            ledger.record(self.make_event(self.noise_levels[0]), count)
        assert ledger.runs == ()

    def test_refuses_non_finite_noise(self) -> None:
        for value in self.non_finite_noise:
            with pytest.raises(ConfigError):
                self.make_event(value)

    def test_refuses_unsupported_relation(self) -> None:
        if self.unsupported_relation is None:
            pytest.skip("the event holds under every neighbouring relation")
        ledger = self.ledger(neighboring_relation=self.unsupported_relation)
        with pytest.raises(IncompatibleEventsError):
            ledger.record(self.make_event(self.noise_levels[0]), 1)
            ledger.get_epsilon(self.target_delta)
        assert ledger.runs == ()

    def test_refuses_unsupported_accountant(self) -> None:
        if self.unsupported_accountant is None:
            pytest.skip("every accountant answers for this event")
        ledger = self.ledger(accountant=self.unsupported_accountant, conversion="default")
        with pytest.raises(IncompatibleEventsError):
            ledger.record(self.make_event(self.noise_levels[0]), 1)
            ledger.get_epsilon(self.target_delta)

    def test_refuses_composition_with_an_incompatible_event(self) -> None:
        partner = self.incompatible_partner()
        if partner is None:
            pytest.skip("no incompatible partner event for this family")
        event = self.make_event(self.noise_levels[0])
        ledger = self.ledger()
        ledger.record(event, 2)
        before = ledger.get_epsilon(self.target_delta)
        with pytest.raises(IncompatibleEventsError):
            ledger.record(partner, 1)
        assert ledger.runs == ((event, 2),), "a refused event must leave the ledger unchanged"
        assert ledger.get_epsilon(self.target_delta) == before
        other = self.ledger()  # the other order too (the partner may be refused alone)
        with pytest.raises(IncompatibleEventsError):
            other.record(partner, 1)
            other.record(event, 1)

    def test_golden_values(self) -> None:
        cases = self.golden()
        if not cases:
            pytest.skip("no independent golden value for this family")
        for event, count, expected, rtol in cases:
            got = self.epsilon(event, count)
            assert got == pytest.approx(expected, rel=rtol), (event, count)


# --------------------------------------------------------------------------- wire helpers


def serialize_reply(update: dict[str, torch.Tensor], metrics: dict[str, float]) -> bytes:
    """The bytes of a train reply's content, built exactly as ``clients/app.py``
    ``train_handler`` builds it and serialized with Flower 1.42's protobuf serde."""
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({k: v.detach().cpu().contiguous() for k, v in update.items()}),
            METRICS_KEY: MetricRecord({k: float(v) for k, v in metrics.items()}),
        }
    )
    return recorddict_to_proto(content).SerializeToString()


def parse_reply(data: bytes) -> Any:
    """The reply as the server reads it: an object whose ``content`` is the RecordDict parsed
    back from ``data`` (all ``sum_replies`` reads; a real ``flwr.app.Message`` can only be built
    inside a running Flower app, which ``TaskIdentity`` enforces in 1.42)."""
    proto = ProtoRecordDict()
    proto.ParseFromString(data)
    return SimpleNamespace(content=recorddict_from_proto(proto))


class CoupledRng(np.random.Generator):
    """A numpy Generator whose draws come from separate streams by purpose, so that two runs
    on neighbouring datasets get the SAME noise (a coupling; any coupling gives a valid
    measurement of the difference of the releases):

    ``random`` with a 1-d size (a sampler's inclusion draws), ``random`` with a 2-d size
    (per-row rounding draws: a removed LAST row only removes the draws at the end), and
    ``poisson`` / ``normal`` / ``laplace`` (noise) each use their own stream.
    """

    def __init__(self, seed: int) -> None:
        super().__init__(np.random.PCG64([seed, 0]))
        self._rows = np.random.default_rng([seed, 1])
        self._noise = np.random.default_rng([seed, 2])
        self._retry = np.random.default_rng([seed, 3])

    def random(self, size: Any = None, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
        if isinstance(size, tuple) and len(size) == 2:
            gen = self._rows if not getattr(self, "_rounded", False) else self._retry
            self._rounded = True
            return gen.random(size, *args, **kw)
        self._rounded = False
        return super().random(size, *args, **kw)

    def poisson(self, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
        return self._noise.poisson(*args, **kw)

    def normal(self, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
        return self._noise.normal(*args, **kw)

    def laplace(self, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
        return self._noise.laplace(*args, **kw)


def plan_for(overrides: Sequence[str]) -> Any:
    """The prepared run plan for ``overrides`` (composed by Hydra from conf/, validated, the
    privacy spec bound and calibrated as a run does: :func:`fedpriv.run.prepare.prepare`)."""
    return _plan(tuple(overrides))


@lru_cache(maxsize=32)
def _plan(overrides: tuple[str, ...]) -> Any:
    from fedpriv.run.config import compose_config
    from fedpriv.run.prepare import prepare

    return prepare(compose_config(list(overrides)))[0]


def accounted_sigma(events: list[tuple[Any, int]]) -> float:
    """The noise multiplier (noise std / sensitivity of one record, per step) the events claim.

    Gaussian and Poisson-sampled Gaussian: σ; Skellam: √(2μ)/Δ2 (its variance is 2μ per
    coordinate, in the same integer units as Δ2); batch clipping: σ (noise 2Cσ over the
    replace-one sensitivity 2C). Several events: the smallest.
    """
    out = math.inf
    for event, _ in events:
        inner = event.event if isinstance(event, dp_event.PoissonSampledDpEvent) else event
        if isinstance(inner, dp_event.GaussianDpEvent):
            sigma = inner.noise_multiplier
        elif isinstance(inner, IntegerRdpEvent) and hasattr(inner, "l2_sensitivity"):
            sigma = math.sqrt(2 * inner.mu) / inner.l2_sensitivity  # type: ignore[attr-defined]
        elif hasattr(inner, "noise_multiplier"):  # an event, never an algorithm
            sigma = inner.noise_multiplier
        else:
            raise TypeError(f"no noise multiplier known for {inner!r}")
        out = min(out, float(sigma))
    return out


# --------------------------------------------------------------------------- client algorithms

#: Overrides every client-algorithm contract shares: a tiny logistic model, 10 clients.
BASE = ["model=logistic", "num_clients=10", "seed=0"]
#: Neighbours of the measurement test, by partition: iid / dirichlet alpha=0.05 / natural.
PARTITIONS = {
    "iid": ["partition=iid"],
    "dirichlet-0.05": ["partition=dirichlet", "partition.alpha=0.05"],
    "natural": [
        "dataset=acs_income",
        "partition=natural",
        "num_clients=47",
    ],
}


class ClientAlgorithmContract:
    """Contract of one client algorithm configuration; subclass and fill the hooks.

    Hooks
    -----
    overrides : list of str
        Hydra overrides selecting the algorithm (``client=...``, ``client.X=...``).
    measure_overrides : list of str
        Extra overrides of the measurement (one step, whole-client batch, every per-sample
        gradient clipped: ``privacy.max_grad_norm`` far below the gradients' norms).
    sized_overrides(min_n) -> list of str
        Overrides that depend on the smallest client's size (e.g. a batch of the whole client).
    neighbour : {"remove", "replace"}
        How the neighbouring dataset is made: remove the client's LAST record, or replace its
        FIRST record by a record of another client with another label. Under the add/remove
        relation a replacement is two add/remove steps, so its measured influence is halved.
    measurable : str or None
        None, or why the measurement does not apply (the test is skipped with that reason).
    calibration_overrides : list of str
        Extra overrides of the calibration test (every accountant x conversion is tried;
        those the run refuses before training, via ``RunPrivacy.check``, are skipped).
    partition_overrides : dict
        Per partition extra overrides (e.g. a minimum client size the algorithm needs).
    """

    overrides: ClassVar[list[str]] = []
    measure_overrides: ClassVar[list[str]] = [
        "client.steps=1",
        "privacy.sample_rate=1.0",
        "privacy.max_grad_norm=0.001",
    ]
    neighbour: ClassVar[str] = "remove"
    measurable: ClassVar[str | None] = None
    #: Overrides of the calibration test (fewer local steps keep PLD calibration cheap).
    calibration_overrides: ClassVar[list[str]] = []
    partition_overrides: ClassVar[dict[str, list[str]]] = {}
    #: Relative sampling error allowed on the measured effective σ (see the test).
    sigma_rtol: ClassVar[float] = 0.05
    target_epsilon: ClassVar[float] = 3.0
    num_rounds: ClassVar[int] = 3

    def sized_overrides(self, min_n: int) -> list[str]:
        return []

    # ---- building
    def config(self, extra: Sequence[str] = ()) -> Any:
        """The prepared :class:`~fedpriv.run.plan.RunPlan` of the contract's overrides."""
        return plan_for([*BASE, *self.overrides, *extra])

    def build(self, cfg: Any) -> Any:
        from fedpriv.run.setup import build_algorithm

        return build_algorithm(cfg)

    def measurement_config(self, partition: str, shared_data: Any) -> Any:
        from fedpriv.run.setup import partitions

        extra = [*PARTITIONS[partition], *self.partition_overrides.get(partition, [])]
        if partition == "natural":
            path = shared_data / "acs-income" / "feda4fair_cross_silo_value_2018"
            extra.append(f"dataset.data_dir={path}")
        extra += self.measure_overrides
        cfg = self.config(extra)
        min_n = min(len(p) for p in partitions(cfg))
        more = self.sized_overrides(min_n)
        return self.config([*extra, *more]) if more else cfg

    # ---- one client's serialized reply
    @staticmethod
    def reply_bytes(
        algorithm: Any, cfg: Any, x: np.ndarray, y: np.ndarray, pid: int, seed: int
    ) -> bytes:
        from fedpriv.data.client_data import ClientData
        from fedpriv.mechanisms.noise import make_generator
        from fedpriv.run.algorithm import TrainContext
        from fedpriv.run.setup import build_model_for

        model = build_model_for(cfg)
        data = ClientData(torch.from_numpy(x), torch.from_numpy(y), pid)
        ctx = TrainContext(
            server_round=1,
            rng=CoupledRng(seed * 1000 + pid),
            generator=make_generator(seed * 1000 + pid),
            device=torch.device("cpu"),
        )
        update, metrics = algorithm.train(model, data, ctx)
        return serialize_reply(update, metrics)

    @staticmethod
    def released_sum(algorithm: Any, cfg: Any, replies: list[bytes]) -> np.ndarray:
        """Sum the parsed replies as ``fedpriv.run.aggregation.sum_replies`` does, decode the
        sum with ``algorithm.decode_sum``, flatten (float64)."""
        from fedpriv.run.aggregation import sum_replies
        from fedpriv.run.setup import build_model_for

        result = sum_replies([parse_reply(r) for r in replies])
        shapes = {k: tuple(p.shape) for k, p in build_model_for(cfg).named_parameters()}
        decoded = algorithm.decode_sum(result.total, shapes, 1)
        return np.concatenate([np.asarray(decoded[k], dtype=np.float64).ravel() for k in shapes])

    def neighbour_data(
        self, cfg: Any, pid: int, x: np.ndarray, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        from fedpriv.run.setup import run_dataset

        if self.neighbour == "remove":
            return x[:-1], y[:-1]
        ds = run_dataset(cfg)
        other = int(np.flatnonzero(ds.y_train != y[0])[0])
        x2, y2 = x.copy(), y.copy()
        x2[0], y2[0] = ds.x_train[other], ds.y_train[other]
        return x2, y2

    def noise_seed_count(self, dim: int) -> int:
        """K: enough replies per client that the noise std's relative standard error,
        about 1/sqrt(2 (K-1) d), is <= 2% (K >= 3)."""
        return max(3, 1 + math.ceil(1 / (2 * 0.02**2 * dim)))

    @staticmethod
    def influence_clients(sizes: Sequence[int]) -> list[int]:
        """Clients whose neighbouring record is measured: the three smallest and the largest
        (a divisor that depends on a client's own size makes the smallest the most
        influential; with one public normalizer every record's influence is the same)."""
        order = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
        return sorted(set(order[:3] + order[-1:]))

    def effective_sigmas(self, cfg: Any) -> tuple[float, dict[int, float]]:
        """``(accounted σ, {client: measured effective σ of its neighbouring record})``.

        Noise std of the released SUM per coordinate: over K noise seeds with the same data
        (unbiased variance across seeds, averaged over the d coordinates). Influence: the mean
        over two seeds of the difference of the released sum with the client's data and with
        its neighbouring data, same noise seeds (every other client's reply is unchanged, so
        the same bytes are summed). Effective σ = noise std / L2 norm of the influence.
        """
        from fedpriv.run.setup import build_model_for, client_partition

        algorithm = self.build(cfg)
        sigma = accounted_sigma(algorithm.privacy.round_events())
        relation = algorithm.privacy.neighboring_relation.value
        halve = self.neighbour == "replace" and relation == "add_remove"
        n_clients = cfg.num_clients
        dim = sum(p.numel() for p in build_model_for(cfg).parameters())
        seeds = list(range(11, 11 + self.noise_seed_count(dim)))
        data = [client_partition(cfg, i) for i in range(n_clients)]
        base = {
            s: [self.reply_bytes(algorithm, cfg, *data[i], i, s) for i in range(n_clients)]
            for s in seeds
        }
        sums = np.stack([self.released_sum(algorithm, cfg, base[s]) for s in seeds])
        noise_std = float(np.sqrt(np.mean(np.var(sums, axis=0, ddof=1))))
        measured: dict[int, float] = {}
        for i in self.influence_clients([len(d[1]) for d in data]):
            x2, y2 = self.neighbour_data(cfg, i, *data[i])
            diffs = []
            for k, s in enumerate(seeds[:2]):
                replies = list(base[s])
                replies[i] = self.reply_bytes(algorithm, cfg, x2, y2, i, s)
                diffs.append(sums[k] - self.released_sum(algorithm, cfg, replies))
            influence = float(np.linalg.norm(np.mean(diffs, axis=0)))
            if halve:
                influence /= 2
            measured[i] = noise_std / influence if influence > 0 else math.inf
        return sigma, measured

    # ---- the contract
    @pytest.mark.parametrize(
        "partition",
        ["iid", "dirichlet-0.05", pytest.param("natural", marks=pytest.mark.slow)],
    )
    def test_effective_noise_multiplier_of_the_released_sum(
        self, partition: str, shared_data: Any
    ) -> None:
        """Issue 11 item 1, measured from the bytes each client sends.

        Sampling error: the noise std is estimated from K·d Gaussian(-like) values with K-1
        degrees of freedom per coordinate: its relative standard error is about
        1/sqrt(2(K-1)d) <= 2% (K is chosen so; 0.6% for the logistic model's 7850 weights on
        Fashion-MNIST); ``sigma_rtol`` = 5% is 2.5 standard errors or more. With one public
        normalizer the influence is exact (the same noise cancels); the natural partition
        (ACS Income, 47 states, 0.9 M rows) is slow and marked so.
        """
        if self.measurable is not None:
            pytest.skip(self.measurable)
        cfg = self.measurement_config(partition, shared_data)
        sigma, measured = self.effective_sigmas(cfg)
        worst = min(measured, key=measured.__getitem__)
        assert measured[worst] >= sigma * (1 - self.sigma_rtol), (
            f"{partition}: client {worst}'s record has effective noise multiplier "
            f"{measured[worst]:.4g} < accounted {sigma:.4g} (all: "
            + ", ".join(f"{i}:{v:.3g}" for i, v in sorted(measured.items()))
            + ")"
        )

    def test_normalizer_is_public_and_recorded(self) -> None:
        algorithm = self.build(self.config())
        value = float(algorithm.normalizer)
        assert math.isfinite(value) and value > 0
        assert algorithm.privacy_summary().get("normalizer") == pytest.approx(value, rel=0)

    @pytest.mark.parametrize(
        ("accountant", "conversion"),
        [
            ("pld", "default"),
            ("rdp", "default"),
            ("rdp", "mironov"),
        ],
    )
    def test_calibration_meets_the_target(self, accountant: str, conversion: str) -> None:
        """Issue 11 item 2: after ``calibrated`` the run's ε (RunPrivacy over num_rounds
        rounds, with the run's accountant and conversion) is <= target and within 1%."""
        from fedpriv.run.run_privacy import RunPrivacy

        try:
            cfg = self.config(
                [
                    *self.calibration_overrides,
                    f"privacy.accountant={accountant}",
                    f"privacy.conversion={conversion}",
                ]
            )
        except ConfigError as exc:
            pytest.skip(f"{accountant}/{conversion} refused before training: {exc}")
        spec = self.build(cfg).privacy
        tuned = spec.calibrated(self.target_epsilon, self.num_rounds)
        assert tuned is not spec and tuned.calibrated_from_target_epsilon == self.target_epsilon
        run = RunPrivacy(tuned, cfg.cohort.nominal_size)
        run.check()
        for _ in range(self.num_rounds):
            run.record_round()
        eps = run.epsilon()
        assert eps <= self.target_epsilon, (accountant, conversion, eps)
        assert eps >= 0.99 * self.target_epsilon, (accountant, conversion, eps)

    def test_noise_draws_equal_events(self) -> None:
        """Issue 11: the ``noise_draws`` train metric = the count of one round's events."""
        from fedpriv.run.setup import client_partition

        cfg = self.config()
        algorithm = self.build(cfg)
        x, y = client_partition(cfg, 0)
        reply = parse_reply(self.reply_bytes(algorithm, cfg, x, y, 0, 1))
        metrics = reply.content.metric_records[METRICS_KEY]
        if "noise_draws" not in metrics:
            pytest.skip(f"{type(algorithm).__name__} reports no `noise_draws` metric yet")
        expected = sum(count for _, count in algorithm.privacy.round_events())
        assert metrics["noise_draws"] == expected


# --------------------------------------------------------------------------- aggregators


class AggregatorContract:
    """Contract of an aggregator: the sum it reveals for known updates.

    Subclasses supply ``result(one_round)`` (their ``AggregateResult`` of a round whose
    clients sent known integer residues) and ``test_non_finite_update_is_never_summed``
    (how the aggregator keeps NaN/inf out of the sum: drop/refuse the client, or accept
    integers only). The shared tests compare the sum with the numpy sum of the updates and
    with every other aggregator's sum of the same round.
    """

    #: The aggregator class the contract covers (enrollment).
    aggregator_class: ClassVar[type] = object

    def result(self, one_round: dict[str, Any]) -> Any:
        raise NotImplementedError

    def test_non_finite_update_is_never_summed(self, *args: Any) -> None:
        raise NotImplementedError("every aggregator must say how it keeps NaN/inf out")


# --------------------------------------------------------------------------- privacy specs


class PrivacySpecContract:
    """Contract of one privacy family's spec (:class:`fedpriv.accounting.core.privacy_spec.
    PrivacySpec`); subclass and fill the hooks.

    Hooks
    -----
    spec_class : type
        The family's spec class (enrollment: every family has a contract subclass).
    make_spec() -> spec
        A bound, valid spec with a numeric noise parameter (a small run's).
    cli_params(spec) -> dict or None
        ``fedpriv-account`` parameters that must build a spec with the same round events
        (``None``: the family's analysis has no parameters for this spec).
    bad_noise : value
        A value of the noise parameter the spec must refuse.
    num_rounds, target_epsilon : calibration test settings.
    """

    spec_class: ClassVar[type] = object
    bad_noise: ClassVar[Any] = -1.0
    num_rounds: ClassVar[int] = 3
    target_epsilon: ClassVar[float] = 3.0

    def make_spec(self) -> Any:
        raise NotImplementedError

    def cli_params(self, spec: Any) -> dict[str, str] | None:
        return None

    def epsilon(self, spec: Any, rounds: int) -> float:
        return float(spec.epsilon(rounds))

    def test_is_of_its_class_and_family(self) -> None:
        spec = self.make_spec()
        assert type(spec) is self.spec_class
        assert spec.family and spec.family == self.spec_class.family

    def test_payload_round_trip_gives_the_same_spec_and_events(self) -> None:
        from fedpriv.accounting.core.privacy_spec import PrivacySpec
        from fedpriv.common import payload

        spec = self.make_spec()
        back = payload.loads(payload.dumps(spec), PrivacySpec)
        assert back == spec and type(back) is type(spec)
        assert self.epsilon(back, 2) == self.epsilon(spec, 2)

    def test_payload_of_another_type_is_refused(self) -> None:
        from fedpriv.common import payload
        from fedpriv.mechanisms.client_sampling import CohortSampler

        with pytest.raises(TypeError):
            payload.loads(payload.dumps(self.make_spec()), CohortSampler)

    def test_config_schema_is_the_unbound_fields_with_the_spec_defaults(self) -> None:
        import dataclasses

        from fedpriv.accounting.core.privacy_spec import config_schema

        schema = {f.name: f for f in dataclasses.fields(config_schema(self.spec_class))}
        fields = {f.name: f for f in dataclasses.fields(self.spec_class) if f.init}
        assert set(schema) - {"_target_"} == set(fields) - set(self.spec_class.bound_fields)
        for name in set(schema) - {"_target_"}:
            given = fields[name].default
            if given is dataclasses.MISSING:
                given = fields[name].default_factory()  # type: ignore[misc]
            want = schema[name].default
            if want is dataclasses.MISSING:
                want = schema[name].default_factory()  # type: ignore[misc]
            assert want == (list(given) if isinstance(given, tuple) else given), name

    def test_calibrated_is_a_new_spec_meeting_the_target(self) -> None:
        spec = self.make_spec()
        tuned = spec.calibrated(self.target_epsilon, self.num_rounds)
        assert tuned is not spec and type(tuned) is type(spec)
        assert tuned.target_epsilon is None
        assert tuned.calibrated_from_target_epsilon == self.target_epsilon
        eps = self.epsilon(tuned, self.num_rounds)
        assert 0.99 * self.target_epsilon <= eps <= self.target_epsilon

    def test_summary_is_json_and_names_the_family(self) -> None:
        spec = self.make_spec()
        summary = spec.summary()
        assert summary["family"] == spec.family
        json.loads(json.dumps(summary))

    def test_bound_refuses_a_config_field(self) -> None:
        spec = self.make_spec()
        with pytest.raises(TypeError):
            spec.bound(target_delta=1e-3)

    def test_refuses_a_bad_noise_parameter_naming_it(self) -> None:
        import dataclasses

        spec = self.make_spec()
        with pytest.raises(ConfigError) as err:
            dataclasses.replace(spec, **{spec.calibrates: self.bad_noise})
        assert err.value.field == f"privacy.{spec.calibrates}"

    def test_a_degraded_round_never_costs_less(self) -> None:
        from fedpriv.accounting.core.privacy_spec import UnaccountableRound

        spec = self.make_spec()
        try:
            events = spec.degraded_round_events(1)
        except (UnaccountableRound, ConfigError):
            return
        ledger = spec.accounting.ledger()
        for event, count in events:
            ledger.record(event, count)
        assert ledger.get_epsilon(spec.target_delta) >= self.epsilon(spec, 1) * (1 - 1e-9)

    def test_local_release_never_costs_less_than_the_central_one(self) -> None:
        spec = self.make_spec()
        if not spec.local_events():
            return
        ledger = spec.accounting.ledger()
        for event, count in spec.local_events():
            ledger.record(event, count)
        assert ledger.get_epsilon(spec.target_delta) >= self.epsilon(spec, 1) * (1 - 1e-9)

    def test_cli_builds_the_same_events(self) -> None:
        spec = self.make_spec()
        params = self.cli_params(spec)
        if params is None:
            pytest.skip(f"{type(spec).__name__}: no fedpriv-account parameters for this spec")
        from fedpriv.accounting.core.params import Params

        built = spec_from_params(type(spec), Params(params, spec.family))
        assert built.round_events() == spec.round_events()
