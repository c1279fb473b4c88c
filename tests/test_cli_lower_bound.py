"""``fedpriv-account ... lower_bound=true``: every analysis answers ``epsilon_lower_bound``.

A number must never exceed the reported ε (that would be a wrong upper or lower bound); the
ratio lower/upper is printed (``pytest -s``) at a README-like setting and at a small-ε
setting of each analysis. Tolerance: a number is <= ε to 1e-9 relative (the G_mu answers are
the same root, equal to the last digit); the ratios asserted below are what the bound reaches
here, with a margin of about 10 % below the value measured.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedpriv.accounting.core.lower_report import NOT_AVAILABLE
from fedpriv.cli import account as cli

ROOT = Path(__file__).resolve().parents[1]


def answer(capsys: pytest.CaptureFixture[str], args: list[str]) -> dict:
    assert cli.main([*args, "lower_bound=true", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def ratio(out: dict) -> float:
    """lower / upper, checked <= 1 (to 1e-9), printed."""
    lower, eps = out["epsilon_lower_bound"], out["epsilon"]
    assert isinstance(lower, float) and 0.0 <= lower <= eps * (1 + 1e-9), out
    print(f"{out['analysis']}: epsilon={eps:.6g} lower={lower:.6g} ratio={lower / eps:.4f}")
    return lower / eps


@pytest.mark.parametrize(
    "args",
    [
        ["gaussian", "noise_multiplier=1", "target_delta=1e-5"],
        ["gaussian", "noise_multiplier=20", "steps=4", "target_delta=1e-5"],
        ["gdp", "mu=0.05", "target_delta=1e-5"],
        ["gdp", "target_epsilon=1", "target_delta=1e-5"],
    ],
)
def test_gaussian_and_gdp_are_exact(capsys, args):
    out = answer(capsys, args)
    assert out["epsilon_lower_bound"] == out["epsilon"] and ratio(out) == 1.0
    assert out["lower_bound_method"].startswith("exact")


@pytest.mark.parametrize(
    "args, least",
    [
        # the README's setting with 300 released steps (10,000: 5.1676 / 5.1927 = 0.995, ~50 s
        # here): one step per round, every step's sum released
        (["noise_multiplier=1.1", "sample_rate=0.01", "steps=1", "num_rounds=300"], 0.95),
        # small epsilon; 10 local steps released summed in one round (the run's pair: 0.935)
        (["noise_multiplier=3", "sample_rate=0.001", "steps=10"], 0.5),
    ],
)
def test_poisson_gaussian_lower_bound(capsys, args, least):
    out = answer(capsys, ["poisson-gaussian", *args, "target_delta=1e-5"])
    assert least <= ratio(out) <= 1.0


def test_poisson_gaussian_rdp_answer_is_above_the_same_lower_bound(capsys):
    """accountant=rdp answers a larger ε; the lower bound is the mechanism's, not the
    accountant's: the same number."""
    base = ["poisson-gaussian", "noise_multiplier=1.1", "sample_rate=0.01", "steps=100"]
    pld = answer(capsys, [*base, "target_delta=1e-5"])
    rdp = answer(capsys, [*base, "target_delta=1e-5", "accountant=rdp"])
    assert rdp["epsilon"] > pld["epsilon"]
    assert rdp["epsilon_lower_bound"] == pld["epsilon_lower_bound"]


@pytest.mark.parametrize(
    "args, least",
    [
        (["noise_multiplier=1", "num_slots=2"], 0.95),  # p0 = 1: allocation's lower PLD
        (["noise_multiplier=2", "num_slots=5", "checkin_probability=0.5"], 0.3),  # small eps
    ],
)
def test_checkin_central_gaussian_lower_bound(capsys, args, least):
    out = answer(capsys, ["checkin", "noise=central_gaussian", *args, "target_delta=1e-5"])
    assert least <= ratio(out) <= 1.0


SECAGG = ["secagg-dpsgd", "mechanism=gaussian", "num_clients=10", "target_delta=1e-5"]


