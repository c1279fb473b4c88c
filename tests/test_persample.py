"""Per-sample clipped gradient sums: fast (book-keeping) path == reference path == brute force.

Independent checks: a loop over examples with plain autograd (one backward per example) and
Opacus's hook-based per-sample gradients. Models run in float64 so the paths agree to
``RTOL = 1e-9`` relative (they differ only by summation order); float32 checks use 1e-4.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.ghost import batch_clipped_grad, fast_path_blocker, ghost_clipped_grad_sum
from fedpriv.mechanisms.persample import (
    clipped_grad_sum,
    clipped_group_grad_sum,
    reference_clipped_grad_sum,
)
from fedpriv.models.zoo import build_model

RTOL = 1e-9  # float64: paths differ only by summation order
ATOL = 1e-12


def masked_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy with a per-sample weight: ``y[:, 0]`` label, ``y[:, 1]`` weight.

    A weight of 0 gives that sample an exactly zero gradient.
    """
    out = out.reshape(out.shape[0], -1)
    ce = nn.functional.cross_entropy(out, y[:, 0].long(), reduction="none")
    return (ce * y[:, 1].to(ce.dtype)).sum()


def targets(batch: int, classes: int, seed: int, zero: tuple[int, ...] = ()) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    y = torch.stack(
        [torch.randint(0, classes, (batch,), generator=gen), torch.ones(batch, dtype=torch.long)], 1
    )
    for i in zero:
        y[i, 1] = 0
    return y


def brute_force(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, c: float):
    """Per-example autograd loop: (clipped sum, norms, per-example clipped grads)."""
    params = [p for p in model.parameters() if p.requires_grad]
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    norms, clipped = [], []
    for i in range(x.shape[0]):
        g = torch.autograd.grad(
            loss_fn(model(x[i : i + 1]), y[i : i + 1]), params, allow_unused=True
        )
        g = [torch.zeros_like(p) if gi is None else gi for gi, p in zip(g, params)]
        n = torch.sqrt(sum((gi.double() ** 2).sum() for gi in g))
        f = min(1.0, c / float(n)) if float(n) > 0 else 1.0
        norms.append(float(n))
        clipped.append([gi * f for gi in g])
        total = [t + gi * f for t, gi in zip(total, g)]
    return dict(zip(names, total)), torch.tensor(norms, dtype=torch.float64), clipped


def assert_close(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float = RTOL, atol: float = ATOL
) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=k)


def check_all_paths(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    expect_fast: bool = True,
    zero: tuple[int, ...] = (),
) -> None:
    """Fast == reference == brute force, with C at the median norm (some clipped, some not)."""
    model = model.double()
    x = x.double()
    _, norms_bf, _ = brute_force(model, masked_ce, x, y, 1e9)
    nonzero = norms_bf[norms_bf > 0]
    c = float(nonzero.median())
    assert (norms_bf > c).any() and ((norms_bf < c) & (norms_bf > 0)).any()
    for i in zero:
        assert norms_bf[i] == 0
    sums_bf, norms_bf, _ = brute_force(model, masked_ce, x, y, c)
    ref, ref_norms = reference_clipped_grad_sum(model, masked_ce, x, y, c)
    fast = ghost_clipped_grad_sum(model, masked_ce, x, y, c)
    assert (fast is not None) == expect_fast
    assert (fast_path_blocker(model) is None) == expect_fast or not expect_fast
    got, got_norms = clipped_grad_sum(model, masked_ce, x, y, c)
    assert_close(ref, sums_bf)
    assert_close(got, sums_bf)
    torch.testing.assert_close(got_norms.double(), norms_bf, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ref_norms.double(), norms_bf, rtol=RTOL, atol=ATOL)


def seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- every supported layer type -------------------------------------------------------------

LINEAR_CASES = [
    # (in_features, out_features, seq dims, bias): T(d+p) < dp selects the Gram trick
    (5, 4, (), True),
    (5, 4, (), False),
    (8, 8, (2,), True),  # Gram trick: 2*16 < 64
    (3, 2, (7,), True),  # direct per-sample gradient: 7*5 > 6
    (4, 3, (2, 3), False),  # two extra dims, no bias
]


