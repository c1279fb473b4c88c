"""The audit's canaries: the inclusion draw, canary records and canary clients.

Every draw comes from a generator seeded by ``(seed, ...)`` with the audit's own spawn key
(:data:`AUDIT_STREAM`), never a noise stream, so the same canaries and inclusion are rebuilt
on every node and on resume.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from fedpriv.common.errors import check
from fedpriv.run.algorithm import PrivacyUnit
from fedpriv.run.plan import RunPlan
from fedpriv.run.setup import algorithm_class, run_dataset

#: Spawn key of the audit's draws (inclusion, canary contents, canary sampling).
AUDIT_STREAM = 0xA0D17
#: Canaries of a record-level run: at most this many, and at most a sixth of the records.
RECORD_CANARIES = 1000
#: Canary clients of a client-level run.
CLIENT_CANARIES = 1000
#: Guesses on each side (top k "in", bottom k "out"), as a fraction of m: fixed up front.
GUESS_FRACTION = 0.1


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
    def for_run(cls, plan: RunPlan) -> RecordCanaries:
        ds = run_dataset(plan)
        n, seed = len(ds.y_train), plan.seed
        m = min(RECORD_CANARIES, n // 6)
        check(m >= 10, "audit", "canaries", f"needs >= 60 training records ({n} here)")
        x = ood_inputs(ds.x_train, m, _rng(seed, 1))
        rng = _rng(seed, 4)
        y = rng.integers(0, ds.num_classes, size=m).astype(np.int64)
        owner = np.arange(m) % plan.num_clients
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


@lru_cache(maxsize=2)
def _record_canaries(plan_json: str) -> RecordCanaries:
    return RecordCanaries.for_run(RunPlan.from_payload(plan_json))


def record_canaries(plan: RunPlan) -> RecordCanaries:
    """The run's canary records (built once per process, the same on every node)."""
    return _record_canaries(plan.to_payload())


def with_canaries(
    plan: RunPlan, partition_id: int, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``partition_id``'s rows with its included canary records appended (as is when
    the run is not audited, or is a client-level run)."""
    if plan.audit is None or algorithm_class(plan.client).privacy_unit is not PrivacyUnit.RECORD:
        return x, y
    cx, cy = record_canaries(plan).rows_for(partition_id)
    if len(cy) == 0:
        return x, y
    return torch.cat([x, torch.from_numpy(cx)]), torch.cat([y, torch.from_numpy(cy)])


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
