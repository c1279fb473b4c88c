"""Clipping: ||clip(x)|| <= C for every shape, 0-d and all-zero included."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.clipping import clip_tensors, global_norm

shapes = st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=3), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(
    shapes=shapes,
    scale=st.floats(1e-3, 1e3),
    clip=st.floats(1e-3, 10.0),
    seed=st.integers(0, 2**31),
)
def test_clipped_norm_at_most_c(
    shapes: list[list[int]], scale: float, clip: float, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    ts = [scale * torch.randn(s, generator=g) for s in shapes]  # s == [] gives a 0-d tensor
    out = clip_tensors(ts, clip)
    norm = float(global_norm(out))
    assert norm <= clip * (1 + 1e-5)  # float32 rounding tolerance
    assert [o.shape for o in out] == [t.shape for t in ts]
    before = float(global_norm(ts))
    if before <= clip:  # below the clip: unchanged
        for a, b in zip(ts, out):
            torch.testing.assert_close(a, b)
    else:  # above: scaled exactly onto the sphere of radius C
        assert math.isclose(norm, clip, rel_tol=1e-5)


def test_zero_and_scalar_inputs() -> None:
    z = clip_tensors([torch.zeros(3), torch.zeros(())], 1.0)
    assert all(torch.equal(t, torch.zeros_like(t)) and not torch.isnan(t).any() for t in z)
    s = clip_tensors([torch.tensor(5.0)], 2.0)  # a 0-d tensor is clipped too
    assert float(s[0]) == pytest.approx(2.0)


def test_bad_clipping_norm() -> None:
    with pytest.raises(ConfigError, match=r"clipping_norm=0.0 must be > 0"):
        clip_tensors([torch.ones(2)], 0.0)
