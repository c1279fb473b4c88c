"""Keys and class paths that changed name, and the one line that refuses each old spelling.

``docs/migration.md`` lists the same table for readers; ``tests/test_migration.py`` checks
that every entry is refused with its new name, from the command line and from a config file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.common.errors import ConfigError


@dataclass(frozen=True)
class Renamed:
    """``old`` is now ``new`` for the privacy family ``family`` ('' for every family); ``where``
    names the options it concerns for the message."""

    old: str
    new: str
    family: str = ""
    where: str = ""

    def error(self, value: Any) -> ConfigError:
        """The one-line refusal of the old key."""
        scope = f" ({self.where})" if self.where else ""
        return ConfigError(
            self.old, value, f"was renamed{scope}: use {self.new} (docs/migration.md)"
        )


#: Config keys (dotted) that changed name.
RENAMED_KEYS: tuple[Renamed, ...] = (
    Renamed(
        "privacy.max_grad_norm",
        "privacy.clipping_norm",
        family="batch_clipping",
        where="privacy=batch_clipping: the clip of a group's update",
    ),
    Renamed(
        "client.client_sample_rate",
        "client.slot_sample_rate",
        family="checkin",
        where="client=checkin client.variant=poisson: the per-slot client rate",
    ),
)

#: ``_target_`` class paths that moved: old path -> new path.
MOVED_TARGETS: dict[str, str] = {
    "clients.dpsgd.LocalDPSGD": "clients.local_dpsgd.LocalDPSGD",
    "clients.batch_clipping.GeneralizedDPSGD": "clients.generalized_dpsgd.GeneralizedDPSGD",
    "clients.checkin.CheckinClient": "clients.checkin_clients.CheckinClient",
    "clients.checkin.CheckinGaussianClient": "clients.checkin_clients.CheckinGaussianClient",
    "clients.client_level.ClientLevelDPFedAvg": (
        "clients.client_level_dpfedavg.ClientLevelDPFedAvg"
    ),
    "strategies.checkin.CheckinStrategy": "strategies.checkin_server.CheckinStrategy",
    "fedpriv.aggregation.IdealAggregator": "fedpriv.run.aggregation.IdealAggregator",
    "fedpriv.accounting.batch_clipping.BatchClippingSpec": (
        "fedpriv.accounting.batch_clipping.spec.BatchClippingSpec"
    ),
    "fedpriv.accounting.checkin_spec.CheckinSpec": "fedpriv.accounting.checkin.spec.CheckinSpec",
    "fedpriv.accounting.checkin_gaussian.CheckinGaussianSpec": (
        "fedpriv.accounting.checkin.gaussian.CheckinGaussianSpec"
    ),
    "fedpriv.accounting.client_level.ClientLevelSpec": (
        "fedpriv.accounting.client_level.spec.ClientLevelSpec"
    ),
    "fedpriv.accounting.client_skellam.ClientLevelSkellamSpec": (
        "fedpriv.accounting.client_level.skellam.ClientLevelSkellamSpec"
    ),
    "fedpriv.accounting.ftrl.FTRLSpec": "fedpriv.accounting.ftrl.spec.FTRLSpec",
}


def renamed_key(key: str, family: str | None = None) -> Renamed | None:
    """The rename entry of a dotted config ``key`` (for privacy ``family``; ``None``: any
    family); ``None`` when the key was not renamed."""
    return next(
        (
            r
            for r in RENAMED_KEYS
            if r.old == key and family in (None, r.family) or (r.old == key and not r.family)
        ),
        None,
    )


def check_argv(argv: list[str]) -> None:
    """Refuse a command-line override that uses an old key or an old ``_target_``.

    Raises
    ------
    ConfigError
        ``privacy.max_grad_norm=2 was renamed ...: use privacy.clipping_norm``.
    """
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep:
            continue
        entry = renamed_key(key)
        if entry is not None and not entry.family:
            raise entry.error(value)
        if key.endswith("._target_") and value in MOVED_TARGETS:
            raise moved_target_error(key, value)


def moved_target_error(key: str, old: str) -> ConfigError:
    """The one-line refusal of a ``_target_`` that names a moved class."""
    return ConfigError(key, old, f"moved: use {MOVED_TARGETS[old]} (docs/migration.md)")


def check_migrated(node: Mapping[str, Any]) -> None:
    """Refuse a composed config (e.g. a user's experiment file) holding an old key or an old
    ``_target_`` of a plug-in group.

    Raises
    ------
    ConfigError
        Naming the old key and its new name.
    """
    family = _family_of(node.get("privacy"))
    for entry in RENAMED_KEYS:
        group, _, key = entry.old.partition(".")
        sub = node.get(group)
        if isinstance(sub, Mapping) and key in sub and entry.family in ("", family):
            raise entry.error(sub[key])
    for group in ("client", "strategy", "aggregator", "privacy"):
        sub = node.get(group)
        if isinstance(sub, Mapping) and str(sub.get("_target_")) in MOVED_TARGETS:
            raise moved_target_error(f"{group}._target_", str(sub["_target_"]))


def _family_of(node: Any) -> str:
    """The family of a privacy node (its ``_target_`` class's ``family``; '' if unknown)."""
    from hydra.utils import get_class

    if not isinstance(node, Mapping):
        return ""
    try:
        cls = get_class(str(node.get("_target_")))
    except Exception:  # an unknown target is reported when the spec is built
        return ""
    return cls.family if isinstance(cls, type) and issubclass(cls, PrivacySpec) else ""
