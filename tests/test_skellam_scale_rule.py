"""The Skellam mechanism's scale rules: the probabilistic rule against an independent
implementation of the reference's (Kairouz, Liu, Steinke 2021; Agarwal, Kairouz, Liu 2021), the
wrap bound against measured wraps, and the deterministic ``no_wrap`` rule it replaces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special

from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.cli.account import run as account
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.modular_range import ScaleRule, coordinate_tail_bound, signed_reach
from fedpriv.mechanisms.skellam_noise import MAX_POISSON_MEAN, SkellamMechanism
from fedpriv.run.config import compose_config
from fedpriv.run.runner import run_experiment

BETA = math.exp(-0.5)
PADDED = 16384  # 10,250 parameters padded to a power of two by the rotation
REF_ORDERS = list(range(2, 129)) + [256]  # the reference implementation's orders


def reference_scale(
    bits: int, clients: int, dim: int, clip: float, sigma: float, reach: float | None = None
) -> float:
    """The reference's scale: 2 reach γ = 2k sqrt(ρC²n²/d + n(γ²/4 + σ_i²)), k = 3, ρ = 1,
    σ_i = σC/√n, solved for γ = 1/scale in closed form. The reference's reach is
    ``2**(bits-1)``; fedpriv's ``2**(bits-1) - 1``, the last value that decodes (pass it)."""
    k = 3.0
    reach = 2.0 ** (bits - 1) if reach is None else reach
    a = clip**2 * clients**2 / dim + (sigma * clip) ** 2
    return 1.0 / (2 * k * math.sqrt(a / (4.0 * reach**2 - k * k * clients)))


def reference_epsilon(scale: float, sigma: float, q: float, steps: int, delta: float) -> float:
    """AKL21 Cor. 4.1 in real units (noise variance σ², C = 1) on the KLS21 Thm 1 rounded norm,
    Poisson-subsampled by Steinke's integer-order bound, converted by dp-accounting."""
    c = scale  # C = 1 in integer units
    l2 = min(
        c + math.sqrt(PADDED),
        math.sqrt(
            c * c + PADDED / 4 + math.sqrt(-2 * math.log(BETA)) * (c + math.sqrt(PADDED) / 2)
        ),
    )
    l2 /= scale
    l1 = l2 * min(math.sqrt(PADDED), l2 * scale)
    var = sigma**2

    def rdp(a: int) -> float:
        extra = min(
            ((2 * a - 1) * scale * l2**2 + 6 * l1) / (4 * scale**3 * var**2),
            3 * l1 / (2 * scale * var),
        )
        return a / (2 * var) * l2**2 + extra

    def sampled(a: int) -> float:
        terms = [(a - 1) * math.log1p(-q) + math.log1p((a - 1) * q)]
        for j in range(2, a + 1):
            log_comb = special.gammaln(a + 1) - special.gammaln(j + 1) - special.gammaln(a - j + 1)
            terms.append(log_comb + (a - j) * math.log1p(-q) + j * math.log(q) + (j - 1) * rdp(j))
        return min(float(special.logsumexp(terms)) / (a - 1), rdp(a))

    curve = np.array([sampled(a) for a in REF_ORDERS]) * steps
    return float(rdp_privacy_accountant.compute_epsilon(REF_ORDERS, curve, delta)[0])