@pytest.mark.parametrize("d,p,seq,bias", LINEAR_CASES)
def test_linear_matches_reference_and_brute_force(
    d: int, p: int, seq: tuple[int, ...], bias: bool
) -> None:
    torch.manual_seed(1)
    t = 1
    for s in seq:
        t *= s
    model = nn.Sequential(nn.Linear(d, p, bias=bias), nn.Tanh(), nn.Flatten(), nn.Linear(t * p, 3))
    x = seeded(6, *seq, d)
    check_all_paths(model, x, targets(6, 3, 2, zero=(1,)), zero=(1,))


CONV_CASES = [
    dict(in_channels=2, out_channels=4, kernel_size=3),
    dict(in_channels=2, out_channels=4, kernel_size=3, stride=2, padding=1),
    dict(in_channels=4, out_channels=6, kernel_size=(3, 2), groups=2, dilation=(2, 1), bias=False),
    dict(in_channels=3, out_channels=3, kernel_size=3, groups=3, padding="same"),
    dict(in_channels=2, out_channels=4, kernel_size=4, padding="same"),  # asymmetric same-padding
    dict(in_channels=2, out_channels=3, kernel_size=3, padding=2, padding_mode="reflect"),
    dict(
        in_channels=2,
        out_channels=3,
        kernel_size=3,
        padding=1,
        padding_mode="circular",
        stride=(1, 2),
    ),
    dict(in_channels=16, out_channels=32, kernel_size=2, stride=2),  # 4 positions: Gram trick
    dict(in_channels=4, out_channels=8, kernel_size=7),  # one position: Gram trick
]


@pytest.mark.parametrize(
    "kwargs", CONV_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items())
)
def test_conv2d_matches_reference_and_brute_force(kwargs: dict) -> None:
    torch.manual_seed(2)
    conv = nn.Conv2d(**kwargs)
    x = seeded(5, kwargs["in_channels"], 7, 7, seed=3)
    with torch.no_grad():
        n_out = conv.double()(x).numel() // 5
    model = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.Linear(n_out, 3))
    check_all_paths(model, x, targets(5, 3, 4, zero=(0, 3)), zero=(0, 3))


@pytest.mark.parametrize(
    "name,shape", [("tanh_cnn", (1, 28, 28)), ("logistic", (1024,)), ("mlp", (784,))]
)
def test_paper_models(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(3)
    model = build_model(name, shape, 10)
    check_all_paths(model, seeded(8, *shape, seed=5), targets(8, 10, 6, zero=(2, 5)), zero=(2, 5))


def test_mlp_hidden_widths_and_refusal() -> None:
    # hidden=[32, 16] on 784 inputs, 10 classes: Linear 784->32->16->10, exactly these shapes
    model = build_model("mlp", (784,), 10, hidden=[32, 16])
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(32, 784), (32,), (16, 32), (16,), (10, 16), (10,)]
    # a string is iterable but is not a list of widths ("256" must not become 2, 5, 6)
    for bad in ("256", 5):
        with pytest.raises(ConfigError, match=r"^model\.hidden=.* must be a list of layer widths"):
            build_model("mlp", (784,), 10, hidden=bad)


def test_frozen_parameters_and_eval_dropout() -> None:
    torch.manual_seed(4)
    model = nn.Sequential(
        nn.Linear(6, 5),
        nn.Dropout(0.5),
        nn.GELU(),
        nn.LayerNorm(5),
        nn.Linear(5, 4),
        nn.Tanh(),
        nn.Linear(4, 3),
    ).eval()
    model[0].bias.requires_grad_(False)
    model[3].requires_grad_(False)  # a fully frozen layer without a fast rule is fine
    model[4].requires_grad_(False)
    model[6].weight.requires_grad_(False)
    check_all_paths(model, seeded(7, 6, seed=7), targets(7, 3, 8))