@pytest.mark.parametrize(
    "args, least",
    [
        # the README's call: its RDP/Mironov epsilon 0.640 is loose, the PLD one 0.311
        (["client_noise_multiplier=0.69", "sample_rate=0.1", "steps=1", "accountant=rdp",
          "conversion=mironov"], 0.45),
        (["client_noise_multiplier=0.69", "sample_rate=0.1", "steps=1"], 0.99),
        # S = 10 local steps released summed: below the per-step accounting (0.7405 / 0.7985)
        (["noise_multiplier=2", "sample_rate=0.1", "steps=10"], 0.9),
        (["noise_multiplier=8", "sample_rate=0.01", "steps=5"], 0.3),  # small epsilon
    ],
)  # fmt: skip
def test_secagg_gaussian_lower_bound(capsys, args, least):
    out = answer(capsys, [*SECAGG, *args])
    assert least <= ratio(out) <= 1.0


def test_summed_local_steps_pair_is_the_sampled_gaussian_at_one_step():
    """S = 1: the pair is the Poisson-subsampled Gaussian; S = 2 binned: below its PLD."""
    from fedpriv.accounting.core.lower_bound import epsilon_lower_bound
    from fedpriv.accounting.dpsgd import poisson_gaussian_epsilon
    from fedpriv.accounting.secagg.lower import LocalStepsGaussianRound

    one = epsilon_lower_bound([(LocalStepsGaussianRound(2.0, 0.1, 1), 1)], 1e-5)
    two = epsilon_lower_bound([(LocalStepsGaussianRound(2.0, 0.1, 2), 1)], 1e-5)
    assert one == pytest.approx(poisson_gaussian_epsilon(2.0, 0.1, 1, 1e-5), rel=1e-3)
    assert one < two < poisson_gaussian_epsilon(2.0, 0.1, 2, 1e-5)  # 0.369 < 0.425 < 0.449


@pytest.mark.parametrize(
    "args",
    [
        ["skellam", "noise_multiplier=0.9", "bits=16", "num_params=10000", "num_clients=10",
         "sample_rate=0.1", "steps=10", "max_grad_norm=1", "target_delta=1e-5"],
        ["secagg-dpsgd", "mechanism=skellam", "noise_multiplier=1", "num_params=1000",
         "num_clients=10", "sample_rate=0.1", "steps=1", "target_delta=1e-5"],
    ],
)  # fmt: skip
def test_skellam_says_why_not(capsys, args):
    out = answer(capsys, args)
    assert out["epsilon_lower_bound"].startswith(NOT_AVAILABLE + "no realised pair")


@pytest.mark.parametrize(
    "args, least",
    [
        # FMT21 numerical 0.1824, the count pair 0.0945 (n = 10^4, docs: 0.0530, 0.0271, 20 s)
        (["variant=shuffle", "local_epsilon=1", "num_clients=1000"], 0.45),
        # docs/accounting.md's fixed call: Theorem 3.2 0.2365, the count pair 0.00377
        (["variant=fixed", "local_epsilon=1", "num_clients=10000", "num_slots=1000",
          "checkin_probability=0.5"], 0.01),
        # small epsilon, (eps0, delta0) Gaussian randomizer: 0.5 against 0.00146
        (["variant=shuffle", "local_epsilon=0.5", "local_delta=1e-8", "num_clients=10000"],
         0.002),
    ],
)  # fmt: skip
def test_checkin_local_lower_bound(capsys, args, least):
    out = answer(capsys, ["checkin", *args, "target_delta=1e-6"])
    assert least <= ratio(out) <= 1.0


