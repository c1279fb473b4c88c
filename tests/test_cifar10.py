"""Issue 28 items 1-2: CIFAR-10 from the JPEG archives (the 5k/1k subset in
../shared/data/cifar10-jpg), its cache, damaged archives, and the CIFAR-10 models.

Independent references: single JPEGs decoded with PIL straight from the archive (pixels and
label from the file's own path); the per-channel mean / std of the standardized training
images against 0 / 1 (the public constants are the official set's, so the JPEG subset lands
within 0.05); parameter counts of the published architectures.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedpriv.common.errors import ConfigError
from fedpriv.data import cifar10, load_dataset
from fedpriv.models.cifar import CifarCNN, WideResNet, WSConv2d
from fedpriv.models.zoo import build_model


@pytest.fixture(scope="module")
def subset(cifar_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_dataset("cifar10", cifar_dir, subset=True, cache_dir=tmp_path_factory.mktemp("c"))


def test_subset_shapes_counts_and_standardization(subset: Any) -> None:
    assert subset.name == "cifar10_subset" and subset.input_shape == (3, 32, 32)
    assert subset.x_train.shape == (5000, 3, 32, 32) and subset.x_test.shape == (1000, 3, 32, 32)
    assert subset.x_train.dtype == np.float32 and subset.y_train.dtype == np.int64
    assert np.bincount(subset.y_train).tolist() == [500] * 10
    assert np.bincount(subset.y_test).tolist() == [100] * 10
    mean = subset.x_train.mean(axis=(0, 2, 3))
    std = subset.x_train.std(axis=(0, 2, 3))
    np.testing.assert_allclose(mean, 0.0, atol=0.05)
    np.testing.assert_allclose(std, 1.0, atol=0.05)
    assert "JPEG" in subset.provenance and "not bit-identical" in subset.provenance


@pytest.mark.parametrize(("split", "cls", "index"), [("train", "cat", 0), ("test", "truck", 99)])
def test_a_row_is_its_jpeg_decoded_by_pil(
    subset: Any, cifar_dir: Path, split: str, cls: str, index: int
) -> None:
    """Row = (class, name) order: the ``index``-th file of ``cls`` by name."""
    from PIL import Image

    with tarfile.open(cifar_dir / cifar10.SUBSET) as tar:
        names = sorted(
            m.name for m in tar if m.name.startswith(f"{split}/{cls}/") and m.name.endswith(".jpg")
        )
        data = tar.extractfile(names[index]).read()  # type: ignore[union-attr]
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32) / 255
    label = cifar10.CLASSES.index(cls)
    per_class = 500 if split == "train" else 100
    row = label * per_class + index
    x, y = (subset.x_train, subset.y_train) if split == "train" else (subset.x_test, subset.y_test)
    assert y[row] == label
    want = (pixels.transpose(2, 0, 1) - np.array(cifar10.MEAN)[:, None, None]) / np.array(
        cifar10.STD
    )[:, None, None]
    np.testing.assert_allclose(x[row], want, atol=1e-5)


def test_second_load_reads_the_cache_and_a_damaged_cache_is_decoded_again(
    cifar_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_dataset("cifar10", cifar_dir, subset=True, cache_dir=tmp_path)
    (cache,) = tmp_path.glob("cifar10-subset-*.npz")
    with monkeypatch.context() as patch:  # no decoding allowed: the cache must serve
        patch.setattr(cifar10, "_decode", lambda *a: pytest.fail("decoded again"))
        again = load_dataset("cifar10", cifar_dir, subset=True, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.x_train, first.x_train)
    with np.load(cache) as data:  # one label changed: the stored sha256 no longer matches
        arrays = {k: data[k] for k in data.files}
    arrays["y_train"] = arrays["y_train"].copy()
    arrays["y_train"][0] = 9
    np.savez(cache, **arrays)
    with pytest.warns(UserWarning, match="checksum mismatch"):
        mended = load_dataset("cifar10", cifar_dir, subset=True, cache_dir=tmp_path)
    np.testing.assert_array_equal(mended.y_train, first.y_train)
    data = cache.read_bytes()
    for damaged in (data[: len(data) // 2], data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]):
        cache.write_bytes(damaged)  # truncated, or one flipped byte (a zip CRC error)
        with pytest.warns(UserWarning, match="unreadable cache"):
            mended = load_dataset("cifar10", cifar_dir, subset=True, cache_dir=tmp_path)
        np.testing.assert_array_equal(mended.x_train, first.x_train)


@pytest.mark.parametrize("value", ["no", "abc", 1])
def test_subset_must_be_a_bool(cifar_dir: Path, value: object) -> None:
    with pytest.raises(ConfigError, match=r"dataset.options.subset=.* must be true .* or false"):
        load_dataset("cifar10", cifar_dir, subset=value)


def test_a_given_cache_dir_must_be_a_directory(cifar_dir: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError, match=r"dataset.options.cache_dir=.* is a file: give a dir"):
        load_dataset("cifar10", cifar_dir, subset=True, cache_dir=afile)
    with pytest.raises(ConfigError, match=r"dataset.options.cache_dir=.* is not a usable dir"):
        load_dataset("cifar10", cifar_dir, subset=True, cache_dir=afile / "sub")


def _copy(cifar_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "archives"
    out.mkdir()
    shutil.copy(cifar_dir / cifar10.SUBSET, out / cifar10.SUBSET)
    return out / cifar10.SUBSET


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_archive_is_one_line_naming_it(
    cifar_dir: Path, tmp_path: Path, damage: str
) -> None:
    path = _copy(cifar_dir, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"x" * 4096)
    with pytest.raises(ConfigError) as info:
        load_dataset("cifar10", path.parent, subset=True, cache_dir=tmp_path / "cache")
    line = str(info.value)
    assert "\n" not in line and str(path) in line and "truncated or" in line


def test_an_archive_missing_images_is_refused(cifar_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "archives"
    out.mkdir()
    with (
        tarfile.open(cifar_dir / cifar10.SUBSET) as tar,
        tarfile.open(out / cifar10.SUBSET, "w:gz") as dst,
    ):
        for member in tar:
            if member.isfile() and "/cat/" not in member.name:  # every cat left out
                dst.addfile(member, tar.extractfile(member))
    want = r"holds \[500, 500, 500, 0, 500, .*\] train images per class, not 500 of"
    with pytest.raises(ConfigError, match=want):
        load_dataset("cifar10", out, subset=True, cache_dir=tmp_path / "cache")


def test_missing_directory_or_archive_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dataset.data_dir=None must name a directory"):
        load_dataset("cifar10", None)
    with pytest.raises(ConfigError, match="lacks cifar10_train_jpg.tar.gz"):
        load_dataset("cifar10", tmp_path)
    with pytest.raises(ConfigError, match=r"dataset.subset=.*is not an option|is not an option"):
        load_dataset("cifar10", tmp_path, train_limit=5)


def test_models_have_the_published_sizes_and_shapes() -> None:
    """Papernot et al. 2021's CIFAR-10 CNN: 550,570 parameters (3x3 convs 32-32-64-64-128-128,
    dense 128); WRN-16-4: 2.7M (Zagoruyko & Komodakis 2016), GroupNorm's affine parameters
    in place of BatchNorm's."""
    cnn, wrn = build_model("cifar_cnn", (3, 32, 32), 10), build_model("wrn16_4", (3, 32, 32), 10)
    assert isinstance(cnn, CifarCNN) and isinstance(wrn, WideResNet)
    assert sum(p.numel() for p in cnn.parameters()) == 550_570
    assert sum(p.numel() for p in wrn.parameters()) == pytest.approx(2.7e6, rel=0.02)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in wrn.modules())
    x = torch.randn(4, 3, 32, 32)
    assert cnn(x).shape == wrn(x).shape == (4, 10)
    with pytest.raises(ConfigError, match="needs 3x32x32 image inputs"):
        build_model("wrn16_4", (1, 28, 28), 10)


