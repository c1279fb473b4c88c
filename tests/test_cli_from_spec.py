"""``fedpriv-account``'s keys derived from the privacy specs (issue 40, item 1(d)): one runner,
the keys and their types, defaults and enum values from the spec's dataclass fields, and the
fixes that came with it (numbers as numbers, one confidence type, batch clipping's achieved ε
after calibration)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from fedpriv.accounting.batch_clipping.spec import BatchClippingSpec
from fedpriv.accounting.client_level.spec import ClientLevelSpec
from fedpriv.accounting.core.cli_runner import spec_from_params, spec_keys
from fedpriv.accounting.core.params import REQUIRED
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.cli import account as cli
from fedpriv.cli.account import run
from fedpriv.common.errors import ConfigError

#: One fast call of every analysis (and of each option of checkin's and secagg-dpsgd's key).
CALLS = {
    "gaussian": {"noise_multiplier": "1", "target_delta": "1e-5"},
    "gdp": {"mu": "1", "target_delta": "1e-5"},
    "poisson-gaussian": {"noise_multiplier": "1.1", "sample_rate": "0.01", "steps": "10"},
    "batch-clipping": {
        "sampling": "shuffle",
        "num_samples": "600",
        "num_groups": "1",
        "group_size": "60",
        "noise_multiplier": "2",
    },
    "checkin": {
        "variant": "fixed",
        "local_epsilon": "1",
        "num_clients": "1000",
        "num_slots": "100",
    },
    "skellam": {"noise_multiplier": "0.9", "bits": "16", "num_params": "1000", "num_clients": "10"},
    "secagg-dpsgd": {"noise_multiplier": "2", "num_clients": "10", "steps": "3"},
    "client-level": {
        "noise_multiplier": "1",
        "num_clients": "100",
        "client_sampling": "poisson",
        "client_sample_rate": "0.1",
        "num_rounds": "10",
    },
    "ftrl": {"factorization": "identity", "noise_multiplier": "1", "num_rounds": "20"},
}
MORE = [
    ("checkin", {"noise": "central_gaussian", "noise_multiplier": "1", "num_slots": "2"}),
    ("checkin", {"variant": "shuffle", "local_epsilon": "1", "num_clients": "1000"}),
    (
        "secagg-dpsgd",
        {"mechanism": "skellam", "noise_multiplier": "1", "num_params": "100", "num_clients": "4"},
    ),
]


def _json(result: dict) -> dict:
    return json.loads(json.dumps(cli._jsonable(result), allow_nan=False))


def _leaves(value: object, path: str = "") -> list[tuple[str, object]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path, value)]


def _numeric_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text not in ("inf", "-inf", "nan")  # JSON has no non-finite number


ANSWERS = [(name, params) for name, params in CALLS.items()] + MORE


@pytest.mark.parametrize(
    "name, params", ANSWERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(ANSWERS)]
)
def test_every_answer_has_numbers_as_numbers_and_one_confidence_type(name, params):
    """Every numeric output is a JSON number (a non-finite one is written "inf", the JSON
    contract), never a string holding a number; a confidence is a float in (0, 1]."""
    out = _json(run(name, {**params, "lower_bound": "true"}))
    assert isinstance(out["epsilon"], (int, float)) and isinstance(out["delta"], float)
    for path, value in _leaves(out):
        assert not (isinstance(value, str) and _numeric_text(value)), (path, value)
        if "confidence" in path:
            assert isinstance(value, float) and 0.0 < value <= 1.0, (path, value)
    bound = out["epsilon_lower_bound"]
    if isinstance(bound, float):
        assert isinstance(out["epsilon_lower_bound_confidence"], float)
        assert bound <= out["epsilon"] * (1 + 1e-9)


def test_the_allocation_estimate_interval_is_two_floats() -> None:
    """``epsilon_estimate_interval`` is ``[lower, upper]`` (it was one string), with its
    confidence and sample count beside it."""
    keys = {"num_clients": "40", "client_sampling": "random_allocation", "target_delta": "1e-3"}
    keys |= {"allocation_window": "4", "rounds_per_client": "2", "noise_multiplier": "1"}
    out = _json(run("client-level", {**keys, "num_rounds": "4", "lower_bound": "true"}))
    low, high = out["epsilon_estimate_interval"]
    assert isinstance(low, float) and isinstance(high, float)
    assert low <= out["epsilon_estimate"] <= high
    assert out["epsilon_estimate_confidence"] == out["epsilon_lower_bound_confidence"] == 0.99
    assert isinstance(out["epsilon_estimate_samples"], int)


def test_batch_clipping_calibration_prints_the_achieved_epsilon() -> None:
    """With ``target_epsilon`` the answer is the ε the calibrated σ achieves at target_delta
    (it echoed the target and printed δ at it)."""
    keys = dict(CALLS["batch-clipping"], target_delta="1e-5")
    del keys["noise_multiplier"]
    out = run("batch-clipping", {**keys, "target_epsilon": "2"})
    assert out["calibrated"] == "noise_multiplier" and out["target_epsilon"] == 2.0
    assert out["delta"] == 1e-5 and out["epsilon"] < 2.0  # achieved: σ is rounded up
    again = run("batch-clipping", {**keys, "noise_multiplier": repr(out["noise_multiplier"])})
    assert again["epsilon"] == out["epsilon"] >= 0.99 * 2.0


@pytest.mark.parametrize("cls", [DPSGDSpec, SkellamSpec, BatchClippingSpec, ClientLevelSpec])
def test_keys_are_the_fields_with_their_types_and_defaults(cls: type[PrivacySpec]) -> None:
    """A key that sets a field has the field's default (or is required) and its enum values."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in spec_keys(cls, cls.cli):
        if key.field is None or "." in key.field:
            continue
        f = fields[key.field]
        if key.default is REQUIRED or key.name in cls.cli.defaults or key.field == cls.calibrates:
            continue
        assert key.default == f.default, key.name