def spec(bits: int, sigma: float, steps: int = 1, **kw: object) -> SkellamSpec:
    fields: dict[str, object] = dict(
        noise_multiplier=sigma,
        sample_rate=0.1,
        steps=steps,
        num_clients=10,
        target_delta=1e-5,
        bits=bits,
        num_params=10250,
        max_grad_norm=1.0,
    )
    fields.update(kw)
    return SkellamSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bits", "sigma"), [(32, 0.69), (20, 0.69), (16, 0.69), (14, 1.2), (12, 2.18)]
)
def test_one_step_equals_the_reference(bits: int, sigma: float) -> None:
    # One clipped vector per client per message: the reference's setting. Its scale (closed
    # form here, numerical minimisation there) at fedpriv's reach 2**(bits-1) - 1 and its ε
    # must be fedpriv's, to 1e-9 and 1e-6; the reference's own reach 2**(bits-1) gives a
    # scale a little over 2**(1-bits) relative larger (the rounding term: 5e-4 at 12 bits,
    # 3.05e-5 at 16), asserted below 2 x 2**(1-bits).
    s = spec(bits, sigma)
    ref = reference_scale(bits, 10, PADDED, 1.0, sigma, reach=signed_reach(bits))
    cap = math.sqrt(2 * MAX_POISSON_MEAN * 10) / sigma  # numpy's exact Poisson range
    assert s.mechanism.scale == pytest.approx(min(ref, cap), rel=1e-9)
    own = reference_scale(bits, 10, PADDED, 1.0, sigma)
    assert min(own, cap) * (1 - 2.0 ** (2 - bits)) <= s.mechanism.scale <= min(own, cap)
    expected = reference_epsilon(ref, sigma, 0.1, 1, 1e-5)
    assert s.epsilon(1) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    ("bits", "steps", "sigma"), [(16, 50, 1.18), (12, 10, 2.85), (12, 50, 3.73)]
)
def test_multi_step_range_holds_every_step_and_beats_no_wrap(
    bits: int, steps: int, sigma: float
) -> None:
    # A message sums `steps` noise shares: the range holds k standard deviations of that sum.
    m = spec(bits, sigma, steps).mechanism
    assert m.wrap_stddevs * m.coordinate_std == pytest.approx(signed_reach(bits), rel=1e-9)
    assert m.coordinate_std**2 >= 2 * steps * m.mu  # at least the noise of `steps` releases
    # The reference's one-step scale would leave a multi-step message's noise alone at
    # 2**(bits-1) / (s σ sqrt(steps)) standard deviations: most coordinates would wrap.
    ref = reference_scale(bits, 10, PADDED, 1.0, sigma)
    assert 2.0 ** (bits - 1) / (ref * sigma * math.sqrt(steps)) < 1.0
    # no_wrap (deterministic, no rotation) pays with a far smaller scale and a larger ε
    nowrap = spec(bits, sigma, steps, scale_rule="no_wrap", rotation=False)
    assert nowrap.mechanism.scale < m.scale / 5  # 6x to 22x smaller in these rows
    assert nowrap.epsilon(1) > spec(bits, sigma, steps).epsilon(1)


def test_cli_states_what_no_wrap_costs() -> None:
    keys = {"noise_multiplier": "2.18", "bits": "12", "num_params": "10250", "num_clients": "10"}
    keys |= {"sample_rate": "0.1", "steps": "1", "target_delta": "1e-5"}
    out = account("skellam", {**keys, "scale_rule": "no_wrap", "rotation": "false"})
    assert out["epsilon"] == pytest.approx(0.656, abs=5e-4)
    assert out["probabilistic_epsilon"] == pytest.approx(
        account("skellam", keys)["epsilon"], rel=1e-12
    )
    assert out["probabilistic_scale"] > 4 * out["scale"]
    assert "probabilistic_epsilon" not in account("skellam", keys)


def test_no_wrap_keeps_its_bound_and_cost() -> None:
    nowrap = spec(12, 2.18, scale_rule="no_wrap", rotation=False)
    m = nowrap.mechanism
    assert m.signal_bound + m.noise_tail <= 2**11 - 1  # it cannot wrap
    assert m.wrap_bound == pytest.approx(1e-9 / m.padded_dim)
    assert nowrap.epsilon(1) == pytest.approx(0.656, abs=5e-4)  # vs 0.4621 probabilistic
    assert spec(12, 2.18).epsilon(1) == pytest.approx(0.4621, abs=5e-4)


def simulate_wraps(m: SkellamMechanism, rounds: int, aligned: bool, seed: int = 0) -> float:
    """Fraction of coordinates of the true sum that wrapped, over ``rounds`` sums of
    ``num_clients`` messages (one clipped vector each, norm C; aligned: all the same)."""
    rng = np.random.default_rng(seed)
    wrapped = 0
    for r in range(rounds):
        base = rng.normal(size=m.dim)
        total = np.zeros(m.padded_dim, dtype=np.int64)
        for _ in range(m.num_clients):
            x = base if aligned else rng.normal(size=m.dim)
            x = x / np.linalg.norm(x) * m.clipping_norm
            total += m.privatize(x, rng, seed=r)
        wrapped += m.wrapped_coordinates(total)
    return wrapped / (rounds * m.padded_dim)


@pytest.mark.parametrize("stddevs", [3.0, 2.0])
def test_measured_wrap_rate_is_below_the_stated_bound(stddevs: float) -> None:
    m = SkellamMechanism.from_noise_multiplier(
        1.0, bits=10, clipping_norm=1.0, num_clients=10, dim=3000, wrap_stddevs=stddevs
    )
    # k std reach R = 2**9 - 1 and the bound is the tail at R + 1: 2 exp(-(k(R+1)/R)²/2) for a
    # sub-Gaussian coordinate; Skellam's tail is a little heavier (rel 1e-3)
    subgaussian = 2 * math.exp(-((stddevs * 512 / 511) ** 2) / 2)
    assert m.wrap_bound == pytest.approx(subgaussian, rel=1e-3)
    assert m.wrap_bound >= subgaussian
    rate = simulate_wraps(m, rounds=40, aligned=True)  # signal all in one direction: worst
    # Gaussian-like coordinates: about P(|Z| > k), well below the Chernoff bound, never above
    assert 0 < rate <= m.wrap_bound
    assert rate == pytest.approx(math.erfc(stddevs / math.sqrt(2)), rel=0.25)  # 4,096 x 40 draws


