"""One error type for bad user input, rendered as one clear line."""

from __future__ import annotations

import re
from collections.abc import Mapping
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


def unknown_key(node: Mapping[str, Any], exc: BaseException) -> str | None:
    """The key of ``node`` that ``exc`` (a constructor's TypeError, possibly wrapped) rejects as
    an unexpected keyword argument, or ``None``."""
    found = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    return found.group(1) if found and found.group(1) in node else None


def build_error(group: str, node: Mapping[str, Any], exc: BaseException) -> ConfigError:
    """One-line :class:`ConfigError` for a config ``node`` (with ``_target_``) of config group
    ``group`` that Hydra could not import or build.

    A :class:`ConfigError` raised by the constructor (Hydra wraps it) is returned as it is; a
    key the target does not take is named as the field (``client.sampler='shuffle' is not a
    parameter of clients.local_dpsgd.LocalDPSGD``); any other failure names ``group._target_``.
    """
    if isinstance(exc.__cause__, ConfigError):
        return exc.__cause__
    target = node.get("_target_")
    key = unknown_key(node, exc)
    if key is not None:
        hint = f" (a class of your own with only its fields: {group}=custom {group}._target_=...)"
        return ConfigError(f"{group}.{key}", node[key], f"is not a parameter of {target}{hint}")
    text = " ".join(
        str(exc).replace("set env var HYDRA_FULL_ERROR=1 to see chained exception.", "").split()
    )
    return ConfigError(f"{group}._target_", target, "could not be built: " + text.rstrip(" ,"))
