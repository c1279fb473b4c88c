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
from fedpriv.accounting.core.vocabulary import Accountant
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.skellam import SkellamSpec
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


def test_make_run_twin_costs_the_accountant_not_the_noise() -> None:
    """``make run``'s setting (σ = 1.2, q = 0.1, 200 steps, 26,010 weights, 32 bits): the
    Skellam twin's ε equals the continuous Gaussian's RDP ε at the same integer orders
    (dp-accounting's exact subsampled-Gaussian formula: an independent lower reference, since
    the Skellam curve adds non-negative terms to the Gaussian one and Δ2 >= sC) within
    1e-6 relative; the float Gaussian's RDP ε at fractional orders lies between it and the
    PLD ε (the cost is RDP against PLD, then integer orders, not the integer noise)."""
    from fedpriv.accounting.secure_mode import float_counterpart, float_rdp_epsilon

    plan, _ = prepare(compose_config(["privacy.secure_mode=true"]))
    spec = plan.privacy
    assert isinstance(spec, SkellamSpec) and spec.noise_multiplier == 1.2
    steps = plan.num_rounds * spec.steps
    gauss = _dp_accounting_epsilon(1.2, spec.sample_rate, steps, spec.target_delta)
    secure = spec.epsilon(plan.num_rounds)
    assert gauss * (1 - 1e-12) <= secure <= gauss * (1 + 1e-6), (secure, gauss)
    float_spec = float_counterpart(spec)
    assert isinstance(float_spec, DPSGDSpec)
    float_rdp = float_rdp_epsilon(float_spec, plan.num_rounds)
    fine = _dp_accounting_epsilon(1.2, spec.sample_rate, steps, spec.target_delta, FINE)
    assert float_rdp == pytest.approx(fine, rel=1e-3)
    assert 7.2128 < float_rdp < secure  # 7.2128: the float run's PLD ε (README, make run)


def test_fractional_orders_by_log_convexity_gain_nothing_in_make_runs_setting() -> None:
    """``(α−1) D_α`` is convex in α (van Erven, Harremoës 2014, Cor. 2), so interpolating it
    linearly between integer orders bounds every fractional order; checked here against
    dp-accounting's exact fractional subsampled-Gaussian curve (the interpolation is never
    below it). At the secure run's calibrated σ the interpolated conversion is smallest at an
    integer order: fractional orders of this kind cannot lower the secure ε."""
    import dp_accounting
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    from fedpriv.accounting.samplers.poisson import poisson_subsampled_rdp

    sigma, q, steps, delta = 1.2785, 0.1, 200, 1e-5
    ints = np.arange(2.0, 41.0)
    curve = steps * poisson_subsampled_rdp(ints, q, lambda a: a / (2 * sigma**2))
    frac = np.linspace(2.0, 40.0, 38 * 40 + 1)
    interp = np.interp(frac, ints, (ints - 1) * curve) / (frac - 1)
    acc = dp_accounting.rdp.RdpAccountant(orders=frac.tolist())
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    exact = np.asarray(acc.rdp)  # the composed curve, one value per order
    assert np.all(interp >= exact * (1 - 1e-9))
    best_interp, order = compute_epsilon(frac.tolist(), interp.tolist(), delta)
    best_int, _ = compute_epsilon(ints.tolist(), curve.tolist(), delta)
    assert float(order) == round(float(order)) and best_interp == pytest.approx(best_int, 1e-12)
    assert compute_epsilon(frac.tolist(), exact.tolist(), delta)[0] < best_int  # only exact


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


@pytest.mark.slow  # per-sample rounding of 6000 x 7850 values, K noise seeds: 1-5 min
def test_secure_twin_noise_from_released_integers_is_at_least_the_accounted_sigma() -> None:
    """``client=dpsgd privacy.secure_mode=true`` (the twin as the run builds it): the noise of
    the decoded sum of the clients' integer messages, measured over K noise seeds, per unit of
    a removed record's measured influence, is >= the accounted σ (√(2μ)/Δ2) within the
    contract's 5 % (2.5 standard errors), for the smallest and largest clients."""
    from tests.contracts import PARTITIONS, ClientAlgorithmContract

    class SecureTwin(ClientAlgorithmContract):
        overrides = ["client=dpsgd", "privacy.secure_mode=true"]

    contract = SecureTwin()
    cfg = contract.config([*PARTITIONS["iid"], *contract.measure_overrides])
    assert cfg.client["_target_"] == "clients.skellam_dpsgd.SkellamDPSGD"
    sigma, measured = contract.effective_sigmas(cfg)
    assert sigma == pytest.approx(cfg.privacy.noise_multiplier, rel=1e-6)
    assert min(measured.values()) >= sigma * (1 - contract.sigma_rtol), (sigma, measured)


