"""Empirical privacy audit in one run (``audit=canaries``): an ε LOWER bound beside the
accounted ε.

``m`` canaries are each included in the run with probability 1/2, independently, from a
generator seeded by ``(seed,)`` with the audit's own spawn key (never a noise stream). After
every released round the server scores each canary with the current model, guesses the
``k`` highest-scoring canaries "included" and the ``k`` lowest "excluded" (abstaining on the
others: ``k`` fixed up front, so no optimisation over guesses spends confidence) and turns
the number of correct guesses into a lower bound on ε at the configured confidence.

- Record-level runs (``privacy_unit == "record"``): canary RECORDS, out-of-distribution
  inputs (i.i.d. N(0, 1) pixels, the data are standardised) with a uniformly random label,
  spread over the clients (canary ``j`` lives on client ``j mod num_clients``) and appended
  to its training rows; score = the canary's cross-entropy under the initial model minus
  under the current one (lower loss => "included"); Steinke, Nasr, Jagielski 2023.
- Client-level runs (``privacy_unit == "client"``): canary CLIENTS, each sending a fixed
  random unit direction times the clip norm ``C`` whenever it is sampled (at the cohort's
  own rate), added to the decoded sum BEFORE the algorithm's ``release`` (the trusted
  aggregator's noise covers it like any client's clipped delta); score = cosine between the
  direction and the current model minus the initial model; Andrew et al. 2024. The same
  guess counting gives a bound with a stated confidence; the Gaussian-fit point estimate of
  Andrew et al. is reported too, labelled an estimate.

Canaries never reach the accountant: ε is composed from the algorithm's events only, so an
audited run reports the same ε path as the run without canaries (it does train on them).

References
----------
Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", arXiv:2305.08846,
Theorem 3 (approximate DP) and its Algorithm (``p``-value of ``v`` correct out of ``r``
guesses). Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy
Estimation for Federated Learning", arXiv:2302.03098, Alg. 2 (random-direction canary
clients, cosine scores, Gaussian fit).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from scipy import stats

from fedpriv.errors import ConfigError, check

#: Spawn key of the audit's draws (inclusion, canary contents, canary sampling).
AUDIT_STREAM = 0xA0D17
#: Canaries of a record-level run: at most this many, and at most a sixth of the records.
RECORD_CANARIES = 1000
#: Canary clients of a client-level run.
CLIENT_CANARIES = 1000
#: Guesses on each side (top k "in", bottom k "out"), as a fraction of m: fixed up front.
GUESS_FRACTION = 0.1


class AuditKind(StrEnum):
    """What ``audit`` inserts into the run."""

    CANARIES = "canaries"


class AuditMethod(StrEnum):
    """How the canaries are built and scored (``results.json``: ``audit_method``)."""

    RECORDS = "one-run canary records, loss scores (Steinke, Nasr, Jagielski 2023)"
    CLIENTS = "one-run canary clients, cosine scores (Andrew et al. 2024; bound: Steinke et al.)"


# ---------------------------------------------------------------------------------------
# The bound (Steinke, Nasr, Jagielski 2023)
# ---------------------------------------------------------------------------------------


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Probability of ``>= v`` correct guesses out of ``r`` under an (ε, δ)-DP run.

    With ``q = e^ε / (1 + e^ε)`` and ``W' ~ Binomial(r, q)``::

        p = P[W' >= v] + 2 m δ · max_{1 <= i <= v} P[v - i <= W' < v] / i

    Parameters
    ----------
    m : int
        Canaries, each included independently with probability 1/2.
    r : int
        Guesses made (abstentions excluded), ``0 <= r <= m``.
    v : int
        Correct guesses, ``0 <= v <= r``.
    epsilon, delta : float
        The null hypothesis: the run is (ε, δ)-DP, ε >= 0, δ in [0, 1].

    Returns
    -------
    float
        The p-value in [0, 1].

    Raises
    ------
    ConfigError
        For counts or parameters out of range.

    References
    ----------
    Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", arXiv:2305.08846,
    Theorem 3 and the p-value algorithm of its appendix.
    """
    check(0 <= v <= r <= m, "audit.guesses", (m, r, v), "must satisfy 0 <= v <= r <= m")
    check(epsilon >= 0, "audit.epsilon", epsilon, "must be >= 0")
    check(0 <= delta <= 1, "audit.delta", delta, "must be in [0, 1]")
    q = 1.0 / (1.0 + math.exp(-epsilon)) if epsilon < 700 else 1.0
    tail = float(stats.binom.sf(v - 1, r, q))  # P[W' >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    below = stats.binom.sf(v - i - 1, r, q) - tail  # P[v - i <= W' < v]
    alpha = float(np.max(below / i))
    return min(tail + 2.0 * m * delta * max(alpha, 0.0), 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """The largest ε that ``v`` correct out of ``r`` guesses refute at ``confidence``.

    ``sup {ε >= 0 : p_value(m, r, v, ε, δ) <= 1 - confidence}`` (0 if even ε = 0 is not
    refuted), found by bisection to 1e-6 in ε (the p-value increases with ε).

    Parameters
    ----------
    m, r, v : int
        Canaries, guesses, correct guesses (:func:`p_value`).
    delta : float
        The run's δ (``privacy.target_delta``).
    confidence : float
        1 - β in (0, 1), e.g. 0.95.

    Returns
    -------
    float
        ε_lb >= 0: with probability >= ``confidence`` over the canaries' inclusion, the run
        is not (ε, δ)-DP for any ε < ε_lb.

    Raises
    ------
    ConfigError
        For ``confidence`` outside (0, 1) or counts out of range.

    References
    ----------
    Steinke, Nasr, Jagielski, arXiv:2305.08846, Theorem 3.
    """
    check(0 < confidence < 1, "audit_confidence", confidence, "must be in (0, 1)")
    beta = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) <= beta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:  # p-value tends to 1 (v > 0) as ε grows: unreachable for sane counts
            return lo
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) <= beta:
            lo = mid
        else:
            hi = mid
    return lo


