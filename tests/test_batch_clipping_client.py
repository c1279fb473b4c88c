"""Generalized DP-SGD client (first paper, Algorithm 1): DP-SGD reproduction, the 2C
sensitivity of batch clipping, optimizers, bad input, and epsilon of short Flower runs."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from clients import generalized_dpsgd as batch_clipping
from clients.generalized_dpsgd import GeneralizedDPSGD, step_size
from clients.local_dpsgd import LocalDPSGD
from fedpriv.accounting.accountants import gdp
from fedpriv.accounting.batch_clipping import spec as bc
from fedpriv.accounting.batch_clipping.spec import BatchClippingSpec
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.samplers.fixed_size import WithoutReplacementGaussianEvent
from fedpriv.cli.account import run as account
from fedpriv.common.errors import ConfigError
from fedpriv.data.client_data import ClientData
from fedpriv.models.zoo import build_model
from fedpriv.run.algorithm import TrainContext
from fedpriv.run.config import compose_config
from fedpriv.run.prepare import prepare
from fedpriv.run.runner import run_experiment

REPO = Path(__file__).resolve().parents[1]
FAST = ["progress=false", "ray_init_args.num_cpus=2", "plot=false", "save_model=false"]
#: sigma = 1 (the tests of the clipped sum draw no noise).
SIGMA_1 = BatchClippingSpec(noise_multiplier=1.0)


def _cfg(overrides: list[str]):
    return compose_config(overrides)


def _ctx(seed: int, server_round: int = 1) -> TrainContext:
    return TrainContext(
        server_round,
        np.random.default_rng(seed),
        torch.Generator().manual_seed(seed),
        torch.device("cpu"),
    )


def _mlp(seed: int, features: int = 5, classes: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", (features,), classes, hidden=(4,))


def _flat(u: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in u.values()])


# ------------------------------------------------------------------ classic DP-SGD
def test_poisson_individual_clipping_reproduces_local_dpsgd_exactly() -> None:
    torch.manual_seed(0)
    data = ClientData(torch.randn(40, 1, 6, 6), torch.randint(0, 3, (40,)), 0)
    ref_model, model = (
        build_model("mlp", (1, 6, 6), 3, hidden=(8,)),
        build_model("mlp", (1, 6, 6), 3, hidden=(8,)),
    )
    model.load_state_dict(ref_model.state_dict())
    ref = LocalDPSGD(  # one client: its noise share is the whole sigma C
        steps=4,
        lr=0.3,
        normalizer=0.2 * 40,
        privacy=DPSGDSpec(noise_multiplier=1.3, max_grad_norm=0.7, sample_rate=0.2, num_clients=1),
    )
    ours = GeneralizedDPSGD(  # m = q N = 8: the same public divisor as the reference's
        sampler="poisson",
        num_groups=8,
        group_size=1,
        local_rounds=4,
        epochs=None,
        lr=0.3,
        privacy=BatchClippingSpec(noise_multiplier=1.3, clipping_norm=0.7, sample_rate=0.2),
        num_samples=40,
    )
    ref_update, _ = ref.train(ref_model, data, _ctx(5))
    update, _ = ours.train(model, data, _ctx(5))
    for k in ref_update:  # same sampler draws, clipped sums, noise draws and step: bit-identical
        assert torch.equal(update[k], ref_update[k]), k
    # N(0, (C sigma)^2) with Poisson
    assert ours.privacy.noise_stddev(0.7) == pytest.approx(1.3 * 0.7)
    # the same Poisson-Gaussian event, 4 per round
    assert ours.privacy.round_events() == ref.privacy.round_events()


def test_individual_clipping_sum_equals_per_sample_loop() -> None:
    # s = 1: U = sum_i [grad f(w; xi_i)]_C, each gradient at the same w (classic DP-SGD)
    model = _mlp(1)
    torch.manual_seed(2)
    x, y = torch.randn(6, 1, 5) * 3, torch.randint(0, 3, (6, 1))
    algo = GeneralizedDPSGD(sampler="subsample", num_groups=6, group_size=1, privacy=SIGMA_1)
    u = algo.clipped_sum(model, x, y, eta=0.1, clipping_norm=0.5)
    expected = None
    for i in range(6):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i]), y[i], reduction="sum").backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        g = g / max(1.0, float(g.norm()) / 0.5)
        expected = g if expected is None else expected + g
    # float32 autograd loop vs the ghost/per-sample path: rounding only
    torch.testing.assert_close(_flat(u).float(), expected, rtol=1e-5, atol=1e-6)


def test_sgd_settings_are_honoured_not_dropped_by_the_fast_path() -> None:
    # maximize=True runs the general path: w_end = w + eta g, so U = -(the plain fast path's U)
    model = _mlp(1)
    torch.manual_seed(3)
    x, y = torch.randn(2, 4, 5) * 3, torch.randint(0, 3, (2, 4))
    plain = GeneralizedDPSGD(num_groups=2, group_size=4, privacy=SIGMA_1)
    maxim = GeneralizedDPSGD(
        num_groups=2,
        group_size=4,
        privacy=SIGMA_1,
        optimizer={"_target_": "torch.optim.SGD", "maximize": True},
    )
    assert plain._plain_sgd and not maxim._plain_sgd
    u, v = (
        _flat(plain.clipped_sum(model, x, y, 0.1, 0.5)),
        _flat(maxim.clipped_sum(model, x, y, 0.1, 0.5)),
    )
    torch.testing.assert_close(v.float(), -u.float(), rtol=1e-5, atol=1e-6)
    for spec, plain_ in (
        ({"_target_": "torch.optim.sgd.SGD"}, True),
        ({"_target_": "torch.optim.SGD", "momentum": 0.0}, True),
        ({"_target_": "torch.optim.SGD", "momentum": 0.9}, False),
        ({"_target_": "torch.optim.Adam"}, False),
    ):
        assert GeneralizedDPSGD(optimizer=spec, privacy=SIGMA_1)._plain_sgd is plain_


@pytest.mark.parametrize("m, s", [(8, 4), (16, 2)])
def test_vmap_group_path_equals_the_optimizer_loop(m: int, s: int) -> None:
    # m >= VMAP_MIN_GROUPS takes one vmap over the groups; the general path (maximize=True:
    # one optimizer step per group from w) gives -U. float32: rtol 1e-5, atol 1e-6.
    assert m >= batch_clipping.VMAP_MIN_GROUPS
    model = _mlp(2)
    torch.manual_seed(4)
    x, y = torch.randn(m, s, 5) * 3, torch.randint(0, 3, (m, s))
    fast = GeneralizedDPSGD(num_groups=m, group_size=s, privacy=SIGMA_1)
    loop = GeneralizedDPSGD(
        num_groups=m,
        group_size=s,
        privacy=SIGMA_1,
        optimizer={"_target_": "torch.optim.SGD", "maximize": True},
    )
    u = _flat(fast.clipped_sum(model, x, y, 0.1, 0.5))
    v = _flat(loop.clipped_sum(model, x, y, 0.1, 0.5))
    torch.testing.assert_close(v.float(), -u.float(), rtol=1e-5, atol=1e-6)
    assert float(u.norm()) <= m * 0.5 * (1 + 1e-5)


def test_sequential_sgd_group_update_is_sum_of_trajectory_gradients() -> None:
    # A = classical SGD over the group's s records: a_h = (w - w_end)/eta = sum of the gradients
    # along the trajectory (the paper's recursion (2)); C large so nothing is clipped.
    model = _mlp(3)
    torch.manual_seed(4)
    x, y = torch.randn(1, 3, 5), torch.randint(0, 3, (1, 3))
    eta = 0.05
    algo = GeneralizedDPSGD(num_groups=1, group_size=3, group_update="sequential", privacy=SIGMA_1)
    w0 = [p.detach().clone() for p in model.parameters()]
    u = algo.clipped_sum(model, x, y, eta=eta, clipping_norm=1e6)
    for p, w in zip(model.parameters(), w0, strict=True):
        assert torch.equal(p.detach(), w)  # w is left unchanged
    twin = _mlp(3)
    total = torch.zeros_like(_flat(u)).float()
    for i in range(3):
        twin.zero_grad()
        nn.functional.cross_entropy(twin(x[0, i : i + 1]), y[0, i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in twin.parameters()])
        total += g
        with torch.no_grad():
            for p in twin.parameters():
                p -= eta * p.grad
    torch.testing.assert_close(_flat(u).float(), total, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ sensitivity (property)
OPTIMIZERS = [
    {"_target_": "torch.optim.SGD"},
    {"_target_": "torch.optim.SGD", "momentum": 0.9},
    {"_target_": "torch.optim.Adam"},
    {"_target_": "torch.optim.RMSprop"},
    {"_target_": "torch.optim.Adagrad"},
]


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**30),
    m=st.integers(1, 10),
    s=st.integers(1, 4),
    opt=st.sampled_from(OPTIMIZERS),
    mode=st.sampled_from(["minibatch", "sequential"]),
    clip=st.floats(0.05, 5.0),
    scale=st.floats(0.1, 30.0),
)
def test_replacing_one_record_moves_u_by_at_most_2c(
    seed: int, m: int, s: int, opt: dict, mode: str, clip: float, scale: float
) -> None:
    # Sec. 5: a round whose differing record sits in one group has sensitivity 2C (replace relation)
    gen = torch.Generator().manual_seed(seed)
    model = _mlp(seed % 1000)
    x = torch.randn(m, s, 5, generator=gen) * scale
    y = torch.randint(0, 3, (m, s), generator=gen)
    x2, y2 = x.clone(), y.clone()
    h, i = seed % m, (seed // 7) % s
    x2[h, i] = torch.randn(5, generator=gen) * scale
    y2[h, i] = (y[h, i] + 1) % 3
    algo = GeneralizedDPSGD(
        num_groups=m,
        group_size=s,
        group_update=mode,
        optimizer=opt,
        privacy=SIGMA_1,
    )
    u = _flat(algo.clipped_sum(model, x, y, eta=0.05, clipping_norm=clip))
    u2 = _flat(algo.clipped_sum(model, x2, y2, eta=0.05, clipping_norm=clip))
    assert float((u - u2).norm()) <= 2 * clip * (1 + 1e-5)  # float32 rounding margin
    assert float(u.norm()) <= m * clip * (1 + 1e-5)


def test_batchnorm_allowed_for_batch_clipping_refused_for_individual() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    x, y = torch.randn(2, 4, 5), torch.randint(0, 3, (2, 4))
    batch = GeneralizedDPSGD(num_groups=2, group_size=4, privacy=SIGMA_1)
    assert float(_flat(batch.clipped_sum(model, x, y, 0.1, 1.0)).norm()) <= 2.0 + 1e-6
    individual = GeneralizedDPSGD(sampler="subsample", num_groups=8, group_size=1, privacy=SIGMA_1)
    with pytest.raises(ConfigError, match="BatchNorm1d"):
        individual.clipped_sum(model, x.reshape(8, 1, 5), y.reshape(8, 1), 0.1, 1.0)


def test_step_size_schedules() -> None:
    assert step_size("constant", 0.5, 99, 10.0, None) == 0.5
    assert step_size("diminishing", 0.5, 30, 10.0, None) == pytest.approx(0.5 / 4)
    assert step_size("cosine", 0.5, 0, 1.0, 100) == pytest.approx(0.5)
    assert step_size("cosine", 0.5, 50, 1.0, 100) == pytest.approx(0.25)
    assert step_size("cosine", 0.5, 150, 1.0, 100) == pytest.approx(0.0)
    spec = BatchClippingSpec(clipping_norm=3.0, noise_multiplier=1.5)
    algo = GeneralizedDPSGD(clipping_norms=[2.0, 1.0, 0.5], privacy=spec)
    assert [algo.clipping_norm_at(r) for r in (1, 2, 3, 7)] == [2.0, 1.0, 0.5, 0.5]
    assert GeneralizedDPSGD(privacy=spec).clipping_norm_at(7) == 3.0  # privacy.clipping_norm
    assert algo.privacy.noise_stddev(0.5) == pytest.approx(2 * 0.5 * 1.5)  # N(0, (2 C sigma)^2)


# ------------------------------------------------------------------ bad input, refusals
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["client.group_size=601"],
            "client.num_groups=1 times client.group_size=601 must be <= the client's 600 samples",
        ),
        (["client.group_size=0"], "client.group_size=0 must be an integer >= 1"),
        (
            ["client.optimizer._target_=torch.optim.Nope"],
            "client.optimizer._target_='torch.optim.Nope' must name",
        ),
        (["client.epochs=0"], "client.epochs=0 must be an integer >= 1"),
        (["privacy.noise_multiplier=-1"], "privacy.noise_multiplier=-1.0 must be >= 0"),
        (["privacy.group_sizes=[1,0]"], "privacy.group_sizes=[1, 0] must all be integers >= 1"),
        (
            ["privacy.group_sizes=[1,601]"],
            "privacy.group_sizes=[1, 601] must all be <= 64 (exact q_E is computed up to",
        ),
        (["client.analysis=poisson-gaussian"], "does not cover sampler='shuffle'"),
        (["client.sampler=poisson"], "client.group_size=64 must be 1 with sampler=poisson"),
        (
            [
                "client=individual_clipping",
                "client.sampler=poisson",
                "client.analysis=paper",
            ],
            "client.analysis='paper' does not cover sampler='poisson'",
        ),
        (["client.sampler=nope"], "client.sampler='nope' must be one of"),
        (
            ["+client.optimizer.momentun=0.9"],
            "client.optimizer.momentun=0.9 is not a parameter of torch.optim.SGD",
        ),
        (
            ["+client.optimizer.momentum=-1"],
            "cannot run as the local optimizer A: Invalid momentum value: -1",
        ),
        (
            ["client.optimizer._target_=torch.optim.LBFGS"],
            "missing 1 required positional argument: 'closure'",
        ),
        (
            ["client.clipping_norms=[]"],
            "client.clipping_norms=[] must be null or a non-empty list of finite values > 0",
        ),
        (
            ["client.clipping_norms=[1,-1]"],
            "client.clipping_norms=[1, -1] must be null or a non-empty list",
        ),
    ],
)
def test_bad_input_refused_before_training(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        prepare(_cfg(["client=batch_clipping", *overrides]))  # 10 clients x 600 embedded images
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_null_optimizer_refused_when_composed_and_when_constructed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the schema types client.optimizer as a mapping: Hydra refuses null when composing (the
    # CLI's precheck prints one line); the constructor refuses it too, naming the field
    from fedpriv.cli.experiment import precheck

    with pytest.raises(SystemExit):
        precheck(["client=batch_clipping", "client.optimizer=null"])
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedpriv: error: client.optimizer: ") and "\n" not in err
    with pytest.raises(ConfigError) as info:
        GeneralizedDPSGD(optimizer=None)  # type: ignore[arg-type]
    assert str(info.value).startswith("client.optimizer=None must be a mapping with _target_")


def test_sampler_shorthand_sets_the_client_sampler(capsys: pytest.CaptureFixture[str]) -> None:
    # `fedpriv client=batch_clipping sampler=shuffle` (the spelling) == client.sampler=...
    for name in ("shuffle", "subsample"):
        _, algo = prepare(_cfg(["client=batch_clipping", f"sampler={name}"]))
        assert algo.sampler == name
    _, algo = prepare(
        _cfg(["client=individual_clipping", "sampler=poisson", "privacy.sample_rate=0.1"])
    )
    assert algo.sampler == "poisson"
    from fedpriv.cli.experiment import precheck

    with pytest.raises(SystemExit):  # the default client (LocalDPSGD) has no sampler
        precheck(["sampler=shuffle"])
    assert capsys.readouterr().err.strip() == (
        "fedpriv: error: client.sampler: Key 'sampler' not in 'LocalDPSGDConfig'"
    )


def test_calibration_meets_target() -> None:
    _, algo = prepare(
        _cfg(
            [
                "client=batch_clipping",
                "privacy.noise_multiplier=null",
                "privacy.target_epsilon=3",
                "num_rounds=4",
                "client.group_size=100",
            ]
        )
    )
    sigma = algo.privacy.sigma
    eps = bc.BatchClippingEvent("shuffle", 600, 1, 100, sigma).epsilon(1e-5, 4 * 6)
    assert eps <= 3.0 and eps == pytest.approx(3.0, rel=1e-3)


# ------------------------------------------------------------------ Flower runs
@pytest.mark.slow
def test_flower_run_epsilon_equals_engine_batch_clipping_analysis(tmp_path: Path) -> None:
    # 2 clients x 3000 embedded images; m = 1, s = 500: 6 local rounds = 1 epoch per server round
    summary = run_experiment(
        _cfg(
            [
                "client=batch_clipping",
                "num_clients=2",
                "num_rounds=2",
                "client.group_size=500",
                "client.lr=0.001",
                "privacy.noise_multiplier=1.5",
                *FAST,
            ]
        ),
        tmp_path,
    )
    assert summary["status"] == "complete"
    rounds = summary["rounds"]
    for r, row in enumerate(rounds, start=1):
        for g in (1, 2, 4, 8):
            cli = account(
                "batch-clipping",
                {
                    "sampling": "shuffle",
                    "num_samples": "3000",
                    "num_groups": "1",
                    "group_size": "500",
                    "epochs": str(r),
                    "noise_multiplier": "1.5",
                    "group_privacy": str(g),
                    "target_delta": "1e-5",
                },
            )
            assert row[f"epsilon_g{g}"] == pytest.approx(cli["epsilon"], rel=1e-9)
            assert row[f"epsilon_g{g}_closed"] == pytest.approx(
                cli["closed_form"]["epsilon"], rel=1e-9
            )
        # g = 1, batch clipping + shuffling: exactly G_{sqrt(E)/sigma} (paper, Table 1),
        # independently
        assert row["epsilon"] == pytest.approx(gdp.gdp_epsilon(1e-5, math.sqrt(r) / 1.5), rel=1e-6)
        assert row["epsilon"] == pytest.approx(row["epsilon_g1"], rel=1e-9)
    assert summary["privacy"]["epsilon"] == pytest.approx(rounds[-1]["epsilon"], rel=1e-12)
    # the paper's mixture answers for shuffling (the accountant does not apply)
    assert summary["privacy"]["accounting"] == bc.PAPER_ACCOUNTING + bc.GROUP_RULE
    assert summary["privacy"]["normalizer"] == 1.0  # m: the public divisor


def _table_script():
    spec = importlib.util.spec_from_file_location(
        "batch_clipping_table", REPO / "scripts" / "batch_clipping_table.py"
    )
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_experiment_config_runs_on_small_slice(tmp_path: Path, shared_data: Path) -> None:
    table = _table_script()
    overrides = [
        "num_clients=2",
        "num_rounds=1",
        f"dataset.data_dir={shared_data / 'mnist'}",
        "dataset.options.train_limit=400",
        *FAST,
        *table.variant_overrides("b", 20, 0.2),
    ]
    row = table.run_variant(overrides, tmp_path)
    assert row["status"] == "complete" and 0.0 <= row["accuracy"] <= 1.0
    # (b): 2 clients x 200 records, m = 20 groups of 1, subsampling, 10 local rounds (1 epoch):
    # the fixed-size sampled Gaussian (issue 40), z = 2 sigma, composed directly
    ledger = PrivacyLedger(neighboring_relation="replace_one")
    ledger.record(WithoutReplacementGaussianEvent(4.0, 20, 200), 10)
    assert row["epsilon"] == pytest.approx(ledger.get_epsilon(1e-5), rel=1e-9)
    assert row["epsilon_g8"] > row["epsilon_g4"] > row["epsilon_g2"] > row["epsilon_g1"]
    row.update(clients=2, variant="b")
    assert "| 2 | b |" in table.format_table([row])


def test_table_step_sizes_per_client_count_and_refusals() -> None:
    table = _table_script()
    assert table.per_clients(None, [10, 1], "a") == [0.005, 0.0003]  # tuned per count, in order
    assert table.per_clients(None, [1, 10], "b") == [0.03, 0.5]
    assert table.per_clients([0.1], [1, 10], "a") == [0.1, 0.1]
    with pytest.raises(ConfigError, match=r"--clients=\[5\] have no tuned step sizes"):
        table.per_clients(None, [1, 5], "a")
    with pytest.raises(ConfigError, match="one per --clients entry"):
        table.per_clients([0.1, 0.2, 0.3], [1, 10], "b")


def _diagnosis_script():
    path = REPO / "scripts" / "batch_clipping_noise_diagnosis.py"
    spec = importlib.util.spec_from_file_location("batch_clipping_noise_diagnosis", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_diagnosis_noises_have_the_stated_law() -> None:
    diag = _diagnosis_script()
    upd = [torch.zeros(400, 50), torch.zeros(10)]
    gen = torch.Generator().manual_seed(0)
    # accounted: i.i.d. N(0, (2 C sigma)^2) per coordinate for (a), divided by B for (b); 20,010
    # draws estimate the std to ~0.5% (1 sd), tolerance 3%
    for variant, std in (("a", 2 * 0.5 * 2.0), ("b", 2 * 0.5 * 2.0 / 64)):
        z = torch.cat(
            [t.reshape(-1) for t in diag.noise_like(upd, "accounted", variant, 2.0, 0.5, 64, gen)]
        )
        assert z.std().item() == pytest.approx(std, rel=0.03)
    # paper-code: one scalar per tensor (constant over its coordinates), std sigma C / B
    draws = [diag.noise_like(upd, "paper-code", "a", 2.0, 0.5, 64, gen) for _ in range(4000)]
    assert all(bool((t == t.reshape(-1)[0]).all()) for d in draws[:5] for t in d)
    first = torch.tensor([d[0].reshape(-1)[0].item() for d in draws])
    assert first.std().item() == pytest.approx(2.0 * 0.5 / 64, rel=0.05)  # 4000 draws: ~1.1% sd


def test_diagnosis_paper_code_noise_is_inert_for_logistic(shared_data: Path) -> None:
    """A per-tensor constant shifts every logit equally: same accuracy as no noise (to float
    rounding), while the accounted noise of batch clipping costs tens of points."""
    diag = _diagnosis_script()
    from fedpriv.data.images import load_mnist

    data = load_mnist(shared_data / "mnist", train_limit=2000)

    class Args:
        epochs, batch, sigma, clip = 2, 32, 2.0, 1.0

    acc = {n: diag.train(data, "a", n, 0.03, 0, Args) for n in diag.NOISES}
    assert acc["paper-code"] == pytest.approx(acc["none"], abs=0.002)
    assert acc["none"] > 0.8 and acc["accounted"] < acc["none"] - 0.3