# ---- individual clipping with Poisson batches: a lattice discrete Gaussian per local round ----
POISSON = ["client=individual_clipping", "client.sampler=poisson", "model=logistic"]
POISSON_SECURE = [*POISSON, "num_clients=2", "privacy.secure_mode=true", "privacy.accountant=rdp"]


def test_poisson_individual_clipping_draws_lattice_noise() -> None:
    from fedpriv.accounting.loss_models.discrete_gaussian import DiscreteGaussianEvent
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


def test_fixed_size_groups_are_refused_in_one_line() -> None:
    """Shuffled or fixed-size groups have no lattice-noise analysis: refused, naming the
    sampler and what to use instead (the CLI exits with 2 on a ConfigError:
    :func:`test_cli_exits_2_for_shuffled_groups`)."""
    for sampler in ("shuffle", "subsample"):
        cfg = ["client=batch_clipping", "model=logistic", "num_clients=2", f"sampler={sampler}"]
        with pytest.raises(ConfigError) as info:
            prepare(compose_config([*cfg, "privacy.secure_mode=true"]))
        text = str(info.value)
        assert text.startswith(f"client.sampler='{sampler}' has no lattice-noise analysis"), text
        assert "use client.sampler=poisson" in text and "\n" not in text
        _, alg = prepare(
            compose_config([*cfg, "privacy.secure_mode=true", "privacy.noise_multiplier=0"])
        )
        assert not alg.hardened_noise  # non-private: no noise, nothing to harden
    from fedpriv.accounting.batch_clipping.spec import BatchClippingSpec

    with pytest.raises(ConfigError, match="privacy.lattice_noise=True needs client.sampler"):
        BatchClippingSpec(lattice_noise=True, accountant=Accountant.RDP)


@pytest.mark.slow
def test_cli_exits_2_for_shuffled_groups(tmp_path: Path) -> None:
    import subprocess
    import sys

    argv = ["client=batch_clipping", "privacy.secure_mode=true", f"hydra.run.dir={tmp_path}"]
    code = "from fedpriv.cli.experiment import console_main; console_main()"
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("fedpriv: error:")]
    assert len(lines) == 1 and "client.sampler='shuffle'" in lines[0], out.stderr


# ---- Poisson runs that would use PLD: lattice noise, accounted by RDP, the cost stated ------
POISSON_PLD_SECURE = [*POISSON, "num_clients=2", "privacy.secure_mode=true"]


def test_poisson_pld_run_is_lattice_and_rdp_with_its_cost_stated() -> None:
    """privacy.accountant=pld (the default) in secure mode: lattice noise, RDP; results.json's
    facts give the RDP ε and the float run's PLD ε at the same σ (the float run prepared
    independently), in one line."""
    from fedpriv.accounting.secure_mode import secure_accounting, secure_accounting_line

    plan, alg = prepare(compose_config(POISSON_PLD_SECURE))
    spec = plan.privacy
    assert alg.hardened_noise and spec.lattice_noise and spec.accountant is Accountant.RDP
    float_plan, float_alg = prepare(compose_config([*POISSON, "num_clients=2"]))
    assert float_plan.privacy.accountant is Accountant.PLD and not float_alg.hardened_noise
    facts = secure_accounting(spec, plan.num_rounds)
    assert facts["secure_mode_accountant"] == "rdp"
    assert facts["epsilon_secure_planned"] == pytest.approx(spec.epsilon(plan.num_rounds), 1e-12)
    float_eps = float_plan.privacy.epsilon(plan.num_rounds)
    assert facts["epsilon_float_pld"] == pytest.approx(float_eps, rel=1e-9)
    assert 1.0 < facts["epsilon_ratio"] < 1.5  # RDP's conversion costs 10-20 % here
    # the split of the cost: the float Gaussian by RDP (dp-accounting's exact fractional-order
    # curve, fine grid: an independent value, rel 1e-3) is most of it; never above the
    # secure ε nor below the PLD ε
    steps = plan.num_rounds * spec.rounds_per_server_round
    want = _dp_accounting_epsilon(spec.sigma, spec.sample_rate, steps, spec.target_delta, FINE)
    assert facts["epsilon_float_rdp"] == pytest.approx(want, rel=1e-3)
    assert float_eps < facts["epsilon_float_rdp"] <= facts["epsilon_secure_planned"]
    line = secure_accounting_line(facts, plan.num_rounds)
    assert (
        line.startswith("fedpriv: privacy.secure_mode=true: accounted by RDP (")
        and "\n" not in line
    )
    assert f"after {plan.num_rounds} rounds" in line and "x the float Gaussian's PLD" in line
    assert "x is RDP against PLD)" in line
    assert secure_accounting(float_plan.privacy, plan.num_rounds) == {}


