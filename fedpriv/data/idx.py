"""Reader for the IDX file format of MNIST and Fashion-MNIST (plain or ``.gz``)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from fedpriv.common.errors import ConfigError
from fedpriv.data.files import reading

# IDX type byte -> numpy big-endian dtype (LeCun et al., "THE MNIST DATABASE", file formats).
_IDX_DTYPES: dict[int, str] = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Read one IDX file into a numpy array.

    Parameters
    ----------
    path : str or Path
        An IDX file, gzip-compressed when its name ends in ``.gz``.
    ndim : int or None
        The number of dimensions the file must hold (3 for images, 1 for labels); ``None``:
        read from the name (``idx3`` / ``idx1``) when it says, else any.

    Returns
    -------
    np.ndarray
        Array of the shape stored in the header, e.g. ``(60000, 28, 28)`` uint8 for images or
        ``(60000,)`` uint8 for labels; native byte order.

    Raises
    ------
    ConfigError
        If the file is missing, truncated or not gzip (named), its magic number is not IDX or
        not of ``ndim`` dimensions, or its size disagrees with its header.

    References
    ----------
    Y. LeCun, C. Cortes, C. Burges, "The MNIST database of handwritten digits" (IDX format).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError("data_dir", str(path.parent), f"must contain the IDX file {path.name}")
    opener = gzip.open if path.suffix == ".gz" else open
    with reading(path), opener(path, "rb") as fh:
        raw = fh.read()
    if ndim is None:
        ndim = next((d for d in (1, 2, 3, 4) if f"idx{d}" in path.name), None)
    magic = raw[:4].hex()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ConfigError("idx_file", str(path), f"is not an IDX file (magic number 0x{magic})")
    if ndim is not None and raw[3] != ndim:
        raise ConfigError(
            "idx_file",
            str(path),
            f"has magic number 0x{magic} ({raw[3]} dimensions); its name says {ndim} "
            f"(0x0000{raw[2]:02x}{ndim:02x})",
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ConfigError(
            "idx_file", str(path), f"has {len(raw)} bytes but its header {shape} needs {expected}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))