def test_under_no_grad_and_train_mode_dropout() -> None:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    x, y = seeded(5, 6, seed=17), targets(5, 3, 18)
    ref, _ = reference_clipped_grad_sum(model, masked_ce, x, y, 0.3)
    with torch.no_grad():  # callers may hold no_grad; the fast path still differentiates
        got, _ = clipped_grad_sum(model, masked_ce, x, y, 0.3)
    assert_close(got, ref)
    # Dropout in train mode: the fast path uses one mask per forward; every per-sample gradient
    # is still clipped (checked one sample at a time, same mask seed each call).
    drop = nn.Sequential(nn.Linear(6, 5), nn.Dropout(0.5), nn.Linear(5, 3)).double().train()
    for i in range(5):
        torch.manual_seed(i)
        one, n = clipped_grad_sum(drop, masked_ce, x[i : i + 1], y[i : i + 1], 0.3)
        torch.manual_seed(i)
        g = torch.autograd.grad(
            masked_ce(drop(x[i : i + 1]), y[i : i + 1]), list(drop.parameters())
        )
        norm = torch.sqrt(sum((gi**2).sum() for gi in g))
        torch.testing.assert_close(n[0], norm, rtol=RTOL, atol=ATOL)
        assert float(torch.sqrt(sum((v**2).sum() for v in one.values()))) <= 0.3 * (1 + 1e-9)


def test_float32_paths_agree() -> None:
    torch.manual_seed(5)
    model = build_model("tanh_cnn", (1, 28, 28), 10)
    x, y = torch.randn(16, 1, 28, 28), targets(16, 10, 9)
    ref, ref_norms = reference_clipped_grad_sum(model, masked_ce, x, y, 0.5)
    got, norms = clipped_grad_sum(model, masked_ce, x, y, 0.5)
    assert_close(got, ref, rtol=1e-4, atol=1e-6)  # float32 rounding
    torch.testing.assert_close(norms, ref_norms, rtol=1e-4, atol=1e-6)


# --- per-sample norms against Opacus (independent library) ----------------------------------


def test_norms_match_opacus_grad_sample() -> None:
    from opacus import GradSampleModule

    torch.manual_seed(6)
    model = build_model("tanh_cnn", (1, 28, 28), 10).double()
    x, y = seeded(6, 1, 28, 28, seed=10), torch.randint(0, 10, (6,))
    ce = nn.CrossEntropyLoss(reduction="sum")
    _, norms = clipped_grad_sum(model, ce, x, y, 1.0)
    gsm = GradSampleModule(build_model("tanh_cnn", (1, 28, 28), 10).double(), loss_reduction="sum")
    gsm._module.load_state_dict(model.state_dict())
    ce(gsm(x), y).backward()
    sq = sum(p.grad_sample.reshape(6, -1).pow(2).sum(1) for p in gsm.parameters())
    torch.testing.assert_close(norms, sq.sqrt(), rtol=RTOL, atol=ATOL)


# --- clipping bound, property-based ----------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(
    d=st.integers(1, 6),
    p=st.integers(1, 6),
    t=st.integers(0, 4),
    batch=st.integers(1, 5),
    c=st.floats(1e-3, 10.0),
    seed=st.integers(0, 2**16),
)
def test_each_clipped_gradient_within_bound_linear(
    d: int, p: int, t: int, batch: int, c: float, seed: int
) -> None:
    torch.manual_seed(seed)
    seq = (t,) if t else ()
    model = nn.Sequential(nn.Linear(d, p), nn.Flatten(), nn.Linear(max(t, 1) * p, 2)).double()
    x = seeded(batch, *seq, d, seed=seed)
    y = targets(batch, 2, seed)
    sums, norms = clipped_grad_sum(model, masked_ce, x, y, c)
    _, bf_norms, bf_clipped = brute_force(model, masked_ce, x, y, c)
    torch.testing.assert_close(norms, bf_norms, rtol=RTOL, atol=ATOL)
    for i in range(batch):  # a batch of one returns that sample's clipped gradient
        one, _ = clipped_grad_sum(model, masked_ce, x[i : i + 1], y[i : i + 1], c)
        total = torch.sqrt(sum((v**2).sum() for v in one.values()))
        assert float(total) <= c * (1 + 1e-9)
        assert_close(one, dict(zip(one, bf_clipped[i])))


