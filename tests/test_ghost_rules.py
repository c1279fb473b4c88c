"""Fast rules for GroupNorm, weight-standardized convolutions (WRN-16-4's layers) and records of
several views (augmentation multiplicity, batch clipping's groups).

Every case is checked against a per-record autograd loop (float64; a record's gradient is the
mean of its views' gradients, clipped after averaging), to ``RTOL = 1e-9`` relative: the paths
differ only by summation order. Both ways of computing per-record conv gradients (copied patches,
one grouped convolution backward) are forced in turn.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms import ghost_rules
from fedpriv.mechanisms.ghost import fast_path_blocker, ghost_clipped_grad_sum
from fedpriv.mechanisms.persample import clipped_grad_sum, clipped_group_grad_sum
from fedpriv.models.cifar import WideResNet, WSConv2d
from tests.test_persample import ATOL, CONV_CASES, RTOL, assert_close, masked_ce, seeded, targets


@pytest.fixture(params=["patches", "grouped"])
def conv_variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Force one way of computing per-record conv gradients."""
    threshold = 10**9 if request.param == "patches" else 1
    monkeypatch.setattr(ghost_rules, "GROUPED_MIN_POSITIONS", threshold)
    return str(request.param)


def record_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor, c: float):
    """``x`` ``(B, k, ...)``: per record, autograd of its rows' mean loss; (clipped sum, norms)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    norms = []
    for i in range(x.shape[0]):
        loss = masked_ce(model(x[i]), y[i]) / x.shape[1]
        g = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        g = [torch.zeros_like(p) if gi is None else gi for gi, p in zip(g, params.values())]
        n = float(torch.sqrt(sum((gi**2).sum() for gi in g)))
        norms.append(n)
        for k, gi in zip(params, g):
            total[k] += gi * min(1.0, c / n) if n > 0 else gi
    return total, torch.tensor(norms, dtype=torch.float64)


def check_fast(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Fast path taken and equal to the loop, C at the median norm (some records clipped)."""
    model = model.double()
    bsz, k = x.shape[:2]
    _, norms = record_loop(model, x, y, 1e9)
    c = float(norms.median())
    want, want_norms = record_loop(model, x, y, c)
    rows = (x.reshape(bsz * k, *x.shape[2:]), y.reshape(bsz * k, *y.shape[2:]))
    fast = ghost_clipped_grad_sum(model, masked_ce, *rows, c, views=k)
    assert fast is not None
    assert_close(fast[0], want)
    torch.testing.assert_close(fast[1], want_norms, rtol=RTOL, atol=ATOL)
    grouped = clipped_group_grad_sum(model, masked_ce, x, y, c)
    assert grouped is not None
    assert_close(grouped, want)


def records(bsz: int, views: int, *shape: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = seeded(bsz * views, *shape, seed=seed).reshape(bsz, views, *shape)
    return x, targets(bsz * views, 3, seed).reshape(bsz, views, 2)


def perturb_affine(model: nn.Module, seed: int) -> nn.Module:
    """Move GroupNorm's affine parameters off their initial 1 and 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.GroupNorm):
                m.weight.add_(0.3 * torch.randn(m.weight.shape, generator=gen))
                m.bias.add_(0.2 * torch.randn(m.bias.shape, generator=gen))
    return model


@pytest.mark.parametrize("views", [1, 2])
@pytest.mark.parametrize("conv", [nn.Conv2d, WSConv2d])
@pytest.mark.parametrize(
    "kwargs", CONV_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items())
)
def test_conv_layers_and_views(kwargs: dict, conv: type[nn.Conv2d], views: int, conv_variant: str):
    torch.manual_seed(2)
    layer = conv(**kwargs)
    x, y = records(4, views, kwargs["in_channels"], 7, 7, seed=3)
    with torch.no_grad():
        n_out = layer.double()(x[0]).numel() // views
    check_fast(nn.Sequential(layer, nn.Tanh(), nn.Flatten(), nn.Linear(n_out, 3)), x, y)


@pytest.mark.parametrize("views", [1, 3])
@pytest.mark.parametrize(
    "frozen, shape, groups",
    [((), (4, 6, 6), 2), ((), (4, 5), 4), (("weight",), (6, 5), 3), (("bias",), (4, 6, 6), 1)],
)
def test_group_norm(frozen: tuple[str, ...], shape: tuple[int, ...], groups: int, views: int):
    torch.manual_seed(4)
    norm = perturb_affine(nn.GroupNorm(groups, shape[0]), 5)
    for name in frozen:
        getattr(norm, name).requires_grad_(False)
    width = 1
    for s in shape:
        width *= s
    model = nn.Sequential(nn.Identity(), norm, nn.Tanh(), nn.Flatten(), nn.Linear(width, 3))
    x, y = records(5, views, *shape, seed=6)
    check_fast(model, x, y)


@pytest.mark.parametrize("views", [1, 2])
def test_wide_resnet(views: int, conv_variant: str) -> None:
    """A WRN-10-1 with 4 GroupNorm groups on 16 x 16 inputs: every WRN layer type, residual
    sums and a strided 1x1 shortcut."""
    torch.manual_seed(7)
    model = perturb_affine(WideResNet(depth=10, width=1, num_classes=3, groups=4), 8)
    x, y = records(4, views, 3, 16, 16, seed=9)
    check_fast(model, x, y)


def test_wrn16_4_takes_the_fast_path() -> None:
    model = WideResNet()
    assert fast_path_blocker(model) is None
    x, y = torch.randn(2, 3, 32, 32), targets(2, 3, 0)
    fast = ghost_clipped_grad_sum(model, masked_ce, x, y, 1.0)
    assert fast is not None and fast[1].shape == (2,) and bool((fast[1] > 0).all())


class TiedStandardized(nn.Module):
    """A WSConv2d whose raw weight is also used outside the layer: the guard must fall back."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = WSConv2d(2, 3, 3)
        self.out = nn.Linear(3 * 25, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv(x)) * self.conv.weight.sum()
        return self.out(h.flatten(1))


class ScaledWS(WSConv2d):
    """A subclass may change what the layer computes: no fast rule by exact type."""


def test_guards_fall_back_and_match() -> None:
    torch.manual_seed(10)
    model = TiedStandardized().double()
    x, y = records(4, 1, 2, 7, 7, seed=11)
    assert fast_path_blocker(model) is None
    assert ghost_clipped_grad_sum(model, masked_ce, x[:, 0], y[:, 0], 0.1) is None
    got, norms = clipped_grad_sum(model, masked_ce, x[:, 0], y[:, 0], 0.1)
    want, want_norms = record_loop(model, x, y, 0.1)
    assert_close(got, want)
    torch.testing.assert_close(norms, want_norms, rtol=RTOL, atol=ATOL)
    blocked = nn.Sequential(ScaledWS(2, 3, 3), nn.Flatten(), nn.Linear(75, 3))
    assert "ScaledWS has trainable parameters and no fast rule" in str(fast_path_blocker(blocked))


def test_views_must_divide_the_rows() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    assert (
        ghost_clipped_grad_sum(model, masked_ce, torch.zeros(5, 4), targets(5, 3, 0), 1.0, 2)
        is None
    )


@pytest.mark.parametrize("views", [0, -1, 1.5, True])
def test_bad_views_are_refused_naming_the_argument(views: object) -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    with pytest.raises(ConfigError, match=r"views=.* must be an integer >= 1"):
        ghost_clipped_grad_sum(model, masked_ce, torch.zeros(2, 4), targets(2, 3, 0), 1.0, views)
