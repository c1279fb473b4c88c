"""Issue 26, item 5: ``privacy.secure_mode=true`` runs record-level local DP-SGD on integers.

``client=dpsgd`` draws float Gaussian noise, whose low-order bits separate neighbouring inputs
(Mironov 2012). In secure mode the run uses its lattice twin, ``SkellamDPSGD``: the same local
steps with Skellam noise on integers (Agarwal, Kairouz, Liu 2021, arXiv:2110.04995), whose
message is an integer vector with support all of Z^d for every input, accounted by the Skellam
RDP analysis.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.skellam_dpsgd import SkellamDPSGD
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.accounting.vocabulary import Accountant
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.modular_range import ScaleRule
from fedpriv.mechanisms.skellam_noise import SkellamMechanism
from fedpriv.run.config import compose_config
from fedpriv.run.header import noise_facts, secure_mode_warning
from fedpriv.run.prepare import prepare
from fedpriv.run.run_privacy import RunPrivacy

TINY = ["num_clients=2", "model=logistic", "client.steps=2", "progress=false", "plot=false"]
SECURE = [*TINY, "privacy.secure_mode=true"]


def epsilon_after(plan: object) -> float:
    privacy = RunPrivacy(plan.privacy, plan.cohort.nominal_size)  # type: ignore[attr-defined]
    for r in range(1, plan.num_rounds + 1):  # type: ignore[attr-defined]
        privacy.record_round(None, r)
    return float(privacy.epsilon())


def test_dpsgd_runs_as_its_skellam_twin(capsys: pytest.CaptureFixture[str]) -> None:
    float_plan, float_alg = prepare(compose_config(TINY))
    plan, alg = prepare(compose_config(SECURE))
    assert isinstance(alg, SkellamDPSGD) and isinstance(plan.privacy, SkellamSpec)
    assert plan.client["_target_"] == "clients.skellam_dpsgd.SkellamDPSGD"  # what workers build
    got, want = plan.privacy, float_plan.privacy
    assert isinstance(want, DPSGDSpec)
    for name in ("noise_multiplier", "sample_rate", "max_grad_norm", "steps", "target_delta"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.num_clients == want.num_clients and got.normalizer == want.normalizer
    assert got.accountant is Accountant.RDP and got.secure_mode
    assert noise_facts(alg)["float_noise_hardened"] is True
    assert noise_facts(alg)["noise_source"] == "secure"
    assert secure_mode_warning(alg) == ""
    assert (
        "fedpriv: privacy.secure_mode=true: LocalDPSGD draws float noise, so the run uses "
        "SkellamDPSGD: integer noise (privacy=skellam, accountant rdp)" in capsys.readouterr().err
    )
    assert type(float_alg).__name__ == "LocalDPSGD"


def test_epsilon_is_the_skellam_analysis_and_calibrates_to_the_float_runs() -> None:
    """At σ = 1.2 the Skellam RDP bound is above the float run's PLD ε (never below it: the
    integer release is accounted by its own analysis); calibrated to the float run's ε it
    needs a larger σ and stays within the target."""
    float_plan, _ = prepare(compose_config(TINY))
    plan, _ = prepare(compose_config(SECURE))
    float_eps, secure_eps = epsilon_after(float_plan), epsilon_after(plan)
    assert secure_eps > float_eps
    assert plan.privacy.epsilon(plan.num_rounds) == pytest.approx(secure_eps, rel=1e-9)
    target = [f"privacy.target_epsilon={float_eps!r}", "privacy.noise_multiplier=null"]
    calibrated, _ = prepare(compose_config([*SECURE, *target]))
    assert isinstance(calibrated.privacy, SkellamSpec)
    assert isinstance(float_plan.privacy, DPSGDSpec)
    assert float(calibrated.privacy.noise_multiplier or 0) > float(
        float_plan.privacy.noise_multiplier or 0
    )
    assert float_eps * 0.99 <= epsilon_after(calibrated) <= float_eps


def test_no_twin_without_noise_or_without_a_twin() -> None:
    _, alg = prepare(compose_config([*SECURE, "privacy.noise_multiplier=0"]))
    assert type(alg).__name__ == "LocalDPSGD"  # non-private: nothing to harden
    _, alg = prepare(compose_config([*TINY[:2], "client=checkin", "privacy.secure_mode=true"]))
    assert type(alg).__name__ == "CheckinClient"  # no lattice twin: it warns instead
    assert secure_mode_warning(alg).startswith("fedpriv: warning: privacy.secure_mode=true")


def test_twin_refuses_what_it_cannot_decode() -> None:
    with pytest.raises(ConfigError, match=r"client\.momentum=0\.9 must be 0 for skellam_dpsgd"):
        prepare(compose_config([*SECURE, "client.momentum=0.9"]))


def test_neighbouring_inputs_share_the_support() -> None:
    """One record x against none: the messages are int64 vectors; in each coordinate every
    integer within one standard deviation of either centre is drawn from both (Skellam's
    support is Z; a float Gaussian's is a set of floats that depends on the input)."""
    mech = SkellamMechanism(
        bits=20, scale=4.0, mu=8.0, clipping_norm=1.0, num_clients=1, dim=2,
        rotation=False, scale_rule=ScaleRule.NO_WRAP,
    )  # fmt: skip
    x = np.array([[0.3, -0.2]])
    rng = np.random.default_rng(11)
    draws = 20_000
    outs = [
        np.stack([mech.privatize(rows, rng, None) for _ in range(draws)])
        for rows in (x, np.zeros((0, 2)))
    ]
    sd = mech.coordinate_std
    for out in outs:
        assert out.dtype == np.int64
    for j in range(2):
        centres = [float(np.median(o[:, j])) for o in outs]
        window = np.arange(int(min(centres) - sd), int(max(centres) + sd) + 1)
        for out in outs:
            seen = set(out[:, j].tolist())
            assert all(int(v) in seen for v in window), (j, window, sorted(seen)[:5])


@pytest.mark.slow
def test_secure_mode_run_sends_integers_and_completes(tmp_path: Path) -> None:
    from fedpriv.run.runner import run_experiment

    summary = run_experiment(compose_config([*SECURE, "num_rounds=2"]), tmp_path)
    assert summary["status"] == "complete"
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["privacy"]["noise_source"] == "secure"
    assert res["privacy"]["float_noise_hardened"] is True
    assert res["rounds"][-1]["epsilon"] > 0


# ---- individual clipping with Poisson batches: a lattice discrete Gaussian per local round ----
POISSON = ["client=individual_clipping", "client.sampler=poisson", "model=logistic"]
POISSON_SECURE = [*POISSON, "num_clients=2", "privacy.secure_mode=true", "privacy.accountant=rdp"]


def test_poisson_individual_clipping_draws_lattice_noise() -> None:
    from fedpriv.accounting.discrete_gaussian import DiscreteGaussianEvent
    from fedpriv.mechanisms.lattice_gaussian import LATTICE_BITS, lattice_step
    from fedpriv.run.algorithm import TrainContext

    plan, alg = prepare(compose_config(POISSON_SECURE))
    assert alg.hardened_noise and secure_mode_warning(alg) == ""
    z = plan.privacy.noise_multiplier
    assert plan.privacy.event() == DiscreteGaussianEvent(z / (1 + 2.0**-LATTICE_BITS), 0.1)
    u = {"w": torch.tensor([[0.3, -0.2], [0.05, 0.0]]), "b": torch.tensor([1e-7])}
    ctx = TrainContext(1, np.random.default_rng(3), torch.Generator(), torch.device("cpu"))
    out = alg.noisy(u, 1.2, 1.0, ctx)  # type: ignore[attr-defined]
    step = lattice_step(1.0, 5)
    for k, v in out.items():
        assert v.dtype == u[k].dtype and v.shape == u[k].shape
        units = v.double().numpy() / step
        np.testing.assert_array_equal(units, np.rint(units))  # lattice points, exactly
    _, floats = prepare(compose_config([*POISSON, "num_clients=2"]))
    units = floats.noisy(u, 1.2, 1.0, ctx)["w"].double().numpy() / step  # type: ignore[attr-defined]
    assert not np.array_equal(units, np.rint(units))


def test_lattice_epsilon_is_never_below_the_gaussian_one() -> None:
    """The discrete Gaussian's RDP curve is the continuous one at z/(1+2^-20) (CKS20 Thm 15),
    Poisson-subsampled by Steinke's general bound: at or above dp-accounting's Gaussian ε."""
    import dp_accounting

    plan, _ = prepare(compose_config(POISSON_SECURE))
    spec = plan.privacy
    steps = plan.num_rounds * spec.rounds_per_server_round
    acc = dp_accounting.rdp.RdpAccountant()
    gauss = dp_accounting.GaussianDpEvent(spec.sigma / (1 + 2.0**-20))
    acc.compose(dp_accounting.PoissonSampledDpEvent(spec.sample_rate, gauss), steps)
    reference = acc.get_epsilon(spec.target_delta)
    eps = spec.epsilon(plan.num_rounds)
    assert reference <= eps <= reference * 1.15, (eps, reference)


def test_secure_mode_elsewhere_keeps_float_noise_and_warns() -> None:
    for extra in (["privacy.accountant=pld"], ["client.sampler=shuffle"]):
        cfg = [*POISSON, "num_clients=2", "privacy.secure_mode=true", *extra]
        _, alg = prepare(compose_config(cfg))
        assert not alg.hardened_noise
        assert "client.sampler=poisson and privacy.accountant=rdp" in secure_mode_warning(alg)
    from fedpriv.accounting.batch_clipping import BatchClippingSpec

    with pytest.raises(ConfigError, match="privacy.lattice_noise=True needs client.sampler"):
        BatchClippingSpec(lattice_noise=True, accountant=Accountant.RDP)