@settings(max_examples=10, deadline=None)
@given(
    cin=st.integers(1, 3),
    cout=st.integers(1, 3),
    k=st.integers(1, 3),
    stride=st.integers(1, 2),
    padding=st.integers(0, 1),
    dilation=st.integers(1, 2),
    size=st.integers(5, 7),
    seed=st.integers(0, 2**16),
)
def test_conv_shapes_property(
    cin: int, cout: int, k: int, stride: int, padding: int, dilation: int, size: int, seed: int
) -> None:
    torch.manual_seed(seed)
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=padding, dilation=dilation).double()
    x = seeded(3, cin, size, size, seed=seed)
    with torch.no_grad():
        n_out = conv(x).numel() // 3
    model = nn.Sequential(conv, nn.Flatten(), nn.Linear(n_out, 2)).double()
    y = targets(3, 2, seed)
    c = 0.3
    sums, norms = clipped_grad_sum(model, masked_ce, x, y, c)
    bf, bf_norms, _ = brute_force(model, masked_ce, x, y, c)
    assert ghost_clipped_grad_sum(model, masked_ce, x, y, c) is not None
    assert_close(sums, bf)
    torch.testing.assert_close(norms, bf_norms, rtol=RTOL, atol=ATOL)


# --- fallbacks: never a wrong fast path ------------------------------------------------------


class Scale(nn.Module):
    """A custom layer with a parameter and no fast rule."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


class Reused(nn.Module):
    """One Linear applied twice: per-sample norms are not separable per call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc(torch.tanh(self.fc(x)))))