def count_guesses(scores: np.ndarray, included: np.ndarray, k: int) -> tuple[int, int]:
    """``(r, v)``: guess the ``k`` highest ``scores`` "in" and the ``k`` lowest "out".

    Ties are broken by the canary index (a fixed, inclusion-independent order); ``r = 2k``
    (or ``m`` if ``2k > m``).

    Parameters
    ----------
    scores : ndarray, shape (m,)
        Higher means "more likely included".
    included : ndarray of bool, shape (m,)
        The true inclusion.
    k : int
        Guesses on each side, ``>= 0``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    m = len(scores)
    k = min(int(k), m // 2)
    order = np.lexsort((np.arange(m), -np.nan_to_num(scores, nan=-np.inf)))  # best first
    guessed_in, guessed_out = order[:k], order[m - k :] if k else order[:0]
    v = int(np.sum(included[guessed_in])) + int(np.sum(~included[guessed_out]))
    return 2 * k, v


def gaussian_fit_epsilon(in_scores: np.ndarray, out_scores: np.ndarray, delta: float) -> float:
    """Andrew et al.'s point ESTIMATE (not a bound): fit N(μ_in, s_in²), N(μ_out, s_out²) to
    the scores and return the ε at ``delta`` of the Gaussian mechanism with
    ``μ = |μ_in - μ_out| / s_out`` (arXiv:2302.03098, Sec. 4, equal-variance fit)."""
    if len(in_scores) < 2 or len(out_scores) < 2:
        return 0.0
    s = float(np.std(out_scores, ddof=1))
    if not s > 0:
        return math.inf
    mu = abs(float(np.mean(in_scores)) - float(np.mean(out_scores))) / s
    return gaussian_epsilon(mu, delta)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε at ``delta`` of μ-GDP: δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2) (Dong, Roth, Su,
    "Gaussian Differential Privacy", arXiv:1905.02383, Cor. 2.13), by bisection."""
    if mu <= 0:
        return 0.0

    def dlt(eps: float) -> float:
        return float(
            stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        )

    if dlt(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while dlt(hi) > delta and hi < 1e3:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if dlt(mid) > delta else (lo, mid)
    return hi


# ---------------------------------------------------------------------------------------
# Canaries
# ---------------------------------------------------------------------------------------


def _rng(seed: int, *path: int) -> np.random.Generator:
    """The audit's generator for ``path`` (its own spawn key: never a noise stream)."""
    seq = np.random.SeedSequence([int(seed), *map(int, path)], spawn_key=(AUDIT_STREAM,))
    return np.random.default_rng(seq)


def inclusion(seed: int, m: int) -> np.ndarray:
    """Which of ``m`` canaries are in the run: i.i.d. Bernoulli(1/2), shape ``(m,)`` bool."""
    return _rng(seed, 0).random(m) < 0.5


@dataclass(frozen=True)
class RecordCanaries:
    """Canary records: ``x`` ``(m, *input_shape)`` float32, ``y`` ``(m,)`` int64, ``owner``
    ``(m,)`` (the client holding canary ``j``: ``j mod num_clients``), ``included`` ``(m,)``."""

    x: np.ndarray
    y: np.ndarray
    owner: np.ndarray
    included: np.ndarray

    @classmethod
    def for_run(cls, cfg: Mapping[str, Any]) -> RecordCanaries:
        from fedpriv.setup import run_dataset

        ds = run_dataset(dict(cfg))
        n, seed = len(ds.y_train), int(cfg["seed"])
        m = min(RECORD_CANARIES, n // 6)
        check(m >= 10, "audit", "canaries", f"needs >= 60 training records ({n} here)")
        x = ood_inputs(ds.x_train, m, _rng(seed, 1))
        rng = _rng(seed, 4)
        y = rng.integers(0, ds.num_classes, size=m).astype(np.int64)
        owner = np.arange(m) % int(cfg["num_clients"])
        return cls(x, y, owner, inclusion(seed, m))

    @property
    def m(self) -> int:
        return len(self.y)

    def rows_for(self, partition_id: int) -> tuple[np.ndarray, np.ndarray]:
        """The included canaries client ``partition_id`` holds: ``(x, y)``."""
        mask = self.included & (self.owner == int(partition_id))
        return self.x[mask], self.y[mask]

    def losses(self, model: torch.nn.Module) -> np.ndarray:
        """Cross-entropy of every canary under ``model``, shape ``(m,)``."""
        was = model.training
        model.eval()
        device = next(model.parameters()).device
        with torch.no_grad():
            out = model(torch.from_numpy(self.x).to(device))
            loss = torch.nn.functional.cross_entropy(
                out, torch.from_numpy(self.y).to(device), reduction="none"
            )
        model.train(was)
        return loss.cpu().numpy().astype(np.float64)


def ood_inputs(x_train: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` out-of-distribution inputs, shape ``(m, *x_train.shape[1:])`` float32: Gaussian
    vectors projected off the span of the data's top ``d/2`` right singular vectors (so the
    real records' gradients barely move a canary's logits), scaled to norm ``sqrt(d)``."""
    flat = np.asarray(x_train, np.float64).reshape(len(x_train), -1)
    d = flat.shape[1]
    top = np.linalg.svd(flat[:4000], full_matrices=False)[2][: d // 2]  # (d/2, d)
    g = rng.standard_normal((m, d))
    g -= (g @ top.T) @ top
    g *= math.sqrt(d) / np.linalg.norm(g, axis=1, keepdims=True)
    return g.astype(np.float32).reshape(m, *x_train.shape[1:])


def _cfg_key(cfg: Mapping[str, Any]) -> str:
    keys = ("dataset", "seed", "num_clients", "audit")
    return json.dumps({k: cfg.get(k) for k in keys}, sort_keys=True)


@lru_cache(maxsize=2)
def _record_canaries(key: str) -> RecordCanaries:
    return RecordCanaries.for_run(json.loads(key))


def record_canaries(cfg: Mapping[str, Any]) -> RecordCanaries:
    """The run's canary records (built once per process, the same on every node)."""
    return _record_canaries(_cfg_key(cfg))


def with_canaries(
    cfg: Mapping[str, Any], partition_id: int, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``partition_id``'s rows with its included canary records appended (as is when
    the run is not audited, or is a client-level run)."""
    if cfg.get("audit") is None or not _record_unit(cfg):
        return x, y
    cx, cy = record_canaries(cfg).rows_for(partition_id)
    if len(cy) == 0:
        return x, y
    return torch.cat([x, torch.from_numpy(cx)]), torch.cat([y, torch.from_numpy(cy)])


@lru_cache(maxsize=4)
def _unit_of(client_json: str) -> str:
    from hydra.utils import get_class

    return str(getattr(get_class(json.loads(client_json)["_target_"]), "privacy_unit", "record"))


def _record_unit(cfg: Mapping[str, Any]) -> bool:
    return _unit_of(json.dumps(cfg["client"], sort_keys=True)) == "record"


@dataclass(frozen=True)
class ClientCanaries:
    """Canary clients: ``m`` fixed random unit directions over the trainable parameters
    (``shapes``, concatenated in their order), ``included`` ``(m,)``, sampled each round at
    ``rate`` (1: every round)."""

    seed: int
    shapes: dict[str, tuple[int, ...]]
    included: np.ndarray
    rate: float

    @property
    def m(self) -> int:
        return len(self.included)

    @property
    def dim(self) -> int:
        return int(sum(math.prod(s) for s in self.shapes.values()))

    def direction(self, j: int) -> np.ndarray:
        """Canary ``j``'s unit vector, shape ``(dim,)`` float64 (from its own seed)."""
        table = self._table()
        if table is not None:
            return table[j]
        u = _rng(self.seed, 2, j).standard_normal(self.dim)
        return u / np.linalg.norm(u)

    def _table(self) -> np.ndarray | None:
        """Every direction, ``(m, dim)``, built once when it fits in 64 MiB (else ``None``:
        each is regenerated from its seed when needed)."""
        if self.m * self.dim * 8 > 64 * 2**20:
            return None
        cached = self.__dict__.get("_directions")
        if cached is None:
            rows = [_rng(self.seed, 2, j).standard_normal(self.dim) for j in range(self.m)]
            cached = np.stack(rows)
            cached /= np.linalg.norm(cached, axis=1, keepdims=True)
            object.__setattr__(self, "_directions", cached)
        return cached

    def sampled(self, server_round: int) -> np.ndarray:
        """Included canaries taking part in ``server_round`` (indices)."""
        ids = np.flatnonzero(self.included)
        if self.rate >= 1:
            return ids
        return ids[_rng(self.seed, 3, server_round).random(len(ids)) < self.rate]

    def round_sum(self, server_round: int, clip_norm: float) -> np.ndarray:
        """``Σ_j C u_j`` over the round's sampled canaries, shape ``(dim,)``."""
        ids = self.sampled(server_round)
        table = self._table()
        if table is not None:
            return clip_norm * table[ids].sum(axis=0)
        total = np.zeros(self.dim)
        for j in ids:
            total += clip_norm * self.direction(int(j))
        return total

    def cosines(self, delta: np.ndarray) -> np.ndarray:
        """cos(u_j, ``delta``) for every canary, shape ``(m,)`` (0 for a zero delta)."""
        norm = float(np.linalg.norm(delta))
        if norm == 0:
            return np.zeros(self.m)
        table = self._table()
        if table is not None:
            return (table @ delta) / norm
        return np.array([self.direction(j) @ delta for j in range(self.m)]) / norm

    def flat(self, state: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(state[k], np.float64).ravel() for k in self.shapes])

    def unflat(self, vec: np.ndarray) -> dict[str, np.ndarray]:
        out, at = {}, 0
        for k, s in self.shapes.items():
            size = math.prod(s)
            out[k] = vec[at : at + size].reshape(s)
            at += size
        return out


# ---------------------------------------------------------------------------------------
# The run's audit (what the runner holds)
# ---------------------------------------------------------------------------------------


def check_audit(cfg: Mapping[str, Any], algorithm: Any) -> None:
    """Refuse, before anything runs, an audit the run cannot do.

    Raises
    ------
    ConfigError
        ``audit`` not null/canaries; ``audit_confidence`` outside (0, 1); a record-level
        algorithm not accounted as Poisson-sampled local DP-SGD; a client-level run with
        adaptive clipping, integer updates or a cohort sampling other than
        ``all``/``poisson``; a check-in strategy.
    """
    kind = cfg.get("audit")
    if kind is None:
        return
    allowed = tuple(k.value for k in AuditKind)
    if kind not in allowed:
        raise ConfigError("audit", kind, f"must be null or one of {allowed}")
    conf = cfg.get("audit_confidence", 0.95)
    check(
        isinstance(conf, (int, float)) and 0 < float(conf) < 1,
        "audit_confidence",
        conf,
        "must be in (0, 1), e.g. 0.95",
    )
    supported = (
        "is supported for client=dpsgd (record level) and client=client_level with fixed "
        "clipping, float updates and client_sampling=all|poisson"
    )
    if hasattr(algorithm, "query_handler"):
        raise ConfigError("audit", kind, supported)
    unit = getattr(algorithm, "privacy_unit", "record")
    if unit == "record":
        from fedpriv.accounting.dpsgd import DPSGDSpec

        if type(getattr(algorithm, "spec", None)) is not DPSGDSpec:
            raise ConfigError("audit", kind, supported)
        return
    if unit != "client" or bool(getattr(algorithm, "integer_updates", False)):
        raise ConfigError("audit", kind, supported)
    if getattr(algorithm, "target_unclipped_quantile", None) is not None:
        raise ConfigError("audit", kind, supported)
    if str(cfg.get("client_sampling", "all")) not in ("all", "poisson"):
        raise ConfigError("audit", kind, supported)


@dataclass
class RunAudit:
    """A run's audit: canaries, the initial model, and the latest result.

    Built by :meth:`for_run` on the server; :meth:`before_release` adds canary clients to a
    client-level round's decoded sum; :meth:`round_figures` scores the canaries after each
    released round and returns the row's figures; :attr:`summary` is the ``privacy`` block's.
    """

    unit: str
    confidence: float
    delta: float
    initial_state: dict[str, np.ndarray]
    records: RecordCanaries | None = None
    clients: ClientCanaries | None = None
    clip_norm: float = 1.0
    summary: dict[str, Any] = field(default_factory=dict)
    _initial_losses: np.ndarray | None = None

    @classmethod
    def for_run(
        cls, cfg: Mapping[str, Any], algorithm: Any, model: torch.nn.Module
    ) -> RunAudit | None:
        """The run's audit (``None`` when ``audit`` is null); ``model`` holds the initial
        (public, seeded) state the scores are measured from."""
        if cfg.get("audit") is None:
            return None
        check_audit(cfg, algorithm)
        initial = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
        unit = str(getattr(algorithm, "privacy_unit", "record"))
        audit = cls(
            unit=unit,
            confidence=float(cfg.get("audit_confidence", 0.95)),
            delta=float(cfg["privacy"]["target_delta"]),
            initial_state=initial,
        )
        if unit == "record":
            audit.records = record_canaries(cfg)
            audit._initial_losses = audit.records.losses(model)
            m, method = audit.records.m, AuditMethod.RECORDS
        else:
            shapes = {k: tuple(p.shape) for k, p in model.named_parameters() if p.requires_grad}
            sampling = str(cfg.get("client_sampling", "all"))
            rate = float(cfg["client_sample_rate"]) if sampling == "poisson" else 1.0
            seed = int(cfg["seed"])
            audit.clients = ClientCanaries(seed, shapes, inclusion(seed, CLIENT_CANARIES), rate)
            audit.clip_norm = float(cfg["privacy"]["clipping_norm"])
            m, method = CLIENT_CANARIES, AuditMethod.CLIENTS
        audit.summary = {
            "audit": AuditKind.CANARIES.value,
            "audit_method": method.value,
            "audit_confidence": audit.confidence,
            "audit_num_canaries": m,
            "audit_canaries_included": int(audit.included.sum()),
            "audit_epsilon_lower_bound": 0.0,
            "audit_guesses": 0,
            "audit_correct_guesses": 0,
            "audit_trains_on_canaries": True,
            "audit_note": (
                "the model trains on the included canaries; the accounted epsilon is composed "
                "from the algorithm's events only (canaries never enter the accountant); the "
                "bound holds at audit_confidence for each round separately"
            ),
        }
        return audit

    def header(self) -> str:
        """The line printed under the run's header."""
        what = "canary records" if self.records is not None else "canary clients"
        return (
            f"audit=canaries: {len(self.included)} {what}, {int(self.included.sum())} included "
            f"(the model trains on them; ε is accounted without them); ε lower bound at "
            f"{self.confidence:g} confidence from {2 * self.guesses_per_side} guesses per round"
        )

    @property
    def included(self) -> np.ndarray:
        c = self.records if self.records is not None else self.clients
        assert c is not None
        return c.included

    @property
    def guesses_per_side(self) -> int:
        return int(GUESS_FRACTION * len(self.included))

    def before_release(
        self, total: dict[str, Any], server_round: int, round_config: Mapping[str, float]
    ) -> dict[str, Any]:
        """Client-level: the decoded sum plus this round's sampled canary clients' ``C u_j``
        (``round_config['clipping_norm']`` if the algorithm sends one, else
        ``privacy.clipping_norm``); unchanged for record-level runs."""
        if self.clients is None:
            return total
        c = float(round_config.get("clipping_norm", self.clip_norm))
        extra = self.clients.unflat(self.clients.round_sum(server_round, c))
        out = dict(total)
        for k, v in extra.items():
            base = np.asarray(out[k])
            out[k] = (base + v).astype(base.dtype)
        return out

    def scores(self, model: torch.nn.Module, state: Mapping[str, np.ndarray]) -> np.ndarray:
        """Every canary's score under the current model (higher => "included")."""
        if self.records is not None:
            assert self._initial_losses is not None
            return self._initial_losses - self.records.losses(model)
        assert self.clients is not None
        delta = self.clients.flat(state) - self.clients.flat(self.initial_state)
        return self.clients.cosines(delta)

    def round_figures(
        self, model: torch.nn.Module, state: Mapping[str, np.ndarray]
    ) -> dict[str, float]:
        """Score the canaries, count the guesses, bound ε: the round's ``audit_*`` figures
        (also stored in :attr:`summary`)."""
        scores = self.scores(model, state)
        inc = self.included
        r, v = count_guesses(scores, inc, self.guesses_per_side)
        lb = epsilon_lower_bound(len(inc), r, v, self.delta, self.confidence)
        row = {
            "audit_epsilon_lb": lb,
            "audit_guesses": float(r),
            "audit_correct": float(v),
        }
        self.summary.update(audit_epsilon_lower_bound=lb, audit_guesses=r, audit_correct_guesses=v)
        if self.clients is not None:
            est = gaussian_fit_epsilon(scores[inc], scores[~inc], self.delta)
            row["audit_epsilon_estimate"] = est
            self.summary["audit_epsilon_estimate_gaussian_fit"] = est
            self.summary["audit_estimate_note"] = (
                "Andrew et al. Gaussian-fit point estimate: an estimate, not a bound"
            )
        return row
