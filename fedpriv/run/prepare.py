"""From the composed config to a validated plan, before anything is written.

:func:`prepare` refuses any bad value with one line naming the field, builds the privacy spec
from the ``privacy`` node (its ``_target_``), the client algorithm with it, calibrates the noise
when ``target_epsilon`` is given, and checks every combination the run depends on (the
accountant can account the events, the cohort and aggregator suit the algorithm, ...).
:func:`build_server` builds the strategy and the aggregator of a prepared plan.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from fedpriv.accounting.core.privacy_spec import PrivacySpec, UnaccountableRound
from fedpriv.common.errors import ConfigError, build_error, check
from fedpriv.common.targets import target_class
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.mechanisms.enforced_cohort import AvailabilityTrace
from fedpriv.mechanisms.vmap_clients import dense_chain
from fedpriv.run.aggregation import Aggregator, IdealAggregator, aggregator_class
from fedpriv.run.algorithm import ClientAlgorithm, PrivacyUnit
from fedpriv.run.audit import check_audit
from fedpriv.run.config import check_all_finite, check_known_keys, to_container
from fedpriv.run.layout import Layout, plan_layout
from fedpriv.run.migration import check_migrated
from fedpriv.run.plan import (
    DatasetPlan,
    ModelPlan,
    PartitionPlan,
    RoundFailure,
    RunPlan,
    sampling_of,
)
from fedpriv.run.run_privacy import RunPrivacy
from fedpriv.run.setup import (
    algorithm_class,
    build_algorithm,
    build_model_for,
    partitions,
    resolve_device,
    run_dataset,
)
from fedpriv.run.strategy import Strategy


def prepare(cfg: DictConfig) -> tuple[RunPlan, ClientAlgorithm]:
    """Validate everything and build the client algorithm (calibrating its noise if asked).

    Returns the plan (its ``privacy`` the algorithm's bound, calibrated spec) and the
    algorithm.

    Raises
    ------
    ConfigError
        On any bad value or combination, before anything is written.
    """
    check_known_keys(cfg)
    node = to_container(cfg)
    check_migrated(node)
    check_all_finite(node)
    node, note = lattice_twin(node)
    if note:
        print(note, file=sys.stderr)
    plan = plan_of(node, build_spec(node["privacy"]))
    run_dataset(plan)
    partitions(plan)
    resolve_device(plan)
    build_model_for(plan)  # a bad model is refused before any output is written
    algorithm = build_algorithm(plan)
    check_audit(plan, algorithm)
    if algorithm.privacy.needs_calibration:
        algorithm = algorithm.calibrated(plan.num_rounds)
    plan = plan.with_privacy(algorithm.privacy)
    check_privacy(plan)
    check_engine(plan, algorithm)
    return plan, algorithm


def lattice_twin(node: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``privacy.secure_mode=true`` with a float-noise client that names a
    :attr:`~fedpriv.run.algorithm.ClientAlgorithm.lattice_twin`: the config node that runs the
    twin instead, and the line that says so (``node, ""`` when nothing changes).

    The twin keeps the client's keys (the twin's class validates them) and builds its own
    family's spec from the same privacy keys; its analysis picks the accountant (Skellam: RDP).
    A float Gaussian release leaks its input through the low-order bits of the floats (Mironov
    2012, "On Significance of the Least Significant Bits for Differential Privacy"); a sum of
    integers does not: neighbouring inputs give the same support.
    """
    privacy = node["privacy"]
    cls = algorithm_class(node["client"])
    if not privacy.get("secure_mode") or cls.lattice_twin is None:
        return node, ""
    if build_spec(privacy).non_private:  # no noise: nothing to harden
        return node, ""
    twin = target_class({"_target_": cls.lattice_twin}, "client", ClientAlgorithm)
    spec = twin.spec_type
    twin_privacy = {k: v for k, v in privacy.items() if k != "accountant"}
    twin_privacy["_target_"] = f"{spec.__module__}.{spec.__qualname__}"
    client = {**node["client"], "_target_": cls.lattice_twin}
    accountant = next(f.default for f in fields(spec) if f.name == "accountant")
    note = (
        f"fedpriv: privacy.secure_mode=true: {cls.__name__} draws float noise, so the run uses "
        f"{twin.__name__}: integer noise (privacy={spec.family}, accountant "
        f"{getattr(accountant, 'value', accountant)}), the same local steps"
    )
    return {**node, "client": client, "privacy": twin_privacy}, note


def build_spec(node: Any) -> PrivacySpec:
    """The privacy spec the ``privacy`` node's ``_target_`` names, validated by its class.

    Raises
    ------
    ConfigError
        If the node names no :class:`PrivacySpec` or the spec refuses a field.
    """
    check(isinstance(node, dict), "privacy", node, "must be a privacy config group (privacy=...)")
    target_class(node, "privacy", PrivacySpec)
    try:
        spec = instantiate(node, _convert_="all")
    except Exception as exc:  # Hydra wraps the constructor's ConfigError
        raise build_error("privacy", node, exc) from None
    assert isinstance(spec, PrivacySpec)
    return spec


def plan_of(node: dict[str, Any], privacy: PrivacySpec) -> RunPlan:
    """The :class:`RunPlan` of a resolved config ``node`` with its privacy spec.

    Raises
    ------
    ConfigError
        For a value out of range (one line).
    """
    res = node["client_resources"]
    return RunPlan(
        seed=node["seed"],
        num_clients=node["num_clients"],
        num_rounds=node["num_rounds"],
        dataset=DatasetPlan(**node["dataset"]),
        partition=PartitionPlan(**node["partition"]),
        model=ModelPlan(node["model"]["name"], tuple(node["model"].get("hidden") or (256,))),
        privacy=privacy,
        cohort=sampling_of(node),
        client=node["client"],
        strategy=node["strategy"],
        aggregator=node["aggregator"],
        num_workers=node["num_workers"],
        vmap_clients=node["vmap_clients"],
        device=node["device"],
        num_cpus=float(res["num_cpus"]),
        num_gpus=float(res["num_gpus"]),
        ray_init_args={k: v for k, v in (node["ray_init_args"] or {}).items()},
        ray_connect_timeout_s=float(node["ray_connect_timeout_s"]),
        round_timeout=float(node["round_timeout"]),
        round_failure=node["round_failure"],
        audit=node["audit"],
        audit_confidence=float(node["audit_confidence"]),
        progress=bool(node["progress"]),
        save_model=bool(node["save_model"]),
        plot=bool(node["plot"]),
        resume=node["resume"],
        availability=availability_of(node),
        engine=node["engine"],
    )


def availability_of(node: dict[str, Any]) -> AvailabilityTrace | None:
    """The simulated availability of ``node["availability"]`` (None: always available).

    Raises
    ------
    ConfigError
        Naming ``availability.<field>`` for one key without the other or a value out of range.
    """
    avail: dict[str, Any] = node.get("availability") or {}
    period: Any = avail.get("period")
    fraction: Any = avail.get("available_fraction")
    if period is None and fraction is None:
        return None
    check(
        period is not None,
        "availability.period",
        period,
        "must be set with availability.available_fraction",
    )
    check(
        fraction is not None,
        "availability.available_fraction",
        fraction,
        "must be set with availability.period",
    )
    return AvailabilityTrace(period=period, available_fraction=fraction, seed=int(node["seed"]))


def check_privacy(plan: RunPlan) -> str:
    """The accountant can account the spec's events, and ``stop_at_epsilon`` leaves room for
    one round; returns what answers for the central ε.

    Raises
    ------
    ConfigError
        Naming ``privacy.accountant``, the noise parameter or ``privacy.stop_at_epsilon``.
    """
    plan.privacy.startup_check()
    privacy = RunPrivacy(plan.privacy, plan.cohort.nominal_size)
    analysis = privacy.check()
    stop = plan.privacy.stop_at_epsilon
    check(
        stop is None or not privacy.next_round_exceeds_budget(),
        "privacy.stop_at_epsilon",
        stop,
        "is below the epsilon of a single round: nothing could be trained",
    )
    return analysis


def central_analysis(plan: RunPlan) -> str:
    """What answers for the central ε of ``plan`` (``"pld"``, ``"rdp (default)"``, ...), as
    :func:`check_privacy` returns it, without computing an ε (:func:`prepare` checked it)."""
    privacy = RunPrivacy(plan.privacy, plan.cohort.nominal_size)
    privacy.record_round()
    return privacy.central.analysis()


def check_engine(plan: RunPlan, algorithm: ClientAlgorithm) -> None:
    """The model suits ``vmap_clients``, the cohort the algorithm, the aggregator its updates.

    Raises
    ------
    ConfigError
        Naming ``vmap_clients``, ``client_sampling``, ``aggregator`` or ``aggregator.bits``.
    """
    check(
        plan.vmap_clients is not True or dense_chain(build_model_for(plan)) is not None,
        "vmap_clients",
        True,
        f"needs a dense model (logistic, mlp: Linear and elementwise layers); "
        f"model={plan.model.name} trains one client at a time (vmap_clients=null)",
    )
    layout = run_layout(plan)
    if layout.cohort.varies:
        check_varying_cohort(plan.privacy, layout.cohort)
        if not plan.secure_mode:
            check_someone_trains(plan)
    agg_cls = aggregator_class(plan.aggregator)
    if agg_cls.requires_integer_updates:
        hint = (
            "client_level_skellam"
            if algorithm.privacy_unit is PrivacyUnit.CLIENT
            else "skellam_dpsgd"
        )
        check(
            algorithm.integer_updates,
            "aggregator",
            agg_cls.__name__,
            "needs a client algorithm that sends integers "
            f"({type(algorithm).__name__} sends floats): use client={hint}",
        )


def check_varying_cohort(spec: PrivacySpec, cohort: CohortSampler) -> None:
    """Refuse a Poisson cohort for a spec that cannot account every smaller sum (a Poisson
    cohort may hold a single client)."""
    try:
        for fewer in {1, max(1, cohort.nominal_size - 1)}:
            spec.degraded_round_events(fewer)
    except (UnaccountableRound, ConfigError):
        raise ConfigError(
            "client_sampling",
            cohort.client_sampling.value,
            f"draws cohorts of varying size, and {type(spec).__name__} cannot account a "
            f"round with fewer than {cohort.nominal_size} clients: use "
            "client_sampling=fixed_size",
        ) from None


def check_someone_trains(plan: RunPlan) -> None:
    """Refuse a seeded run whose cohorts are empty in every round (nothing would train).

    Raises
    ------
    ConfigError
        Naming ``num_rounds`` and what the sampling draws.
    """
    cohort = plan.cohort
    if any(len(cohort.draw(r)) for r in range(1, plan.num_rounds + 1)):
        return
    if cohort.client_sampling is ClientSampling.RANDOM_ALLOCATION:
        why = (
            f"each client takes part in rounds_per_client={cohort.rounds_per_client} of every "
            f"allocation_window={cohort.allocation_window} rounds, and none chose these"
        )
    else:
        why = f"client_sample_rate={cohort.client_sample_rate} samples nobody in them"
    raise ConfigError(
        "num_rounds",
        plan.num_rounds,
        f"would train nothing: no client is drawn in any of its rounds ({why}); "
        "raise num_rounds or the sampling rate",
    )


def strategy_class(plan: RunPlan) -> type[Strategy]:
    """The :class:`Strategy` class the ``strategy`` node names (ConfigError otherwise)."""
    return target_class(plan.strategy, "strategy", Strategy)


def run_layout(plan: RunPlan) -> Layout:
    """The run's :class:`Layout` from its aggregator's and strategy's classes.

    Raises
    ------
    ConfigError
        For a bad ``num_workers`` or client sampling (:func:`fedpriv.run.layout.plan_layout`).
    """
    agg_cls = aggregator_class(plan.aggregator)
    virtual = strategy_class(plan).virtual_clients
    return plan_layout(plan, secagg=agg_cls.uses_secagg_mods, virtual_clients=virtual)


def build_server(plan: RunPlan, algorithm: ClientAlgorithm) -> tuple[Strategy, Aggregator]:
    """The strategy and the aggregator of ``plan``; the strategy checks the algorithm.

    Raises
    ------
    ConfigError
        If either cannot be built, or the strategy refuses the algorithm.
    """
    strategy = instantiate_as(plan.strategy, "strategy", Strategy)
    strategy.check_algorithm(algorithm)
    aggregator = instantiate_as(plan.aggregator, "aggregator", Aggregator)
    if plan.round_failure is RoundFailure.DROP and isinstance(aggregator, IdealAggregator):
        if aggregator.min_replies is None:  # the survivors are summed; the job accounts them
            aggregator.min_replies = 1
    if aggregator.requires_integer_updates:
        check(
            aggregator.bits == algorithm.update_bits,
            "aggregator.bits",
            aggregator.bits,
            f"must equal client.bits={algorithm.update_bits}",
        )
    return strategy, aggregator


def instantiate_as(node: Any, group: str, cls: type[Any]) -> Any:
    """``instantiate(node)``, checked to be a ``cls``; one line naming ``group`` otherwise."""
    try:
        obj = instantiate(dict(node), _convert_="all")
    except Exception as exc:  # Hydra wraps import and constructor errors
        raise build_error(group, node, exc) from None
    check(
        isinstance(obj, cls),
        f"{group}._target_",
        node.get("_target_"),
        f"must be a {cls.__module__}.{cls.__name__}",
    )
    return obj