class Tied(nn.Module):
    """A Linear whose weight is also used functionally outside the layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        return self.out(h @ self.fc.weight)


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5), nn.Linear(5, 3)),
        lambda: nn.Sequential(nn.Linear(4, 5), Scale(5), nn.Linear(5, 3)),
        lambda: nn.Sequential(nn.Linear(4, 5), nn.ReLU(inplace=True), nn.Linear(5, 3)),
        lambda: nn.Sequential(nn.Linear(4, 5), nn.Softmax(dim=0), nn.Linear(5, 3)),
    ],
    ids=["layernorm", "custom-param", "inplace-relu", "softmax-over-batch"],
)
def test_unsupported_layers_fall_back_and_match(make) -> None:
    torch.manual_seed(7)
    model = make()
    assert fast_path_blocker(model) is not None
    x = seeded(6, 4, seed=11)
    if isinstance(model[1], nn.Softmax):  # mixes samples: only the reference's per-sample view
        ref, _ = reference_clipped_grad_sum(model.double(), masked_ce, x, targets(6, 3, 1), 0.1)
        got, _ = clipped_grad_sum(model, masked_ce, x, targets(6, 3, 1), 0.1)
        assert_close(got, ref)
        return
    check_all_paths(model, x, targets(6, 3, 12), expect_fast=False)


@pytest.mark.parametrize("cls", [Reused, Tied])
def test_runtime_guards_fall_back_and_match(cls: type[nn.Module]) -> None:
    torch.manual_seed(8)
    model = cls()
    assert fast_path_blocker(model) is None  # static checks pass; runtime guards must catch it
    check_all_paths(model, seeded(6, 4, seed=13), targets(6, 3, 14), expect_fast=False)


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(5), nn.BatchNorm1d(5, affine=False)])
def test_batchnorm_refused(norm: nn.Module) -> None:
    model = nn.Sequential(nn.Linear(4, 5), norm, nn.Linear(5, 3))
    with pytest.raises(ConfigError, match="BatchNorm1d.*not DP"):
        clipped_grad_sum(model, masked_ce, torch.randn(4, 4), targets(4, 3, 0), 1.0)


def test_empty_batch_and_bad_norm() -> None:
    model = build_model("mlp", (784,), 10)
    sums, norms = clipped_grad_sum(model, masked_ce, torch.zeros(0, 784), targets(0, 10, 0), 1.0)
    assert norms.shape == (0,)
    assert all(
        float(v.abs().sum()) == 0 and v.shape == p.shape
        for v, p in zip(sums.values(), model.parameters())
    )
    with pytest.raises(ConfigError, match="max_grad_norm=0.0 must be > 0"):
        clipped_grad_sum(model, masked_ce, torch.zeros(2, 784), targets(2, 10, 0), 0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    torch.manual_seed(9)
    model = build_model("tanh_cnn", (1, 28, 28), 10)
    x, y = torch.randn(16, 1, 28, 28), targets(16, 10, 3)
    cpu, _ = clipped_grad_sum(model, masked_ce, x, y, 0.5)
    gpu, _ = clipped_grad_sum(model.cuda(), masked_ce, x.cuda(), y.cuda(), 0.5)
    assert_close({k: v.cpu() for k, v in gpu.items()}, cpu, rtol=1e-3, atol=1e-5)  # TF32/fp32


# --- batch clipping (first paper, Algorithm 1 with m = 1) -------------------------------------


def test_batch_clipped_grad_is_clipped_mean_gradient() -> None:
    torch.manual_seed(10)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3)).double()
    x, y = seeded(8, 6, seed=15), targets(8, 3, 16)
    model.zero_grad()
    (masked_ce(model(x), y) / 8).backward()  # plain autograd mean gradient
    mean = {k: p.grad.clone() for k, p in model.named_parameters()}
    norm = float(torch.sqrt(sum((g**2).sum() for g in mean.values())))
    for c in (norm / 3, norm * 2):
        got = batch_clipped_grad(model, masked_ce, x, y, c)
        factor = min(1.0, c / norm)
        assert_close(got, {k: g * factor for k, g in mean.items()})
        assert float(torch.sqrt(sum((g**2).sum() for g in got.values()))) <= c * (1 + 1e-12)


def test_batch_clipped_grad_edge_cases() -> None:
    model = build_model("logistic", (1024,), 10)
    got = batch_clipped_grad(model, masked_ce, torch.zeros(0, 1024), targets(0, 10, 0), 1.0)
    assert all(float(v.abs().sum()) == 0 for v in got.values())
    with pytest.raises(ConfigError, match="clipping_norm=-1.0 must be > 0"):
        batch_clipped_grad(model, masked_ce, torch.zeros(2, 1024), targets(2, 10, 0), -1.0)


@pytest.mark.parametrize("name, shape", [("logistic", (12,)), ("tanh_cnn", (1, 28, 28))])
@pytest.mark.parametrize("m, s", [(4, 3), (16, 1)])
def test_group_grad_sum_is_sum_of_batch_clipped_groups(
    name: str, shape: tuple[int, ...], m: int, s: int
) -> None:
    """One vmap over m groups == the loop of batch_clipped_grad over the groups (float64,
    tolerance RTOL/ATOL), for a clip norm that clips some groups and not others."""
    torch.manual_seed(3)
    model = build_model(name, shape, 5).double()
    x, y = seeded(m * s, *shape, seed=4), targets(m * s, 5, 5)
    xg, yg = x.reshape(m, s, *shape), y.reshape(m, s, 2)
    norms = []
    for h in range(m):
        g = batch_clipped_grad(model, masked_ce, xg[h], yg[h], 1e9)
        norms.append(float(torch.sqrt(sum((v**2).sum() for v in g.values()))))
    c = sorted(norms)[m // 2]  # about half of the groups are clipped
    loop: dict[str, torch.Tensor] = {}
    for h in range(m):
        a = batch_clipped_grad(model, masked_ce, xg[h], yg[h], c)
        loop = a if not loop else {k: loop[k] + a[k] for k in loop}
    got = clipped_group_grad_sum(model, masked_ce, xg, yg, c)
    assert got is not None
    assert_close(got, loop)


def test_group_grad_sum_leaves_batchnorm_to_the_loop_and_refuses_bad_norm() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    x, y = torch.zeros(2, 3, 4), targets(6, 2, 0).reshape(2, 3, 2)
    assert clipped_group_grad_sum(model, masked_ce, x, y, 1.0) is None
    with pytest.raises(ConfigError, match="clipping_norm=0.0 must be > 0"):
        clipped_group_grad_sum(build_model("logistic", (4,), 2), masked_ce, x, y, 0.0)
