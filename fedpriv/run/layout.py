"""How a run's virtual clients map onto Flower nodes, and which clients train each round.

Resolved once from the run config (:func:`plan_layout`) and validated before anything trains:
``num_workers`` Flower nodes each train many virtual clients (:mod:`fedpriv.run.engine`), except
where the aggregator needs one node per client (Flower's SecAgg+) or the strategy does not
declare ``virtual_clients``; the cohort of each round comes from :class:`CohortSampler`.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from dataclasses import dataclass

from fedpriv.common.errors import ConfigError, check
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.run.plan import Device, Engine, RunPlan
from fedpriv.run.ray_session import running_ray


@dataclass(frozen=True)
class Layout:
    """Nodes and cohorts of a run.

    Attributes
    ----------
    num_workers : int
        Flower nodes of the simulation.
    engine : Engine
        What runs them: ``RAY`` or ``PROCESSES`` (``auto`` resolved, :func:`run_engine`).
    one_node_per_client : bool
        Node ``i`` is client ``i`` and messages name no clients (SecAgg+, or a strategy
        without ``virtual_clients``); then ``num_workers == num_clients``.
    cohort : CohortSampler
        Draws each round's clients.
    """

    num_workers: int
    one_node_per_client: bool
    cohort: CohortSampler
    engine: Engine = Engine.RAY


def needs_ray(plan: RunPlan, *, secagg: bool) -> str:
    """Why ``plan`` must run on Ray (``""``: worker processes can run it): a cluster to join
    (``ray_init_args.address`` or ``RAY_ADDRESS``), a run inside a Ray job, Flower's SecAgg+
    (its mods speak Flower's full message protocol), CUDA (a forked process cannot use it),
    clients of 2 or more CPUs (their torch threads: GNU OpenMP is not fork-safe once the run's
    process has used it, so a forked worker trains on one thread), or a platform without
    ``fork`` (Windows)."""
    address = plan.ray_init_args.get("address") or os.environ.get("RAY_ADDRESS") or "local"
    if address != "local":
        return f"a Ray cluster (ray_init_args.address={address})"
    if running_ray() is not None:
        return "a run inside a Ray job"
    if secagg:
        return "Flower's SecAgg+ (aggregator=secaggplus)"
    if plan.num_gpus > 0 or plan.device is Device.CUDA:
        return "CUDA (client_resources.num_gpus > 0 or device=cuda)"
    if plan.num_cpus >= 2:
        return f"client_resources.num_cpus={plan.num_cpus:g} (a forked worker trains on 1 thread)"
    if "fork" not in multiprocessing.get_all_start_methods():
        return "this platform (it cannot fork a process)"
    return ""


def run_engine(plan: RunPlan, *, secagg: bool) -> Engine:
    """The engine that runs ``plan``: ``engine=auto`` is PROCESSES unless :func:`needs_ray`.

    Raises
    ------
    ConfigError
        ``engine=processes`` for a run that needs Ray.
    """
    why = needs_ray(plan, secagg=secagg)
    if plan.engine is Engine.AUTO:
        return Engine.RAY if why else Engine.PROCESSES
    if plan.engine is Engine.PROCESSES and why:
        raise ConfigError(
            "engine", "processes", f"is not possible with {why}: use engine=ray or auto"
        )
    return plan.engine


def local_actors(plan: RunPlan) -> int | None:
    """Client actors a LOCAL Ray instance of this config can run at once (``None``: a cluster;
    a sweep's warm head stands in for the local instance, :mod:`fedpriv.run.warm_engine`).

    ``floor(CPUs / client_resources.num_cpus)`` (CPUs: ``ray_init_args.num_cpus``, else the
    machine's), also bounded by ``floor(GPUs / client_resources.num_gpus)`` when GPUs are asked.
    """
    ray_args = plan.ray_init_args
    if (ray_args.get("address") or os.environ.get("RAY_ADDRESS") or "local") != "local":
        return None
    cpus = ray_args.get("num_cpus")
    cpus = (os.cpu_count() or 1) if cpus is None else cpus  # 0 is a value, not "unset"
    actors = math.floor(float(cpus) / plan.num_cpus + 1e-9)
    if plan.num_gpus > 0:
        import torch

        gpus = ray_args.get("num_gpus") or torch.cuda.device_count()
        if gpus:
            actors = min(actors, math.floor(float(gpus) / plan.num_gpus + 1e-9))
    return actors


def cluster_actors(plan: RunPlan) -> int | None:
    """Client actors the JOINED Ray cluster can run at once (``None``: not joined yet, or a
    local instance): ``floor(cluster CPUs / client_resources.num_cpus)``, also bounded by the
    GPUs when asked (Flower sizes its actor pool the same way)."""
    ray = running_ray()
    if local_actors(plan) is not None or ray is None:
        return None
    resources = ray.cluster_resources()
    actors = math.floor(float(resources.get("CPU", 0)) / plan.num_cpus + 1e-9)
    if plan.num_gpus > 0:
        actors = min(actors, math.floor(float(resources.get("GPU", 0)) / plan.num_gpus + 1e-9))
    return max(1, actors)


def no_actor_error(plan: RunPlan) -> ConfigError:
    """Why a local Ray instance of ``plan`` has room for no client actor (one line)."""
    given = plan.ray_init_args.get("num_cpus")
    cpus = (os.cpu_count() or 1) if given is None else given
    if plan.num_cpus > float(cpus) + 1e-9:
        where = (
            f"ray_init_args.num_cpus={given} (the local Ray instance's CPUs)"
            if given is not None
            else f"this machine's {cpus} CPUs (ray_init_args.num_cpus unset)"
        )
        return ConfigError(
            "client_resources.num_cpus",
            plan.num_cpus,
            f"must be <= {where}: no client actor could start",
        )
    return ConfigError(
        "client_resources.num_gpus",
        plan.num_gpus,
        "must be <= the GPUs of the local Ray instance: no client actor could start",
    )


def plan_layout(plan: RunPlan, *, secagg: bool, virtual_clients: bool) -> Layout:
    """Resolve and check ``num_workers`` and the client sampling of ``plan``.

    ``secagg``: the aggregator registers SecAgg+ mods; ``virtual_clients``: the strategy sends
    worker messages. Default ``num_workers``: one per client actor of the local Ray instance,
    or of the cluster once joined (:func:`cluster_actors`), at most ``num_clients``; on a
    cluster not yet joined (validation before start-up), ``num_clients``.

    Raises
    ------
    ConfigError
        ``num_workers`` above ``num_clients`` or above the actors the CPUs allow, client
        resources that leave no actor on a local instance, a worker count with
        one-node-per-client, client sampling the strategy or aggregator cannot run, or a bad
        sampling parameter (:class:`CohortSampler`).
    """
    cohort = plan.cohort
    n, given = plan.num_clients, plan.num_workers
    engine = run_engine(plan, secagg=secagg)
    one_per_client = secagg or not virtual_clients
    why = "aggregator=secaggplus" if secagg else "this strategy"
    if cohort.client_sampling is not ClientSampling.ALL and one_per_client:
        raise ConfigError(
            "client_sampling",
            cohort.client_sampling.value,
            f"is not supported with {why} (every client trains every round): use "
            "client_sampling=all",
        )
    actors = local_actors(plan)
    if actors is not None and actors < 1:
        raise no_actor_error(plan)
    if one_per_client:
        check(
            given is None or int(given) == n,
            "num_workers",
            given,
            f"must be null or num_clients={n}: {why} needs one Flower node per client",
        )
        return Layout(n, True, cohort, engine)
    if given is None:
        actors = actors or cluster_actors(plan)
        return Layout(min(n, actors) if actors else n, False, cohort, engine)
    check(isinstance(given, int) and given >= 1, "num_workers", given, "must be an integer >= 1")
    check(given <= n, "num_workers", given, f"must be <= num_clients={n}")
    if actors is not None:
        check(
            given <= actors,
            "num_workers",
            given,
            f"has no CPUs: this machine runs {actors} worker(s) at once "
            "(ray_init_args.num_cpus / client_resources.num_cpus); lower num_workers",
        )
    return Layout(int(given), False, cohort, engine)
