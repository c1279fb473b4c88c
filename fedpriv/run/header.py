"""What a run states about itself before its first round: the header line, the noise facts of
``results.json`` and the warnings a user must see (non-private, float noise in secure mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedpriv.mechanisms.client_sampling import ClientSampling
from fedpriv.run.algorithm import ClientAlgorithm
from fedpriv.run.layout import Layout
from fedpriv.run.plan import RunPlan

NON_PRIVATE_WARNING = (
    "fedpriv: warning: privacy.noise_multiplier=0 adds no noise: this run is NON-PRIVATE"
)


def noise_facts(algorithm: ClientAlgorithm) -> dict[str, Any]:
    """What protects the noise and what divides the release, for results.json and the header.

    ``noise_source``: ``seeded`` (reproducible from ``seed``: anyone holding the config can
    regenerate the noise and subtract it; right for a simulation, not for a deployment) or
    ``secure`` (OS entropy, ``privacy.secure_mode=true``). ``float_noise_hardened``: whether
    the noise resists floating-point attacks (the algorithm's ``hardened_noise``: integer
    Skellam noise does, float Gaussian noise does not). ``non_private``: no noise at all.
    ``normalizer``: the public constant dividing every released quantity (``None`` if the
    algorithm states none).
    """
    return {
        "noise_source": algorithm.privacy.noise_source.value,
        "float_noise_hardened": algorithm.hardened_noise,
        "non_private": algorithm.privacy.non_private,
        "normalizer": algorithm.privacy_summary()["normalizer"],
    }


def secure_mode_warning(algorithm: ClientAlgorithm) -> str:
    """The warning for ``privacy.secure_mode=true`` with noise not hardened against
    floating-point attacks (``""`` when hardened, not in secure mode, or non-private).
    secure_mode still draws all randomness (check-ins, sampling, noise) from OS entropy."""
    spec = algorithm.privacy
    if not spec.secure_mode or spec.non_private or algorithm.hardened_noise:
        return ""
    return (
        f"fedpriv: warning: privacy.secure_mode=true: {type(algorithm).__name__} draws float "
        "noise, not hardened against floating-point attacks (float_noise_hardened=false); "
        "hardened: client=client_level (the trusted aggregator's lattice discrete Gaussian), "
        "client=individual_clipping with client.sampler=poisson, client=checkin_gaussian "
        "(lattice discrete Gaussian, RDP), client=dpsgd (runs as skellam_dpsgd), "
        "client=skellam_dpsgd, client=client_level_skellam (integer Skellam noise)"
    )


def clients_phrase(plan: RunPlan, layout: Layout | None = None) -> str:
    """``"1000 clients (fixed_size cohort of 100) on 2 workers"`` for the header line."""
    cohort = plan.cohort
    text = f"{plan.num_clients} clients"
    if cohort.client_sampling is ClientSampling.POISSON:
        text += f" (poisson cohort, rate {cohort.client_sample_rate:g})"
    elif cohort.client_sampling is ClientSampling.FIXED_SIZE:
        text += f" (fixed_size cohort of {cohort.num_sampled_clients})"
    elif cohort.client_sampling is ClientSampling.RANDOM_ALLOCATION:
        text += (
            f" (random allocation, {cohort.rounds_per_client} of every "
            f"{cohort.allocation_window} rounds)"
        )
    if layout is not None and not layout.one_node_per_client:
        text += f" on {layout.num_workers} worker{'s' if layout.num_workers > 1 else ''}"
    return text


def header_line(
    plan: RunPlan, facts: dict[str, Any], analysis: str, out: Path, layout: Layout | None = None
) -> str:
    """The run's first line: size, σ, δ, accounting, noise source, normalizer, outputs."""
    summary = plan.privacy.summary()
    noise = summary.get(plan.privacy.calibrates)
    noise_s = "None" if noise is None else format(noise, ".4g")
    name = "σ" if plan.privacy.calibrates == "noise_multiplier" else plan.privacy.calibrates
    norm = facts["normalizer"]
    norm_s = "unstated" if norm is None else format(norm, ".6g")
    hardened = "hardened" if facts["float_noise_hardened"] else "not hardened"
    return (
        ("NON-PRIVATE run (privacy.noise_multiplier=0): " if facts["non_private"] else "")
        + f"fedpriv: {clients_phrase(plan, layout)}, {plan.num_rounds} rounds, "
        f"{name}={noise_s}{_correlated(summary)}, δ={plan.privacy.target_delta:g} "
        f"({plan.privacy.neighboring_relation.value}), "
        f"accounting={analysis}, "
        f"noise_source={facts['noise_source']} ({hardened} against floating-point attacks), "
        f"normalizer={norm_s}; outputs in {out}"
    )


def _correlated(summary: dict[str, Any]) -> str:
    """``" (banded noise, participation min_separation)"`` for correlated noise; else ''."""
    kind = summary.get("factorization")
    return "" if kind is None else f" ({kind} noise, participation {summary['participation']})"
