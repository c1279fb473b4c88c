"""The class a plug-in config node names (``_target_``), checked to be of the kind its group
needs (a client algorithm, a strategy, an aggregator, a privacy spec)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.utils import get_class

from fedpriv.common.errors import build_error, check


def target_class(node: Mapping[str, Any], group: str, base: type) -> type[Any]:
    """The class ``node["_target_"]`` names, a subclass of ``base``.

    Raises
    ------
    ConfigError
        ``GROUP._target_=...`` when it cannot be imported or is not a ``base`` subclass.
    """
    target = str(node.get("_target_", ""))
    try:
        cls = get_class(target)
    except Exception as exc:  # Hydra raises ImportError/ValueError variants
        raise build_error(group, node, exc) from None
    check(
        isinstance(cls, type) and issubclass(cls, base),
        f"{group}._target_",
        target,
        f"must be a {base.__module__}.{base.__qualname__} subclass",
    )
    return cls