def test_weight_standardized_conv_uses_a_zero_mean_unit_variance_kernel() -> None:
    """WS conv = a plain conv with the standardized kernel (Qiao et al. 2019, eq. 5)."""
    torch.manual_seed(0)
    ws = WSConv2d(8, 4, 3, padding=1, bias=False)
    w = ws.weight.detach().double()
    flat = w.reshape(4, -1)
    std_w = (flat - flat.mean(1, keepdim=True)) / torch.sqrt(flat.var(1, unbiased=False) + 1e-5)[
        :, None
    ]
    x = torch.randn(2, 8, 6, 6, dtype=torch.float64)
    want = torch.nn.functional.conv2d(x, std_w.reshape(w.shape), padding=1)
    np.testing.assert_allclose(ws.double()(x).detach().numpy(), want.numpy(), atol=1e-10)
    assert abs(float(std_w.mean())) < 1e-12


def short_run(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """A run of ``overrides`` (no progress bar, no plot) that must complete; its results.json."""
    from fedpriv.run.runner import run_experiment
    from tests.test_faults import _cfg

    summary = run_experiment(_cfg([*overrides, "progress=false", "plot=false"]), run_dir)
    assert summary["status"] == "complete", summary["message"]
    return json.loads((run_dir / "results.json").read_text())  # type: ignore[no-any-return]


def test_results_record_the_dataset_provenance(
    cifar_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short run on the subset (the CIFAR-10 CNN, 2 clients, 1 round of 2 steps) writes the
    JPEG caveat into results.json."""
    monkeypatch.setenv("HOME", str(tmp_path))  # the cache goes to this test's home
    over = ["dataset=cifar10", f"dataset.data_dir={cifar_dir}", "dataset.options.subset=true"]
    res = short_run(
        tmp_path / "run",
        [*over, "model=cifar_cnn", "num_clients=2", "num_rounds=1", "client.steps=2"],
    )
    assert res["dataset"]["name"] == "cifar10_subset"
    assert "not bit-identical" in res["dataset"]["provenance"]
    assert 0.0 <= res["rounds"][0]["accuracy"] <= 1.0