#: Fractional orders for dp-accounting's exact subsampled-Gaussian curve (step 0.02; the
#: best order of these tests' settings lies near 3.4).
FINE = tuple(np.linspace(1.5, 12.0, 526).tolist())


def _dp_accounting_epsilon(
    z: float, rate: float, count: int, delta: float, orders: tuple[float, ...] | None = None
) -> float:
    """dp-accounting's RDP accountant at fedpriv's integer orders (or ``orders``) on the zCDP
    curve α/(2z²): unsampled as a ZCDpEvent, Poisson-subsampled as the Gaussian of the same
    RDP curve (its exact subsampled-Gaussian formula; dp-accounting does not subsample a
    ZCDpEvent)."""
    import dp_accounting

    from fedpriv.accounting.accountants.rdp import INTEGER_ORDERS

    grid = INTEGER_ORDERS if orders is None else orders
    acc = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in grid])
    if rate == 1.0:
        event: object = dp_accounting.ZCDpEvent(rho=1.0 / (2 * z * z))
    else:
        event = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(z))
    acc.compose(event, count)
    return float(acc.get_epsilon(delta))


def test_poisson_lattice_epsilon_equals_dp_accounting() -> None:
    """Tolerance 1e-6 relative: the same curve, two implementations of the subsampled RDP
    (Steinke's general bound here, Mironov-Talwar-Zhang's Gaussian formula there)."""
    from fedpriv.mechanisms.lattice_gaussian import lattice_noise_multiplier

    plan, _ = prepare(compose_config(POISSON_PLD_SECURE))
    spec = plan.privacy
    steps = plan.num_rounds * spec.rounds_per_server_round
    z = lattice_noise_multiplier(spec.sigma)
    want = _dp_accounting_epsilon(z, spec.sample_rate, steps, spec.target_delta)
    assert spec.epsilon(plan.num_rounds) == pytest.approx(want, rel=1e-6)


def test_poisson_lattice_release_is_on_one_lattice_with_the_accounted_std() -> None:
    """Neighbouring sums (a record's clipped gradient, norm C, present or absent) are released
    on the same lattice γZ^d; the noise measured from 20,000 released coordinates has std
    >= the accounted σC (z = σ/(1+2^-20)) within 3 % (the sample std's relative standard
    error is 0.5 %: 6 of them), and not above σC by more than 3 %."""
    from fedpriv.mechanisms.lattice_gaussian import lattice_noise_multiplier, lattice_step
    from fedpriv.run.algorithm import TrainContext

    plan, alg = prepare(compose_config(POISSON_PLD_SECURE))
    spec, clip, dim = plan.privacy, 1.0, 20_000
    std = spec.noise_stddev(clip)
    base = torch.linspace(-0.5, 0.5, dim, dtype=torch.float64)
    record = torch.zeros(dim, dtype=torch.float64)
    record[:2] = torch.tensor([0.6, -0.8])  # ||record|| = C
    step = lattice_step(spec.sensitivity(clip), dim)
    ctx = TrainContext(1, np.random.default_rng(5), torch.Generator(), torch.device("cpu"))
    for u in (base, base + record):
        out = alg.noisy({"w": u}, std, clip, ctx)["w"].numpy()  # type: ignore[attr-defined]
        units = out / step
        np.testing.assert_array_equal(units, np.rint(units))
        measured = float(np.std(out - u.numpy()))
        accounted = lattice_noise_multiplier(spec.sigma) * spec.sensitivity(clip)
        assert accounted * 0.97 <= measured <= std * 1.03, (measured, accounted)


# ---- check-ins with central noise: lattice slot sums, one subsampled release per pass ------
CHECKIN_SECURE = [
    "client=checkin_gaussian",
    "model=logistic",
    "num_clients=20",
    "client.num_slots=4",
    "num_rounds=3",
    "privacy.secure_mode=true",
]


@pytest.mark.parametrize("p0", [1.0, 0.5])
def test_checkin_lattice_epsilon_equals_dp_accounting(p0: float) -> None:
    """One Poisson(p0)-subsampled discrete Gaussian per pass (CheckinGaussianSpec.pass_event
    says why it bounds the check-in sampler), by RDP; p0 = 1 is dp-accounting's ZCDpEvent
    itself. Tolerance 1e-6 relative."""
    from fedpriv.accounting.loss_models.discrete_gaussian import DiscreteGaussianEvent
    from fedpriv.mechanisms.lattice_gaussian import lattice_noise_multiplier

    plan, alg = prepare(compose_config([*CHECKIN_SECURE, f"privacy.checkin_probability={p0}"]))
    spec = plan.privacy
    assert alg.hardened_noise and secure_mode_warning(alg) == ""
    assert spec.accountant is Accountant.RDP
    z = lattice_noise_multiplier(spec.sigma)
    assert spec.pass_event() == DiscreteGaussianEvent(z, p0)
    want = _dp_accounting_epsilon(z, p0, plan.num_rounds, spec.target_delta)
    assert spec.epsilon(plan.num_rounds) == pytest.approx(want, rel=1e-6)
    assert spec.summary()["epsilon_by_bound"][spec.summary()["bound"]] == pytest.approx(want, 1e-6)


