"""Corrupt dataset files are refused in one line that names the file (issue 14, item 5).

Each test damages a copy of a real file of ``../shared/data`` (or of the embedded file) the way
a broken download does: truncated gzip, a file that is not gzip, a wrong IDX magic number, a
truncated npz, a truncated ``adult.data``.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from fedpriv.common.errors import ConfigError
from fedpriv.data.embedded import EMBEDDED_FILE, read_embedded_arrays
from fedpriv.data.idx import read_idx
from fedpriv.data.images import load_mnist
from fedpriv.data.tabular import load_adult


def _mnist_copy(shared_data: Path, tmp_path: Path) -> Path:
    src = shared_data / "mnist"
    dst = tmp_path / "mnist"
    shutil.copytree(src, dst)
    return dst


def test_truncated_gzip_names_the_file(shared_data: Path, tmp_path: Path) -> None:
    d = _mnist_copy(shared_data, tmp_path)
    f = d / "t10k-labels-idx1-ubyte.gz"
    f.write_bytes(f.read_bytes()[:2000])
    with pytest.raises(ConfigError, match=r"t10k-labels-idx1-ubyte.gz' cannot be read \(EOFError"):
        load_mnist(d)


def test_non_gzip_file_names_the_file(shared_data: Path, tmp_path: Path) -> None:
    d = _mnist_copy(shared_data, tmp_path)
    (d / "t10k-images-idx3-ubyte.gz").write_text("<html>404 Not Found</html>")
    with pytest.raises(ConfigError, match=r"t10k-images-idx3-ubyte.gz' cannot be read .*gzip"):
        load_mnist(d)


def test_wrong_idx_magic_is_named(tmp_path: Path) -> None:
    # an images file whose header says 1 dimension (0x00000801: a labels file) under an idx3 name
    f = tmp_path / "t10k-images-idx3-ubyte.gz"
    with gzip.open(f, "wb") as fh:
        fh.write(bytes([0, 0, 8, 1]) + (3).to_bytes(4, "big") + b"abc")
    with pytest.raises(ConfigError, match=r"magic number 0x00000801 \(1 dimensions\); its name"):
        read_idx(f)


def test_truncated_npz_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "fashion_mnist_6k_1k.npz"
    f.write_bytes(Path(EMBEDDED_FILE).read_bytes()[:50_000])
    with pytest.raises(ConfigError, match=r"fashion_mnist_6k_1k.npz' cannot be read \(BadZipFile"):
        read_embedded_arrays(f)


def test_truncated_adult_is_refused_with_row_counts(shared_data: Path, tmp_path: Path) -> None:
    d = tmp_path / "adult"
    shutil.copytree(shared_data / "adult", d)
    lines = (d / "adult.data").read_text().splitlines(keepends=True)
    (d / "adult.data").write_text("".join(lines[:8213]))
    with pytest.raises(
        ConfigError, match=r"adult.data' has 8213 rows; the published file has 32561"
    ):
        load_adult(d)


def test_intact_adult_loads_all_rows(shared_data: Path) -> None:
    ds = load_adult(shared_data / "adult")
    assert (len(ds.y_train), len(ds.y_test)) == (32561, 16281)  # adult.names
