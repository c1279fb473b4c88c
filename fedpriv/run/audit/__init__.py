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
Estimation for Federated Learning", arXiv:2302.03098 (random-direction canary
clients, cosine scores, Gaussian fit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import torch

from fedpriv.accounting.client_level.spec import ClientLevelSpec
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.common.errors import check
from fedpriv.mechanisms.client_sampling import ClientSampling
from fedpriv.run.algorithm import ClientAlgorithm, PrivacyUnit
from fedpriv.run.audit.bound import (
    count_guesses,
    epsilon_lower_bound,
    gaussian_epsilon,
    gaussian_fit_epsilon,
    p_value,
)
from fedpriv.run.audit.canaries import (
    AUDIT_STREAM,
    CLIENT_CANARIES,
    GUESS_FRACTION,
    RECORD_CANARIES,
    ClientCanaries,
    RecordCanaries,
    inclusion,
    ood_inputs,
    record_canaries,
    with_canaries,
)
from fedpriv.run.plan import RunPlan

__all__ = [
    "AUDIT_STREAM",
    "CLIENT_CANARIES",
    "GUESS_FRACTION",
    "RECORD_CANARIES",
    "AuditMethod",
    "ClientCanaries",
    "RecordCanaries",
    "RunAudit",
    "check_audit",
    "count_guesses",
    "epsilon_lower_bound",
    "gaussian_epsilon",
    "gaussian_fit_epsilon",
    "inclusion",
    "ood_inputs",
    "p_value",
    "record_canaries",
    "with_canaries",
]


class AuditMethod(StrEnum):
    """How the canaries are built and scored (``results.json``: ``audit_method``)."""

    RECORDS = "one-run canary records, loss scores (Steinke, Nasr, Jagielski 2023)"
    CLIENTS = "one-run canary clients, cosine scores (Andrew et al. 2024; bound: Steinke et al.)"


def check_audit(plan: RunPlan, algorithm: ClientAlgorithm) -> None:
    """Refuse, before anything runs, an audit the run cannot do.

    Raises
    ------
    ConfigError
        A check-in client; a record-level algorithm not accounted as Poisson-sampled local
        DP-SGD; a client-level run with adaptive clipping, integer updates or a cohort
        sampling other than ``all``/``poisson``.
    """
    if plan.audit is None:
        return
    kind = plan.audit.value
    supported = (
        "is supported for client=dpsgd (record level) and client=client_level with fixed "
        "clipping, float updates and client_sampling=all|poisson"
    )
    check(not algorithm.checks_in, "audit", kind, supported)
    if algorithm.privacy_unit is PrivacyUnit.RECORD:
        check(type(algorithm.privacy) is DPSGDSpec, "audit", kind, supported)
        return
    check(not algorithm.integer_updates, "audit", kind, supported)
    check(not algorithm.adaptive_clipping, "audit", kind, supported)
    sampling = plan.cohort.client_sampling
    check(sampling in (ClientSampling.ALL, ClientSampling.POISSON), "audit", kind, supported)


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
        cls, plan: RunPlan, algorithm: ClientAlgorithm, model: torch.nn.Module
    ) -> RunAudit | None:
        """The run's audit (``None`` when ``audit`` is null); ``model`` holds the initial
        (public, seeded) state the scores are measured from."""
        if plan.audit is None:
            return None
        check_audit(plan, algorithm)
        initial = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
        unit = algorithm.privacy_unit
        audit = cls(
            unit=unit.value,
            confidence=plan.audit_confidence,
            delta=plan.privacy.target_delta,
            initial_state=initial,
        )
        if unit is PrivacyUnit.RECORD:
            audit.records = record_canaries(plan)
            audit._initial_losses = audit.records.losses(model)
            m, method = audit.records.m, AuditMethod.RECORDS
        else:
            shapes = {k: tuple(p.shape) for k, p in model.named_parameters() if p.requires_grad}
            cohort = plan.cohort
            rate = cohort.client_sample_rate if cohort.varies else None
            seed = plan.seed
            included = inclusion(seed, CLIENT_CANARIES)
            audit.clients = ClientCanaries(seed, shapes, included, float(rate or 1.0))
            spec = algorithm.privacy
            audit.clip_norm = spec.clipping_norm if isinstance(spec, ClientLevelSpec) else 1.0
            m, method = CLIENT_CANARIES, AuditMethod.CLIENTS
        audit.summary = {
            "audit": plan.audit.value,
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
