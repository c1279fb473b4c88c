"""``fedpriv resume=RUN_DIR``: whether a run directory can continue, and the config it
continues with (its own ``config_resolved.yaml``, σ as calibrated then; only the overrides of
:data:`RESUMABLE_KEYS` may change). The checkpoint itself is :mod:`fedpriv.run.checkpoint`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedpriv.common.errors import ConfigError, check
from fedpriv.run.checkpoint import LOCK_NAME, load, run_status
from fedpriv.run.strategy import Strategy

#: Overrides ``resume`` accepts: they do not change what the rounds compute. ``num_rounds``
#: may extend (or shorten) the run; the others change only what is shown or saved.
RESUMABLE_KEYS = ("num_rounds", "progress", "plot", "save_model", "round_timeout")


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    """``["num_rounds=12", "+x=1"]`` -> ``{"num_rounds": "12", "x": "1"}`` (Hydra's prefixes
    ``+``, ``++``, ``~`` dropped; ``resume`` and ``hydra.*`` left out)."""
    out: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        key = key.lstrip("+~")
        if key == "resume" or key.startswith("hydra.") or key == "hydra":
            continue
        out[key] = value
    return out


#: The shipped strategies that write checkpoints (for the refusal's message).
RESUMABLE_STRATEGIES = ("strategy=fedavg", "strategy=async_fedavg")


def _strategy_target(run_dir: Path) -> str:
    from omegaconf import OmegaConf

    try:
        saved = OmegaConf.load(Path(run_dir) / "config_resolved.yaml")
        return str(OmegaConf.select(saved, "strategy._target_", default="") or "")
    except Exception:
        return ""


def strategy_resumable(target: str) -> bool:
    """Whether the strategy class named ``target`` declares ``resumable = True`` (an unknown
    or unimportable target counts as resumable here: building it reports the real error)."""
    from hydra.utils import get_class

    try:
        cls = get_class(target)
    except Exception:
        return True
    return not (isinstance(cls, type) and issubclass(cls, Strategy)) or cls.resumable


def not_resumable(run_dir: str, strategy: str) -> ConfigError:
    """The refusal of ``resume=RUN_DIR`` for a strategy that writes no checkpoint."""
    return ConfigError(
        "resume",
        run_dir,
        f"cannot be continued: strategy {strategy} writes no checkpoint "
        f"(resume supports {', '.join(RESUMABLE_STRATEGIES)})",
    )


def check_resumable(run_dir: Path, overrides: list[str]) -> None:
    """Refuse (one line) a ``resume=RUN_DIR`` that cannot continue.

    Raises
    ------
    ConfigError
        If ``run_dir`` is missing, has no ``config_resolved.yaml`` or checkpoint, or is
        ``complete`` while ``num_rounds`` is not raised above its rounds.
    """
    run_dir = Path(run_dir)
    check(run_dir.is_dir(), "resume", str(run_dir), "is not a directory")
    check(
        (run_dir / "config_resolved.yaml").is_file() or not (run_dir / LOCK_NAME).is_file(),
        "resume",
        str(run_dir),
        "stopped during start-up, before its first checkpoint: nothing to continue; start "
        "the run again",
    )
    check(
        (run_dir / "config_resolved.yaml").is_file(),
        "resume",
        str(run_dir),
        "has no config_resolved.yaml: not a fedpriv run directory",
    )
    target = _strategy_target(run_dir)
    if not strategy_resumable(target):
        raise not_resumable(str(run_dir), target)
    ckpt = load(run_dir)
    if run_status(run_dir) == "complete":
        given = parse_overrides(overrides).get("num_rounds")
        more = given is not None and given.isdigit() and int(given) > ckpt.round
        check(
            more,
            "resume",
            str(run_dir),
            f"is complete ({ckpt.round} rounds): nothing to continue; give num_rounds=M "
            f"with M > {ckpt.round} to extend it",
        )


def resume_config(run_dir: Path, overrides: list[str]) -> Any:
    """The config to continue ``run_dir`` with: its ``config_resolved.yaml`` plus the
    ``overrides`` of :data:`RESUMABLE_KEYS` (any other override must leave its value as saved),
    ``resume`` set to ``run_dir``.

    Raises
    ------
    ConfigError
        From :func:`check_resumable`, or ``resume=DIR cannot change KEY ...`` for an override
        that would change the run.
    """
    from omegaconf import DictConfig, OmegaConf

    run_dir = Path(run_dir)
    check_resumable(run_dir, overrides)
    saved = OmegaConf.load(run_dir / "config_resolved.yaml")
    check(
        isinstance(saved, DictConfig),
        "resume",
        str(run_dir),
        "has a config_resolved.yaml that is not a mapping",
    )
    assert isinstance(saved, DictConfig)
    planned = int(saved.num_rounds)
    for key, value in parse_overrides(overrides).items():
        parsed = OmegaConf.from_dotlist([f"{key}={value}"])
        new = OmegaConf.select(parsed, key)
        if key in RESUMABLE_KEYS:
            OmegaConf.update(saved, key, new, merge=False)
            continue
        old = OmegaConf.select(saved, key, default="<unset>")
        old_plain = OmegaConf.to_container(old) if OmegaConf.is_config(old) else old
        check(
            old_plain == new or str(old_plain) == str(new),
            "resume",
            str(run_dir),
            f"cannot change {key} (saved {old_plain!r}, given {new!r}): a resumed run keeps "
            f"its config; only {', '.join(RESUMABLE_KEYS)} may be given",
        )
    privacy = saved.get("privacy")
    if privacy is not None and privacy.get("calibrated_from_target_epsilon") is not None:
        privacy.target_epsilon = None  # keep the calibrated σ; never calibrate again
    saved.resume = str(run_dir)
    check(int(saved.num_rounds) >= 1, "num_rounds", saved.num_rounds, "must be >= 1")
    _check_horizon(saved, planned, run_dir)
    done = load(run_dir).round
    check(
        int(saved.num_rounds) >= done,
        "num_rounds",
        saved.num_rounds,
        f"must be >= the {done} rounds {run_dir} has already run",
    )
    return saved


def _check_horizon(saved: Any, planned: int, run_dir: Path) -> None:
    """Refuse a new ``num_rounds`` for a privacy family whose mechanism is built for the run's
    rounds (:attr:`PrivacySpec.fixed_horizon`: correlated noise factorizes the n-round
    workload; rows of two factorizations are not one accounted mechanism)."""
    from fedpriv.accounting.core.privacy_spec import PrivacySpec
    from fedpriv.common.targets import target_class

    node = saved.get("privacy")
    if node is None or int(saved.num_rounds) == planned:
        return
    cls = target_class(node, "privacy", PrivacySpec)
    check(
        not cls.fixed_horizon,
        "resume",
        str(run_dir),
        f"cannot change num_rounds (saved {planned}, given {saved.num_rounds}) with "
        f"privacy={cls.family}: its noise is a factorization built for {planned} rounds, and "
        "rows of two factorizations are not the mechanism that is accounted; start a new run",
    )
