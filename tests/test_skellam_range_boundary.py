"""The Skellam range rule and its wrap bound share one reach, ``R = 2**(bits-1) - 1``.

The signed range of a sum modulo ``2**bits`` is ``[-2**(bits-1), 2**(bits-1) - 1]``. The
probabilistic rule used to put ``k`` standard deviations at ``2**(bits-1)``, one past the last
positive value that decodes (at 16 bits the CLI's scale put 3 std at exactly 2**15). Now the
rule puts them at most at ``R`` (:func:`signed_reach`), and the wrap bound is the tail beyond
``R``: what the rule admits decodes, and every wrap lies in what the bound counts.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fedpriv.accounting.core.cli_runner import spec_from_params
from fedpriv.cli.account import run as account
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.modular_range import coordinate_tail_bound, signed_reach

#: docs/accounting.md's 16-bit example (k = 3 standard deviations, the default).
DOC_16 = dict(
    noise_multiplier="0.9", bits="16", num_params="10000", num_clients="10",
    sample_rate="0.1", steps="10", max_grad_norm="1", target_delta="1e-5",
)  # fmt: skip


def mechanism_16():
    from fedpriv.accounting.core.params import Params
    from fedpriv.accounting.skellam import SkellamSpec

    return spec_from_params(SkellamSpec, Params(dict(DOC_16), "skellam")).mechanism


def test_signed_reach_is_the_last_value_that_decodes_both_ways() -> None:
    assert signed_reach(16) == 2**15 - 1 and signed_reach(2) == 1
    m = mechanism_16()
    r = signed_reach(16)
    assert m.wrapped_coordinates([r, -r, 0]) == 0
    assert m.wrapped_coordinates([r + 1]) == 1 and m.wrapped_coordinates([-(r + 2)]) == 1


def test_16_bits_3_stddevs_the_rule_admits_what_decodes_and_the_bound_covers_the_rest() -> None:
    m = mechanism_16()
    reach = m.wrap_stddevs * m.coordinate_std
    assert m.wrap_stddevs == 3.0 and m.bits == 16 and m.required_bits == 16
    # the closed-form scale puts 3 std at R = 32767 (to 1e-12), never at 2**15 as before
    assert reach == pytest.approx(2**15 - 1, rel=1e-12) and reach <= (2**15 - 1) * (1 + 1e-12)
    # every integer the rule's band reaches decodes
    band = np.arange(-math.floor(reach), math.floor(reach) + 1)
    assert m.wrapped_coordinates(band) == 0
    # the bound is twice the tail at R + 1 = 2**15, the first value past the band on either
    # side that can wrap (+2**15 wraps; -2**15 decodes, so the lower side is over-counted)
    tail = coordinate_tail_bound(2.0**15, m.signal_variance, m.total_noise_mu)
    assert m.wrap_bound == pytest.approx(2 * tail + m.summand_tail, rel=1e-12)
    assert m.wrap_bound == pytest.approx(0.0222119, rel=1e-5)  # 0.0222180 at 2**15 before


def test_a_scale_past_the_reach_needs_one_more_bit() -> None:
    m = mechanism_16()
    grow = (2.0**15 / (2**15 - 1)) * (1 + 1e-9)  # 3 std just past 2**15 - 1: 2**15, as before
    bigger = dataclasses.replace(m, bits=17, scale=m.scale * grow, mu=m.mu * grow**2)
    assert bigger.required_bits == 17
    with pytest.raises(ConfigError, match="need bits >= 17"):
        dataclasses.replace(bigger, bits=16)


def test_cli_answer_at_16_bits() -> None:
    """Golden values of the doc's 16-bit call: scale 3700.9293 -> 3700.8164 (R/2**15 of the
    old, less the rounding term's share), epsilon 4.2727125 -> 4.2727126 (to 1e-7)."""
    out = account("skellam", dict(DOC_16))
    assert out["scale"] == pytest.approx(3700.8164, rel=1e-7)
    assert out["epsilon"] == pytest.approx(4.2727126, abs=1e-6)