def test_help_lists_exactly_the_keys_with_types_and_defaults(capsys) -> None:
    assert cli.main(["poisson-gaussian", "--help"]) == 0
    text = capsys.readouterr().out
    rows = text.split("\nkeys (key=type  default  meaning):\n", 1)[1].splitlines()
    listed = [row.split()[0].split("=")[0] for row in rows]
    assert listed == [k.name for k in spec_keys(DPSGDSpec, DPSGDSpec.cli)]
    assert any(r.split()[:2] == ["sample_rate=float", "0.1"] for r in rows)
    assert any(r.split()[:2] == ["accountant={pld,rdp}", "pld"] for r in rows)
    # a key that picks the spec lists the keys of the option given
    assert cli.main(["checkin", "noise=central_gaussian", "--help"]) == 0
    text = capsys.readouterr().out
    assert "\n  noise={local,central_gaussian}" in text and "\n  num_slots=int" in text


@pytest.mark.parametrize(
    "name, params, needle",
    [
        ("poisson-gaussian", {"noise_multiplier": "x"}, "noise_multiplier='x' must be a number"),
        ("poisson-gaussian", {"noise_multiplier": "1", "bogus": "2"}, "bogus='2' is not a key"),
        ("client-level", {"noise_multiplier": "1", "num_clients": "0"}, "num_clients='0'"),
        ("checkin", {"noise": "loud"}, "noise='loud' must be one of: local, central_gaussian"),
        ("batch-clipping", {"num_samples": "10", "sampling": "poisson"}, "sampling='poisson'"),
        ("ftrl", {"noise_multiplier": "1"}, "num_rounds=None is required"),
    ],
)
def test_a_bad_key_or_value_is_named_with_the_value_as_typed(name, params, needle) -> None:
    with pytest.raises(ConfigError) as err:
        run(name, params)
    assert needle in str(err.value)


def test_from_params_builds_the_runs_spec_and_leaves_calibration_pending() -> None:
    from fedpriv.accounting.core.params import Params

    keys = {"sample_rate": "0.01", "steps": "5"}
    spec = spec_from_params(
        DPSGDSpec, Params({**keys, "noise_multiplier": "1.1"}, "poisson-gaussian")
    )
    assert spec == DPSGDSpec(noise_multiplier=1.1, sample_rate=0.01, steps=5)
    pending = spec_from_params(
        DPSGDSpec, Params({**keys, "target_epsilon": "3"}, "poisson-gaussian")
    )
    assert pending.needs_calibration and pending.noise_multiplier is None
    assert math.isclose(pending.calibrated(3.0, 1).epsilon(1), 3.0, rel_tol=0.01)


def test_dpsgd_lower_bound_is_the_runs_pair_in_both_analyses() -> None:
    """A ``DPSGDSpec`` round releases its S local steps summed: ``poisson-gaussian`` and
    ``secagg-dpsgd`` answer the same pair (``PrivacySpec.lower_bound``, one hook); releasing
    every step (``steps=1``) reveals more, so its bound is larger, at the same ε."""
    base = {"noise_multiplier": "2", "sample_rate": "0.1", "lower_bound": "true"}
    summed = run("poisson-gaussian", {**base, "steps": "10"})
    secagg = run("secagg-dpsgd", {**base, "steps": "10", "num_clients": "1"})
    assert summed["epsilon_lower_bound"] == secagg["epsilon_lower_bound"] < summed["epsilon"]
    each = run("poisson-gaussian", {**base, "steps": "1", "num_rounds": "10"})
    assert each["epsilon"] == summed["epsilon"]
    assert summed["epsilon_lower_bound"] < each["epsilon_lower_bound"] <= each["epsilon"]
