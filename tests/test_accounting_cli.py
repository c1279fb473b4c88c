"""``fedpriv-account``: registry, JSON contract, calibration, one-line errors."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fedpriv.accounting.core.params import Params, parse_assignments
from fedpriv.accounting.dpsgd import poisson_gaussian_epsilon
from fedpriv.cli import account as cli
from fedpriv.common.errors import ConfigError

logging.getLogger("absl").setLevel(logging.ERROR)
PG = [
    "poisson-gaussian",
    "noise_multiplier=1.1",
    "sample_rate=0.01",
    "steps=1000",
    "target_delta=1e-5",
]


def run_json(capsys, args):
    assert cli.main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_poisson_gaussian_json_matches_python(capsys):
    out = run_json(capsys, PG)
    assert out["epsilon"] == poisson_gaussian_epsilon(1.1, 0.01, 1000, 1e-5)
    assert out["delta"] == 1e-5 and out["accountant"] == "pld"
    out = run_json(capsys, [*PG, "accountant=rdp", "conversion=mironov"])
    assert out["epsilon"] == poisson_gaussian_epsilon(1.1, 0.01, 1000, 1e-5, "rdp", "mironov")


def test_target_epsilon_calibrates(capsys):
    args = [
        "poisson-gaussian",
        "target_epsilon=2",
        "sample_rate=0.01",
        "steps=1000",
        "target_delta=1e-5",
        "accountant=rdp",
    ]
    out = run_json(capsys, args)
    assert out["calibrated"] == "noise_multiplier"
    assert out["epsilon"] <= 2.0
    assert poisson_gaussian_epsilon(out["noise_multiplier"] * 0.99, 0.01, 1000, 1e-5, "rdp") > 2.0


def test_readable_summary(capsys):
    assert cli.main(PG) == 0
    text = capsys.readouterr().out
    assert text.startswith("poisson-gaussian: epsilon = ") and "noise_multiplier = 1.1" in text


def test_skellam_and_secagg(capsys):
    sk = run_json(
        capsys,
        [
            "skellam",
            "noise_multiplier=0.69",
            "bits=32",
            "num_params=1000",
            "num_clients=1",
            "sample_rate=0.1",
            "steps=1",
            "max_grad_norm=1",
            "target_delta=1e-5",
            "conversion=mironov",
        ],
    )
    assert sk["epsilon"] == pytest.approx(5.0, rel=0.01)  # third paper, Table 1, first row
    sa = run_json(
        capsys,
        [
            "secagg-dpsgd",
            "mechanism=gaussian",
            "client_noise_multiplier=0.69",  # the table's per-client σ_i
            "num_clients=10",
            "sample_rate=0.1",
            "steps=1",
            "num_rounds=1",
            "target_delta=1e-5",
            "accountant=rdp",
            "conversion=mironov",
        ],
    )
    assert sa["epsilon"] == pytest.approx(0.64, rel=0.01) and sa["local_epsilon"] == pytest.approx(
        5.0, rel=0.01
    )
    cal = run_json(
        capsys,
        [
            "secagg-dpsgd",
            "target_epsilon=1",
            "num_clients=4",
            "sample_rate=0.1",
            "steps=5",
            "num_rounds=2",
            "target_delta=1e-5",
            "accountant=rdp",
        ],
    )
    assert cal["calibrated"] == "noise_multiplier" and cal["epsilon"] <= 1.0
    # calibration returns both names: σ of the sum and each of the 4 clients' σ_i = σ/2
    assert cal["client_noise_multiplier"] == pytest.approx(cal["noise_multiplier"] / 2, rel=1e-12)
    assert "noise_multiplier_total" not in cal
    # noise_multiplier is σ of the sum, as a run's privacy.noise_multiplier: the calibrated σ
    # given back reproduces the calibrated ε exactly
    again = run_json(
        capsys,
        [
            "secagg-dpsgd",
            f"noise_multiplier={cal['noise_multiplier']!r}",
            "num_clients=4",
            "sample_rate=0.1",
            "steps=5",
            "num_rounds=2",
            "target_delta=1e-5",
            "accountant=rdp",
        ],
    )
    assert again["epsilon"] == cal["epsilon"]


def test_zero_noise_is_infinite_and_json_stays_valid(capsys):
    out = run_json(
        capsys,
        [
            "poisson-gaussian",
            "noise_multiplier=0",
            "sample_rate=0.1",
            "steps=3",
            "target_delta=1e-5",
        ],
    )
    assert out["epsilon"] == "inf"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["nope", "a=1"], "analysis='nope'"),
        ([*PG[:-1], "target_delta=1"], "target_delta='1'"),
        ([*PG[:-1], "target_delta=0"], "target_delta='0'"),
        ([*PG, "noise_multipler=2"], "noise_multipler='2'"),
        (["poisson-gaussian", "noise_multiplier=-1", *PG[2:]], "noise_multiplier='-1'"),
        ([*PG, "sampling=shuffle"], "sampling='shuffle'"),
        ([*PG, "accountant=prv"], "accountant='prv'"),
        ([*PG, "steps=1.5"], "steps"),
        ([*PG, "oops"], "argument='oops'"),
        ([*PG, "target_epsilon=1"], "target_epsilon"),
        (
            [
                "secagg-dpsgd",
                "mechanism=skellam",
                "noise_multiplier=1",
                "num_clients=2",
                "sample_rate=0.1",
                "steps=1",
                "target_delta=1e-5",
                "accountant=pld",
                "num_params=10",
            ],
            "accountant='pld'",
        ),
        (
            [
                "secagg-dpsgd",
                "noise_multiplier=1",
                "client_noise_multiplier=0.5",
                "num_clients=4",
                "sample_rate=0.1",
                "steps=1",
                "target_delta=1e-5",
            ],
            "client_noise_multiplier='0.5' cannot be combined with noise_multiplier",
        ),
        (
            [
                "secagg-dpsgd",
                "client_noise_multiplier=0.5",
                "target_epsilon=1",
                "num_clients=4",
                "sample_rate=0.1",
                "steps=1",
                "target_delta=1e-5",
            ],
            "target_epsilon='1' cannot be combined with client_noise_multiplier",
        ),
    ],
)
def test_bad_arguments_one_line_nonzero(capsys, args, needle):
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in captured.err
    assert captured.out == ""


def test_registry_is_lazy_and_complete():
    assert set(cli.ANALYSES) == {
        "gaussian",
        "gdp",
        "poisson-gaussian",
        "batch-clipping",
        "checkin",
        "skellam",
        "client-level",
        "secagg-dpsgd",
        "ftrl",
    }
    from fedpriv.accounting.core.cli_runner import Choice, FunctionAnalysis
    from fedpriv.accounting.core.privacy_spec import PrivacySpec

    for name, target in cli.ANALYSES.items():
        assert target.startswith("fedpriv.accounting.")  # "module:attribute", imported on use
        obj = cli.load_analysis(name)
        spec = isinstance(obj, type) and issubclass(obj, PrivacySpec)
        assert spec or isinstance(obj, (Choice, FunctionAnalysis)), name


def test_console_script_subprocess():
    exe = Path(sys.executable).with_name("fedpriv-account")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fedpriv.cli.account"]
    ok = subprocess.run([*cmd, *PG, "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "epsilon" in json.loads(ok.stdout)
    bad = subprocess.run(
        [*cmd, *PG[:-1], "target_delta=2"], capture_output=True, text=True, timeout=120
    )
    assert (
        bad.returncode != 0
        and len(bad.stderr.strip().splitlines()) == 1
        and "target_delta" in bad.stderr
    )


def test_params_helper():
    p = Params(parse_assignments(["a=1e3", "b=true", "c=x", "d=0.5"]), "demo")
    assert p.int("a", ge=1) == 1000 and p.bool("b") is True and p.choice("c", ["x", "y"]) == "x"
    assert p.float("d", gt=0, lt=1) == 0.5 and p.float("e", 2.0) == 2.0
    p.finish()
    with pytest.raises(ConfigError, match="z='1' is not a key of demo"):
        q = Params({"z": "1"}, "demo")
        q.finish()
    with pytest.raises(ConfigError, match="z='1' is not a key"):
        Params({"z": "1"}, "demo", known=["a"])
    with pytest.raises(ConfigError, match="a='nan' must be a finite number"):
        Params({"a": "nan"}).float("a")
    with pytest.raises(ConfigError, match="b='maybe' must be true or false"):
        Params({"b": "maybe"}).bool("b")
    with pytest.raises(ConfigError, match="a='2' is given twice"):
        parse_assignments(["a=1", "a=2"])
    with pytest.raises(ConfigError, match="d='0.5' must be >= 1"):
        Params({"d": "0.5"}).float("d", ge=1)


BC = [
    "batch-clipping", "sampling=shuffle", "num_samples=60000", "num_groups=1",
    "group_size=256", "epochs=60", "noise_multiplier=2",
]  # fmt: skip


@pytest.mark.parametrize(
    "args, needle",
    [
        # the noise and both targets: one target would be ignored silently
        (["gaussian", "noise_multiplier=1", "target_delta=1e-5", "target_epsilon=1"], "combined"),
        (["gdp", "mu=1", "target_delta=1e-5", "target_epsilon=1"], "combined"),
        ([*BC, "target_epsilon=3", "target_delta=1e-5"], "combined"),
        # finite but beyond double precision: one line, never a traceback
        (["poisson-gaussian", "noise_multiplier=1e-300", "sample_rate=0.01", "steps=1000",
          "target_delta=1e-5"], "double precision"),
        (["poisson-gaussian", "noise_multiplier=1e300", "sample_rate=0.01", "steps=1000",
          "target_delta=1e-5"], "double precision"),
        (["poisson-gaussian", "noise_multiplier=1.1", "sample_rate=1e-320", "steps=1000",
          "target_delta=1e-5"], "double precision"),
        # delta below what G_mu resolves: refused (it used to read delta = 0)
        (["gdp", "target_epsilon=0", "target_delta=1e-17"], "not resolvable"),
        (["gaussian", "target_epsilon=1e-300", "target_delta=1e-300"], "not resolvable"),
    ],
)  # fmt: skip
def test_ambiguous_or_unresolvable_input_one_line_exit_2(capsys, args, needle):
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_one_target_with_the_noise_still_answers(capsys):
    """gaussian: sqrt(1)/1 = mu 1; eps at 1e-5 is the exact G_1 profile (Dong, Roth, Su)."""
    from fedpriv.accounting.accountants.gdp import gdp_epsilon

    out = run_json(capsys, ["gaussian", "noise_multiplier=1", "target_delta=1e-5"])
    assert out["epsilon"] == pytest.approx(gdp_epsilon(1e-5, 1.0), rel=1e-12)


@pytest.mark.parametrize("name", ["client-level", "poisson-gaussian", "gdp", "checkin"])
def test_analysis_help_lists_its_keys(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``fedpriv-account ANALYSIS --help`` prints the analysis's documentation (exit 0)."""
    from fedpriv.cli.account import main

    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: fedpriv-account {name} key=value")
    assert "target_delta" in out or "target_epsilon" in out or "local_epsilon" in out
    if name == "client-level":  # the spec's fields, the cohort sampler's among them
        for row in ("accountant={pld,rdp}", "allocation_window=int", "client_sample_rate=float"):
            assert f"\n  {row} " in out