def test_tail_bound_matches_closed_forms() -> None:
    # pure sub-Gaussian: exp(-t²/2v); pure Skellam: the closed Chernoff bound of skellam_noise
    assert coordinate_tail_bound(3.0, 1.0, 0.0) == pytest.approx(math.exp(-4.5), rel=1e-9)
    from fedpriv.mechanisms.skellam_noise import skellam_tail_bound

    assert coordinate_tail_bound(40.0, 0.0, 50.0) == pytest.approx(
        skellam_tail_bound(50.0, 40.0), rel=1e-9
    )
    assert coordinate_tail_bound(-1.0, 1.0, 1.0) == 1.0


def test_cli_equals_spec_and_states_the_rule() -> None:
    out = account(
        "skellam",
        {
            "noise_multiplier": "2.18",
            "bits": "12",
            "num_params": "10250",
            "num_clients": "10",
            "sample_rate": "0.1",
            "steps": "1",
            "target_delta": "1e-5",
        },
    )
    assert out["scale_rule"] == "probabilistic" and out["rotation"] is True
    assert out["epsilon"] == pytest.approx(spec(12, 2.18).epsilon(1), rel=1e-12)
    assert out["wrap_bound"] == pytest.approx(2 * math.exp(-4.5 * (2048 / 2047) ** 2), rel=1e-3)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"scale_rule": "sometimes"}, "client.scale_rule='sometimes' must be one of"),
        ({"signal_growth": "cubic"}, "client.signal_growth='cubic' must be one of"),
        ({"wrap_stddevs": 0.0}, "client.wrap_stddevs=0.0 must be"),
        ({"wrap_stddevs": float("nan")}, "client.wrap_stddevs=nan must be"),
        (
            {"rotation": False},
            "client.rotation=False must be true with client.scale_rule=probabilistic",
        ),
    ],
)
def test_bad_rule_input_gets_one_line(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}"):
        spec(16, 1.0, **kw)


def test_too_few_bits_names_the_bits_needed() -> None:
    with pytest.raises(ConfigError, match=r"need bits >= \d+"):
        spec(16, 1.0, scale=1e6)  # an explicit scale the rule does not allow
    with pytest.raises(ConfigError, match="no room for any scale"):
        spec(2, 1.0)


def test_run_counts_wrapped_coordinates(tmp_path: Path) -> None:
    # The ideal aggregator sums signed integers: the run knows the true sum and counts the
    # coordinates outside the 10-bit range, per round, in metrics.csv and results.json.
    cfg = compose_config(
        [
            "client=skellam_dpsgd",
            "num_clients=3",
            "num_rounds=3",
            "client.steps=1",
            "client.bits=10",
            "client.wrap_stddevs=2",
            "progress=false",
            "ray_init_args.num_cpus=2",
        ]
    )
    res = run_experiment(cfg, tmp_path)
    assert res["status"] == "complete"
    counts = [row["wrapped_coordinates"] for row in res["rounds"]]
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "wrapped_coordinates" in header
    saved = json.loads((tmp_path / "results.json").read_text())
    bound, coords = saved["privacy"]["wrap_bound"], saved["privacy"]["coordinates"]
    assert saved["privacy"]["scale_rule"] == "probabilistic"
    # The range is sized for every sampled gradient pointing the same way (signal_growth=
    # linear); real gradients do not, so even at k = 2 nothing wraps here.
    assert all(c == int(c) and c >= 0 for c in counts)
    assert sum(counts) / (len(counts) * coords) <= bound
    assert ScaleRule(saved["privacy"]["scale_rule"]) is ScaleRule.PROBABILISTIC


def test_sum_figures_count_what_the_decoding_gets_wrong() -> None:
    from clients.skellam_dpsgd import UPDATE_NAME, SkellamDPSGD

    algo = SkellamDPSGD(
        num_params=5,
        bits=8,
        signed_updates=True,
        privacy=spec(8, 1.0, num_params=5, num_clients=1),
    )
    half = 2**7
    total = np.array([half - 1, half, -half, -half - 1, 3, 0, 0, 0], dtype=np.int64)
    assert algo.sum_figures({UPDATE_NAME: total}, 1) == {"wrapped_coordinates": 2.0}
    modular = algo.mechanism.decode_sum(total % 256, seed=1)  # what SecAgg+ would decode
    assert np.array_equal(algo.mechanism.decode_sum(total, seed=1), modular)
    sent = algo.message(total).numpy()  # ideal aggregator: the signed total itself
    unsigned = SkellamDPSGD(num_params=5, bits=8, privacy=algo.privacy)
    assert np.array_equal(unsigned.message(total).numpy(), total % 256)
    assert np.array_equal(sent, total) and unsigned.sum_figures({UPDATE_NAME: total}, 1) == {}