def test_checkin_lattice_slot_sums_share_the_lattice_and_carry_the_accounted_std() -> None:
    """The server's released slot (times its public divisor), with and without one client's
    clipped update: both on γZ^d; the noise measured over 20,000 coordinates has std >= the
    accounted σC/(1+2^-20) within 3 % (6 standard errors) and <= σC + 3 %."""
    from fedpriv.mechanisms.lattice_gaussian import lattice_noise_multiplier, lattice_step
    from strategies.checkin_server import CheckinStrategy, SlotTask

    plan, _ = prepare(compose_config(CHECKIN_SECURE))
    spec = plan.privacy
    dim = 20_000
    shapes = {"w": (dim - 10,), "b": (10,)}
    rng = np.random.default_rng(2)
    rows = {(c, 0): {k: rng.normal(0, 0.005, s) for k, s in shapes.items()} for c in range(3)}
    step = lattice_step(spec.clipping_norm, dim)
    for clients in ((0, 1, 2), (0, 1)):  # client 2 present or absent
        stats = {"updates": 0, "dummies": 0}
        out = CheckinStrategy.central_slot(
            spec, SlotTask(0, clients), rows, shapes, torch.Generator(), stats
        )
        exact = {k: sum(rows[(c, 0)][k] for c in clients) for k in shapes}
        released = np.concatenate([out[k] * spec.slot_divisor for k in sorted(shapes)])
        units = released / step
        np.testing.assert_array_equal(units, np.rint(units))
        noise = released - np.concatenate([exact[k] for k in sorted(shapes)])
        measured = float(np.std(noise))
        accounted = lattice_noise_multiplier(spec.sigma) * spec.clipping_norm
        assert accounted * 0.97 <= measured <= spec.noise_stddev * 1.03, measured


@pytest.mark.slow  # the random-allocation PLD of the float route
def test_checkin_float_run_unchanged_and_secure_cost_stated() -> None:
    """Without secure mode: float noise and the random-allocation PLD; in secure mode the
    facts compare the RDP ε with that PLD ε (the lattice route forgoes the amplification by
    the allocation, so it costs more)."""
    from fedpriv.accounting.checkin.gaussian import ALLOCATION_BOUND, CheckinGaussianEvent
    from fedpriv.accounting.secure_mode import secure_accounting

    float_plan, float_alg = prepare(compose_config(CHECKIN_SECURE[:-1]))
    assert not float_alg.hardened_noise and float_plan.privacy.accountant is Accountant.PLD
    assert isinstance(float_plan.privacy.pass_event(), CheckinGaussianEvent)
    assert float_plan.privacy.summary()["bound"] == ALLOCATION_BOUND
    plan, _ = prepare(compose_config(CHECKIN_SECURE))
    facts = secure_accounting(plan.privacy, plan.num_rounds)
    want = float_plan.privacy.epsilon(plan.num_rounds)
    assert facts["epsilon_float_pld"] == pytest.approx(want, rel=1e-9)
    assert facts["epsilon_secure_planned"] > want


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [
        [*POISSON_PLD_SECURE, "num_rounds=1", "progress=false", "plot=false"],
        [*CHECKIN_SECURE, "strategy=checkin", "num_rounds=1", "progress=false", "plot=false"],
    ],
    ids=["batch_clipping_poisson_pld", "checkin_gaussian"],
)
def test_secure_run_states_its_rdp_accounting(
    config: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A one-round secure run completes with hardened noise; results.json's privacy block
    says RDP, the planned RDP ε equals the spec's, the ledger's ε after the round is the
    spec's (rel. 1e-9), and the one line is printed once."""
    from fedpriv.run.runner import run_experiment

    plan, _ = prepare(compose_config(config))
    summary = run_experiment(compose_config(config), tmp_path)
    assert summary["status"] == "complete"
    p = json.loads((tmp_path / "results.json").read_text())["privacy"]
    assert p["float_noise_hardened"] is True and p["secure_mode_accountant"] == "rdp"
    assert p["epsilon_secure_planned"] == pytest.approx(plan.privacy.epsilon(1), rel=1e-9)
    assert p["epsilon"] == pytest.approx(plan.privacy.epsilon(1), rel=1e-9)
    assert p["epsilon_ratio"] > 1
    err = capsys.readouterr().err
    assert err.count("fedpriv: privacy.secure_mode=true: accounted by RDP") == 1, err
