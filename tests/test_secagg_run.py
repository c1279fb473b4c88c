"""Skellam DP-SGD end to end: the real SecAgg+ protocol gives exactly the ideal aggregator's run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.skellam_dpsgd import SkellamDPSGD
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.core.privacy_spec import UnaccountableRound
from fedpriv.accounting.loss_models.skellam import SkellamEvent
from fedpriv.accounting.secagg.spec import secagg_dpsgd
from fedpriv.common.errors import ConfigError
from fedpriv.run.config import compose_config as _cfg
from fedpriv.run.prepare import build_server, prepare
from fedpriv.run.runner import run_experiment
from strategies.secaggplus import SecAggPlusAggregator

SKELLAM = [
    "client=skellam_dpsgd",  # privacy=skellam: accounted by RDP, its default
    "num_clients=3",
    "num_rounds=2",
    "client.steps=2",
    "progress=false",
    "ray_init_args.num_cpus=2",
]


@pytest.mark.slow
def test_secaggplus_run_equals_ideal_run_and_accountant(tmp_path: Path) -> None:
    ideal = run_experiment(_cfg(SKELLAM), tmp_path / "ideal")
    secagg = run_experiment(_cfg([*SKELLAM, "aggregator=secaggplus"]), tmp_path / "secagg")
    assert ideal["status"] == secagg["status"] == "complete"
    # same seeds, exact integer sums: identical models, hence identical accuracy and loss
    for a, b in zip(ideal["rounds"], secagg["rounds"], strict=True):
        assert a["accuracy"] == b["accuracy"] and a["loss"] == b["loss"]
    # ε: 4 Poisson-subsampled Skellam steps with the mechanism's own mu, Δ1, Δ2 (RDP)
    _, algo = prepare(_cfg(SKELLAM))
    mech = algo.mechanism
    assert mech.mu == pytest.approx(
        (mech.scale * 1.2 * 1.0) ** 2 / 2, rel=1e-12
    )  # mu = (s σ C)² / 2
    ledger = PrivacyLedger(accountant="rdp")
    ledger.record(
        SkellamEvent(
            mu=mech.mu,
            l1_sensitivity=mech.l1_sensitivity,
            l2_sensitivity=mech.l2_sensitivity,
            sample_rate=0.1,
        ),
        4,
    )
    res = json.loads((tmp_path / "secagg" / "results.json").read_text())
    assert res["privacy"]["epsilon"] == pytest.approx(ledger.get_epsilon(1e-5), rel=1e-12)
    # the engine's secagg-dpsgd analysis with the run's scale and rounding gives the same ε
    engine = secagg_dpsgd(
        "skellam",
        1.2,  # σ of the sum, the run's privacy.noise_multiplier
        3,
        0.1,
        2,
        2,
        1e-5,
        accountant="rdp",
        num_params=mech.dim,
        scale=res["privacy"]["scale"],
        beta=res["privacy"]["beta"],
    )
    assert res["privacy"]["epsilon"] == pytest.approx(engine["epsilon"], rel=1e-9)


def test_skellam_refuses_pld_and_secaggplus_refuses_floats() -> None:
    with pytest.raises(ConfigError, match="^privacy.accountant='pld' must be rdp"):
        prepare(_cfg(["client=skellam_dpsgd", "privacy.accountant=pld"]))
    with pytest.raises(ConfigError, match="needs a client algorithm that sends integers"):
        prepare(_cfg(["aggregator=secaggplus"]))
    # the run builds its server (strategy, aggregator) before it writes anything
    plan, algo = prepare(_cfg(["client=skellam_dpsgd", "aggregator=secaggplus", "client.bits=40"]))
    assert algo.update_bits == 40
    with pytest.raises(ConfigError, match="aggregator.bits=32 must equal client.bits=40"):
        build_server(plan, algo)
    plan, algo = prepare(_cfg(["client=skellam_dpsgd", "aggregator=secaggplus"]))
    _, aggregator = build_server(plan, algo)
    assert isinstance(aggregator, SecAggPlusAggregator) and aggregator.bits == algo.update_bits


def test_skellam_bits_too_small_is_refused_naming_needed_bits() -> None:
    with pytest.raises(ConfigError, match=r"bits=8 is too small.*need bits >= \d+"):
        prepare(_cfg(["client=skellam_dpsgd", "client.bits=8"]))


def test_degraded_round_accounts_fewer_noise_shares() -> None:
    plan, algo = prepare(_cfg(["client=skellam_dpsgd"]))
    assert isinstance(algo, SkellamDPSGD)
    n = plan.privacy.num_clients
    ((full, _),) = plan.privacy.round_events()
    ((fewer, _),) = plan.privacy.degraded_round_events(n - 2)
    assert fewer.mu == pytest.approx(full.mu * (n - 2) / n)
    with pytest.raises(UnaccountableRound):
        plan.privacy.degraded_round_events(0)
    gauss = prepare(_cfg([]))[0].privacy
    ((gauss_full, _),) = gauss.round_events()
    ((gauss_fewer, _),) = gauss.degraded_round_events(5)
    assert gauss_fewer.event.noise_multiplier == pytest.approx(
        gauss_full.event.noise_multiplier * (5 / 10) ** 0.5
    )
