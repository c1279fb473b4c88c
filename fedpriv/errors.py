"""One error type for bad user input, rendered as one clear line."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration or argument value is out of its allowed range.

    Parameters
    ----------
    field : str
        Dotted name of the offending field, e.g. ``"privacy.noise_multiplier"``.
    value : Any
        The value that was given.
    allowed : str
        What would be accepted, e.g. ``"must be >= 0"`` or ``"one of: pld, rdp"``.

    The message reads ``privacy.noise_multiplier=-1.0 must be >= 0``.
    """

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} {allowed}")


def check(condition: bool, field: str, value: Any, allowed: str) -> None:
    """Raise :class:`ConfigError` naming ``field`` and ``value`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, value, allowed)


def build_error(field: str, target: object, exc: BaseException) -> ConfigError:
    """One-line :class:`ConfigError` for a ``_target_`` that Hydra could not import or build."""
    text = str(exc).replace("set env var HYDRA_FULL_ERROR=1 to see chained exception.", "")
    return ConfigError(field, target, "could not be built: " + " ".join(text.split()).rstrip(" ,"))
