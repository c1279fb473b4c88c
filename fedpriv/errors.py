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


def build_error(group: str, node: Mapping[str, Any], exc: BaseException) -> ConfigError:
    """One-line :class:`ConfigError` for a config ``node`` (with ``_target_``) of config group
    ``group`` that Hydra could not import or build.

    A key the target does not take is named as the field (``client.sampler='shuffle' is not a
    parameter of clients.dpsgd.LocalDPSGD``); any other failure names ``group._target_``.
    """
    target = node.get("_target_")
    text = " ".join(str(exc).replace("set env var HYDRA_FULL_ERROR=1 to see chained exception.", "").split())
    unknown = re.search(r"unexpected keyword argument '(\w+)'", text)
    if unknown and unknown.group(1) in node:
        key = unknown.group(1)
        return ConfigError(f"{group}.{key}", node[key], f"is not a parameter of {target}")
    return ConfigError(f"{group}._target_", target, "could not be built: " + text.rstrip(" ,"))