def test_checkin_count_pair_is_the_randomizer_alone_for_one_client():
    """n = 1 shuffled report: the count pair is (Bern(1/2), Bern(e^-eps0 / 2)), whose ε at δ
    is eps0 + log(1 - 2δ) (closed form), here to the optimistic grid's 1e-4."""
    from fedpriv.accounting.checkin.lower import checkin_lower_bound
    from fedpriv.accounting.loss_models.local_randomizer import calibrated_randomizer
    from fedpriv.mechanisms.checkin_draw import CheckinVariant
    from fedpriv.mechanisms.randomizers import RandomizerKind

    r = calibrated_randomizer(RandomizerKind.LAPLACE, 1.0, 1.0, 0.0)
    got = checkin_lower_bound(CheckinVariant.SHUFFLE, r, 1, 1, 1.0, 1, 1e-6)
    exact = 1.0 + math.log1p(-2e-6)
    assert exact - 1e-4 <= got <= exact
    # fixed with one slot and p0 = 1: the slot picks the target with probability 1/n
    fixed = checkin_lower_bound(CheckinVariant.FIXED, r, 1, 1, 1.0, 1, 1e-6)
    half = 0.5 + math.log1p(-2e-6)  # dummies on 0: the shift is L, half the sensitivity
    assert half - 1e-4 <= fixed <= half


def test_checkin_other_variants_say_why_not(capsys):
    out = answer(
        capsys,
        ["checkin", "variant=averaged", "local_epsilon=1", "num_clients=1000", "num_slots=1000",
         "target_delta=1e-6"],
    )  # fmt: skip
    assert out["epsilon_lower_bound"].startswith(NOT_AVAILABLE)
    assert "local_epsilon" in out["epsilon_lower_bound"]


def test_bad_lower_bound_value_one_line_exit_2(capsys):
    assert cli.main(["gdp", "mu=1", "target_delta=1e-5", "lower_bound=maybe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fedpriv-account: error: lower_bound='maybe' must be true or false"]


@pytest.mark.parametrize("name", sorted(cli.ANALYSES))
def test_every_analysis_lists_lower_bound(name, capsys):
    assert cli.main([name, "--help"]) == 0
    rows = capsys.readouterr().out.split("\nkeys (key=type  default  meaning):\n", 1)[1]
    keys = [row.split()[0].split("=")[0] for row in rows.splitlines()]
    assert "lower_bound" in keys


def _cli(args: str) -> str:
    return f"{sys.executable} -m fedpriv.cli.account {args}"


@pytest.mark.parametrize("reader", ["head -1", "head -n 0"])
def test_closed_pipe_ends_quietly(reader):
    """``| head -1`` (and a reader that reads nothing): no traceback, empty stderr; the CLI
    exits 0 when its output fit in the pipe before the reader left, else 141."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f'{_cli("gdp mu=1 target_delta=1e-5")} | {reader}; echo "rc=${{PIPESTATUS[0]}}"'
    done = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    if reader == "head -1":
        assert lines[0].startswith("gdp: epsilon = 4.3771") and lines[1] in ("rc=0", "rc=141")
    else:
        assert lines == [f"rc={cli.EXIT_BROKEN_PIPE}"]


def test_lower_bound_at_tiny_delta_is_answered_at_the_smallest_resolved_delta() -> None:
    """Below ``LOWER_MIN_DELTA`` dp-accounting's FFT rounding noise is of the order of δ: at
    δ = 1e-14 (10 Poisson steps, q = 0.01, z = 1) the optimistic PLD answered 3.029, above the
    exact ε, which lies in [3.0126, 3.0151] (direct convolution of the loss values rounded up
    and down on a 2e-4 grid, computed outside fedpriv). The bound is now the one at 1e-8, valid
    since ε(δ) falls in δ."""
    from fedpriv.accounting.core.lower_bound import LOWER_MIN_DELTA

    common = {"sample_rate": "0.01", "steps": "10", "noise_multiplier": "1", "lower_bound": "1"}
    tiny = cli.run("poisson-gaussian", {**common, "target_delta": "1e-14"})
    floor = cli.run("poisson-gaussian", {**common, "target_delta": str(LOWER_MIN_DELTA)})
    assert tiny["epsilon_lower_bound"] == floor["epsilon_lower_bound"]
    assert tiny["epsilon_lower_bound"] <= 3.0126 <= tiny["epsilon"]
    assert floor["epsilon_lower_bound"] <= floor["epsilon"]
