"""Issue 28 item 2: augmentation multiplicity (De et al. 2022, arXiv:2204.13650, Sec. 3.1).

A record's gradient is the mean over its K crop-and-flip views, clipped AFTER averaging, so
one record adds a vector of norm at most C to a step's sum for every K (the accounting is that
of one gradient per record). References: the views against numpy slicing of the padded image;
the clipped sum against plain autograd, one view at a time. The measured sensitivity and noise
of the serialized replies with K = 3 are in tests/test_contract_clients.py
(TestLocalDPSGDAugmult, TestSkellamDPSGDAugmult).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from clients.local_dpsgd import LocalDPSGD
from clients.skellam_dpsgd import SkellamDPSGD
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.common.errors import ConfigError
from fedpriv.data.augment import augment_views, view_draws
from fedpriv.models.zoo import build_model

KEY = np.array([11, 12], dtype=np.uint32)


def _images(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(0))


def test_each_view_is_a_crop_of_the_padded_image_maybe_flipped() -> None:
    x = _images()
    offsets, flips = view_draws(KEY, 0, np.arange(3), k=4)
    views = augment_views(x, offsets, flips)
    assert views.shape == (3, 4, 1, 28, 28)
    padded = np.pad(x.numpy(), ((0, 0), (0, 0), (4, 4), (4, 4)))
    for b in range(3):
        for j in range(4):
            dy, dx = offsets[b * 4 + j]
            want = padded[b, :, dy : dy + 28, dx : dx + 28]
            if flips[b * 4 + j]:
                want = want[:, :, ::-1]
            np.testing.assert_array_equal(views[b, j].numpy(), want)
    assert 0 < flips.mean() < 1 and offsets.min() >= 0 and offsets.max() <= 8


def test_a_records_draws_do_not_depend_on_the_rest_of_the_batch() -> None:
    alone = view_draws(KEY, 2, np.array([7]), k=3)
    among = view_draws(KEY, 2, np.array([1, 7, 9]), k=3)
    np.testing.assert_array_equal(among[0][3:6], alone[0])
    np.testing.assert_array_equal(among[1][3:6], alone[1])
    other_step = view_draws(KEY, 3, np.array([7]), k=3)
    assert not np.array_equal(other_step[0], alone[0])


def _algo(k: int, clip: float) -> LocalDPSGD:
    spec = DPSGDSpec(noise_multiplier=0.0, max_grad_norm=clip, sample_rate=1.0, num_clients=1)
    return LocalDPSGD(steps=1, normalizer=1.0, augmult=k, privacy=spec)


def _mean_view_grads(model: nn.Module, views: torch.Tensor, y: torch.Tensor) -> list[dict]:
    """Per record: the mean over its views of the plain autograd gradient (one view at a time)."""
    out = []
    for b in range(views.shape[0]):
        acc = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        for j in range(views.shape[1]):
            model.zero_grad()
            loss = nn.functional.cross_entropy(
                model(views[b, j : j + 1]), y[b : b + 1], reduction="sum"
            )
            loss.backward()
            for n, p in model.named_parameters():
                acc[n] += p.grad / views.shape[1]  # type: ignore[operator]
        out.append(acc)
    return out


@pytest.mark.parametrize("k", [1, 2, 8])
def test_one_record_adds_at_most_c_for_any_k(k: int) -> None:
    """Tolerance: 1e-5 relative (float32 sums of clipped gradients)."""
    torch.manual_seed(0)
    model = build_model("tanh_cnn", (1, 28, 28), 10)
    x, y = _images(1), torch.tensor([3])
    draws = view_draws(KEY, 0, np.array([0]), k)
    clip = 1e-3  # far below the gradient's norm: the clip binds
    sums = _algo(k, clip).clipped_sums(model, x, y, draws)
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in sums.values()))
    assert norm <= clip * (1 + 1e-5)
    assert norm >= clip * (1 - 1e-5)  # the mean gradient is not zero: clipped to exactly C


def test_the_clip_acts_on_the_mean_of_the_views_not_on_each_view() -> None:
    """With C above every norm, the step's sum is the sum over records of the mean view
    gradient (plain autograd, one view at a time); with a binding C, each record's mean is
    scaled to norm C, which differs from averaging views clipped one by one."""
    torch.manual_seed(1)
    model = build_model("tanh_cnn", (1, 28, 28), 10)
    x, y = _images(3), torch.tensor([1, 4, 4])
    draws = view_draws(KEY, 0, np.arange(3), 4)
    means = _mean_view_grads(model, augment_views(x, *draws), y)
    loose = _algo(4, 1e6).clipped_sums(model, x, y, draws)
    for n, g in loose.items():
        want = sum(m[n] for m in means)
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-6)
    clip = 0.05
    tight = _algo(4, clip).clipped_sums(model, x, y, draws)
    norms = [math.sqrt(sum(float(v.pow(2).sum()) for v in m.values())) for m in means]
    assert min(norms) > clip
    for n, g in tight.items():
        want = sum(m[n] * (clip / norm) for m, norm in zip(means, norms, strict=True))
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-7)


def test_skellam_rows_are_the_mean_view_gradients() -> None:
    torch.manual_seed(2)
    model = build_model("tanh_cnn", (1, 28, 28), 10)
    x, y = _images(2), torch.tensor([0, 9])
    draws = view_draws(KEY, 1, np.arange(2), 3)
    rows = SkellamDPSGD(augmult=3).record_rows(model, x, y, draws)
    means = _mean_view_grads(model, augment_views(x, *draws), y)
    for b, mean in enumerate(means):
        want = torch.cat([mean[n].reshape(-1) for n, _ in model.named_parameters()]).double()
        torch.testing.assert_close(rows[b], want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("k", [0, 3])
def test_physical_parts_give_the_same_step(k: int) -> None:
    """``max_physical_batch_size`` P: the batch goes through the model P records at a time;
    the step's clipped sum (and Skellam's per-record rows) are the whole batch's, to float64
    rounding (1e-9 relative), and each record keeps its own views."""
    torch.manual_seed(3)
    model = build_model("tanh_cnn", (1, 28, 28), 10).double()
    x, y = _images(7).double(), torch.tensor([1, 4, 4, 0, 9, 2, 2])
    draws = view_draws(KEY, 0, np.arange(7), k) if k else None
    whole = _algo(k, 0.05).clipped_sums(model, x, y, draws)
    spec = DPSGDSpec(noise_multiplier=0.0, max_grad_norm=0.05, sample_rate=1.0, num_clients=1)
    for size in (1, 3, 7, 50):
        algo = LocalDPSGD(
            steps=1, normalizer=1.0, augmult=k, max_physical_batch_size=size, privacy=spec
        )
        for n, g in algo.clipped_sums(model, x, y, draws).items():
            torch.testing.assert_close(g, whole[n], rtol=1e-9, atol=1e-12)
    rows = SkellamDPSGD(augmult=k).record_rows(model, x, y, draws)
    parts = SkellamDPSGD(augmult=k, max_physical_batch_size=3).record_rows(model, x, y, draws)
    torch.testing.assert_close(parts, rows, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("size", [0, -2, 1.5, True, "64"])
def test_bad_physical_batch_size_is_refused_naming_the_field(size: object) -> None:
    with pytest.raises(
        ConfigError, match=r"client.max_physical_batch_size=.* must be an integer >= 1"
    ):
        LocalDPSGD(max_physical_batch_size=size)  # type: ignore[arg-type]


def test_bad_augmult_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="client.augmult=-1 must be an integer >= 0"):
        _algo(-1, 1.0)
    tabular = torch.randn(2, 5)
    model = build_model("logistic", (5,), 3)
    draws = view_draws(KEY, 0, np.arange(2), 2)
    with pytest.raises(ConfigError, match=r"client.augmult=2 needs image inputs \(B, C, H, W\)"):
        _algo(2, 1.0).clipped_sums(model, tabular, torch.tensor([0, 1]), draws)
    assert not _algo(2, 1.0).trains_cohorts() and _algo(0, 1.0).trains_cohorts()
    assert not replace(_algo(0, 1.0), max_physical_batch_size=8).trains_cohorts()


@pytest.mark.parametrize("client", ["client=dpsgd", "client=client_level"])
def test_augmult_on_tabular_data_is_refused_before_training(client: str, shared_data: Any) -> None:
    from fedpriv.run.prepare import prepare
    from tests.test_faults import _cfg

    over = ["dataset=adult", f"dataset.data_dir={shared_data / 'adult'}", "model=logistic"]
    over += [client, "client.augmult=2"]
    if client == "client=client_level":
        over.append("privacy=client_level")
    want = r"client.augmult=2 needs image inputs \(C, H, W\); this dataset's records have shape"
    with pytest.raises(ConfigError, match=want):
        prepare(_cfg(over))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["client=batch_clipping", "client.augmult=2"],
            "fedpriv: error: client.augmult='2' is not a setting of client=batch_clipping "
            "(its keys: analysis, clipping_norms, ",
        ),
        (
            ["strategy.augmult=2"],
            "fedpriv: error: strategy.augmult='2' is not a setting of the default strategy "
            "(its keys: ema_decay, ",
        ),
    ],
)
def test_a_client_without_augmult_names_its_keys(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedpriv.cli.experiment import precheck

    with pytest.raises(SystemExit) as info:
        precheck(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err
