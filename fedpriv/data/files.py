"""Reading a dataset file so that a truncated or corrupt one is named in one line.

``gzip``, ``zipfile`` and ``numpy`` report a damaged file with errors that do not name it
(``EOFError: Compressed file ended before the end-of-stream marker was reached``,
``BadZipFile: File is not a zip file``); :func:`reading` turns them into a
:class:`~fedpriv.common.errors.ConfigError` naming the file and the remedy.
"""

from __future__ import annotations

import contextlib
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from fedpriv.common.errors import ConfigError


@contextlib.contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Run the ``with`` body; a read error of ``path`` becomes one ConfigError line.

    Raises
    ------
    ConfigError
        ``dataset file='/d/train-images-idx3-ubyte.gz' cannot be read (EOFError: ...): it is
        truncated or corrupt; download it again``. A ConfigError of the body passes unchanged.
    """
    try:
        yield
    except ConfigError:
        raise
    except (
        EOFError,
        OSError,
        zipfile.BadZipFile,
        tarfile.TarError,
        zlib.error,
        ValueError,
        KeyError,
    ) as exc:
        raise ConfigError(
            "dataset file",
            str(path),
            f"cannot be read ({type(exc).__name__}: {exc}): it is truncated or corrupt; "
            "download it again",
        ) from None


def check_rows(path: str | Path, found: int, expected: int) -> None:
    """Refuse a file holding ``found`` rows where the published file has ``expected``.

    Raises
    ------
    ConfigError
        ``dataset file='/d/adult.data' has 8213 rows; the published file has 32561: ...``.
    """
    if found != expected:
        raise ConfigError(
            "dataset file",
            str(path),
            f"has {found} rows; the published file has {expected}: it is truncated or not "
            "the original, download it again",
        )
