"""``fedpriv``: the Hydra command line. ``fedpriv num_rounds=5 privacy.noise_multiplier=1.2``.

A bad value stops with one line naming the field, the value and the allowed range (exit
code 2), before anything is trained or written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fedpriv.cli.help import print_help as help_text
from fedpriv.cli.quick_exit import run_then_exit
from fedpriv.common.errors import ConfigError, check
from fedpriv.run.config import (
    check_known_keys,
    check_option,
    compose_config,
    conf_dir,
    is_schema_option,
    register_schema,
    unknown_privacy_key,
)
from fedpriv.run.migration import check_argv, renamed_key


def _main(cfg: DictConfig) -> float | None:
    from fedpriv.run.runner import RunAborted, StartupInterrupted, run_experiment

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:  # an internal schema node picked by a sweep (glob) or a config file
        for group, option in HydraConfig.get().runtime.choices.items():
            check_option(str(group), option)
    except ConfigError as exc:
        fail(exc)
    if (out_dir / "results.json").exists() and not cfg.get("resume"):
        print(
            f"fedpriv: error: hydra.run.dir={out_dir} already holds a run (results.json): "
            "choose another directory, or continue that run with resume=" + str(out_dir),
            file=sys.stderr,
        )
        sys.exit(2)
    try:
        if cfg.get("resume"):  # continue RUN_DIR in place with its own resolved config
            from fedpriv.run.resume import resume_config

            cfg = resume_config(Path(cfg.resume), list(HydraConfig.get().overrides.task))
            out_dir = Path(cfg.resume)
        with _warm_engine():
            summary = run_experiment(cfg, out_dir)
    except ConfigError as exc:
        print(f"fedpriv: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except StartupInterrupted as exc:  # before the first round: nothing trained or released
        print(
            f"fedpriv: stopped by {exc} during start-up, before the first round (nothing was "
            f"released); start the run again, {out_dir} holds no checkpoint",
            file=sys.stderr,
        )
        sys.stderr.flush()
        os._exit(128 + exc.signum)
    except RunAborted as exc:  # saved as "failed"; Flower's threads are not waited for
        print(f"fedpriv: run failed: {exc}; results.json says failed", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    except Exception as exc:  # the run dir keeps what was written, marked "failed"
        print(f"fedpriv: run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    ok = [r for r in summary["rounds"] if r.get("status") == "ok"]
    accuracy = None
    if ok:
        last = ok[-1]
        ema = f" ema_accuracy={last['ema_accuracy']:.4f}" if "ema_accuracy" in last else ""
        print(
            f"final: accuracy={last['accuracy']:.4f}{ema} epsilon={last['epsilon']:.3f} "
            f"(delta={summary['privacy']['delta']:g}) wall_time={summary['wall_time_s']:.1f}s"
        )
        accuracy = float(last["accuracy"])
    if summary["exit_code"]:
        print(f"fedpriv: run {summary['status']}: {summary['message']}", file=sys.stderr)
        sys.exit(summary["exit_code"])
    return accuracy


@contextlib.contextmanager
def _warm_engine() -> Iterator[None]:
    """In a local multirun (Hydra's basic launcher) the job may join the sweep's one Ray
    instance (:mod:`fedpriv.run.warm_engine`); otherwise nothing changes."""
    hydra_cfg = HydraConfig.get()
    launcher = str(hydra_cfg.launcher.get("_target_", ""))
    if hydra_cfg.mode != RunMode.MULTIRUN or not launcher.endswith(".BasicLauncher"):
        yield
        return
    from fedpriv.run.warm_engine import sweep_jobs

    with sweep_jobs():
        yield


def _one_line(exc: BaseException) -> str:
    """Hydra/OmegaConf errors as one line: the reason plus the ``full_key`` it names."""
    text = str(exc.__cause__ or exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
    skip = ("full_key:", "object_type", "reference_type")
    reason = next(
        (ln for ln in lines if not ln.startswith(skip) and not _composing_header(ln)),
        text,
    )
    if "Available options" in text:
        options = []
        for line in text.split("Available options", 1)[1].splitlines()[1:]:
            if not line.strip() or line.strip().startswith("Config search path"):
                break
            if not is_schema_option(line.strip()):  # internal schema nodes are no options
                options.append(line.strip())
        reason += "; available: " + ", ".join(options)
    return f"{key}: {reason}" if key else reason


def _composing_header(line: str) -> bool:
    """Hydra's ``In 'sampler/shuffle': ConfigKeyError raised while composing config:`` (the
    reason is on the next line)."""
    return line.startswith("In '") and line.endswith("raised while composing config:")


def precheck(argv: list[str]) -> None:
    """Compose the config once with the command's overrides and exit with one line (exit 2)
    if it would be refused: an old key (``docs/migration.md``), a value Hydra rejects (wrong
    type, unknown option), or a key outside the schema (``+foo=1``). Skipped for sweeps and
    Hydra flags (each job is checked when it starts)."""
    try:
        check_argv(argv)
        check_run_dirs(argv)
        check_group_choices(argv)
    except ConfigError as exc:
        fail(exc)
    if any(a.startswith("-") for a in argv) or any("," in a for a in argv):
        return
    overrides = [a for a in argv if not a.lstrip("+~").startswith("hydra")]
    try:
        cfg = compose_config(overrides)
    except Exception as exc:
        key = _failed_key(exc)
        renamed = renamed_key(key)
        given = [a.split("=", 1)[1] for a in argv if a.lstrip("+~").split("=")[0] == key]
        value = given[-1] if given else None
        if renamed:
            fail(renamed.error(value))
        fail(unknown_key_error(overrides, key, value) or _one_line(exc))
    try:
        check_known_keys(cfg)
    except ConfigError as exc:
        fail(exc)


def check_run_dirs(argv: list[str]) -> None:
    """Refuse a ``hydra.run.dir`` / ``hydra.sweep.dir`` that cannot be a directory (a file on
    its path) or cannot be created and written (``/proc/nope``, a read-only place) before
    Hydra tries to create it. The directory is made and written once to find out, then what
    the check made is removed again (the literal part before a ``${...}`` is checked).

    Raises
    ------
    ConfigError
        ``hydra.run.dir=README.md/run is not a directory path: README.md is a file``;
        ``hydra.run.dir='/proc/nope' cannot be created (No such file or directory: ...)``.
    """
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key not in RUN_DIR_KEYS or not value:
            continue
        literal, interpolated, _ = value.partition("${")
        path = Path(literal or ".")
        if interpolated and not literal.endswith("/"):
            path = path.parent  # the directory the interpolated name goes into
        for part in [path, *path.parents]:
            if part.exists() and not part.is_dir():
                raise ConfigError(key, value, f"is not a directory path: {part} is a file")
        problem = _cannot_write(path)
        if problem:
            raise ConfigError(
                key,
                value,
                f"cannot be created ({problem}): give a directory you can write, "
                f"e.g. {key}={RUN_DIR_KEYS[key]}",
            )


#: The run directory keys a command line may set, each with an example for the refusal.
RUN_DIR_KEYS = {"hydra.run.dir": "outputs/my-run", "hydra.sweep.dir": "multirun/my-sweep"}


def _cannot_write(path: Path) -> str:
    """Why a file cannot be written in the directory ``path`` ('' if it can): the directory
    (and its missing parents) is made and a file written in it, then both are removed."""
    made: list[Path] = []
    try:
        for part in [*reversed(path.parents), path]:
            if not part.is_dir():
                part.mkdir()
                made.append(part)
        fd, probe = tempfile.mkstemp(prefix=".fedpriv-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{exc.strerror or type(exc).__name__}: {exc.filename or path}"
    finally:
        for part in reversed(made):
            with contextlib.suppress(OSError):
                part.rmdir()
    return ""


def check_group_choices(argv: list[str]) -> None:
    """Refuse an internal schema node given as a group's option (``client=dpsgd_schema``),
    also in a sweep's list (``-m client=dpsgd,dpsgd_schema``).

    Raises
    ------
    ConfigError
        :func:`fedpriv.run.config.check_option`'s line, listing the group's options.
    """
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or "." in key or "/" in key:
            continue
        inner = re.sub(r"^\w+\((.*)\)$", r"\1", value.strip())  # choice(a,b), glob(...)
        for option in inner.split(","):
            if not any(c in option for c in "*?["):  # a glob's matches: checked per job
                check_option(key, option.strip().strip("'\""))


def unknown_key_error(overrides: list[str], key: str, value: str | None) -> ConfigError | None:
    """For an override of a ``privacy.KEY`` (or ``client.``, ``strategy.``, ``aggregator.``)
    that Hydra refused: the refusal naming the option's keys
    (:func:`fedpriv.run.config.unknown_privacy_key`, e.g. ``privacy.noise_multiplier`` with
    ``privacy=checkin``; ``client.augmult`` with ``client=batch_clipping``); ``None`` for any
    other failure."""
    group, _, name = key.partition(".")
    if group not in KEYED_GROUPS or not name or "." in name:
        return None
    rest = [o for o in overrides if o.lstrip("+~").split("=")[0] != key]
    try:
        cfg = compose_config(rest)
    except Exception:  # the other overrides fail too: Hydra's own line
        return None
    if group == "privacy":
        return unknown_privacy_key(cfg.get("privacy"), name, value)
    node = cfg.get(group)
    if not isinstance(node, DictConfig) or name in node:
        return None
    chosen = [o.split("=", 1)[1] for o in rest if o.lstrip("+~").split("=")[0] == group]
    option = f"{group}={chosen[-1]}" if chosen else f"the default {group}"
    known = ", ".join(sorted(str(k) for k in node if not str(k).startswith("_")))
    return ConfigError(key, value, f"is not a setting of {option} (its keys: {known})")


KEYED_GROUPS = ("privacy", "client", "strategy", "aggregator")
"""Config groups whose unknown keys are refused naming the chosen option and its keys."""


def fail(reason: object) -> NoReturn:
    """Print ``fedpriv: error: REASON`` and exit 2."""
    print(f"fedpriv: error: {reason}", file=sys.stderr)
    sys.exit(2)


def _failed_key(exc: BaseException) -> str:
    """The dotted key a Hydra composition error names ('' if none)."""
    text = str(exc.__cause__ or exc)
    for pattern in (r"full_key: (\S+)", r"override '([\w.]+)'", r"Key '(\w+)' not in '(\w+)'"):
        found = re.search(pattern, text)
        if found:
            return found.group(1)
    return ""


def resume_argv(argv: list[str]) -> list[str]:
    """``resume=RUN_DIR``: refuse (one line, exit 2) a directory that cannot continue, and
    point Hydra at it (``hydra.run.dir=RUN_DIR``, no new ``.hydra/``), so that the run's
    outputs and log stay in RUN_DIR; other arguments are returned unchanged."""
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("resume=")]
    if given and not given[-1].strip():
        print("fedpriv: error: resume='' must name a run directory", file=sys.stderr)
        sys.exit(2)
    if not given or given[-1] == "null":
        return argv
    from fedpriv.run.resume import resume_config

    run_dir = os.path.abspath(given[-1])
    try:
        check(
            not any(a in ("-m", "--multirun") or "," in a for a in argv),
            "resume",
            given[-1],
            "continues one run: give no sweep (-m, comma lists) with it",
        )
        resume_config(Path(run_dir), argv)  # every refusal before Hydra creates anything
    except ConfigError as exc:
        print(f"fedpriv: error: {exc}", file=sys.stderr)
        sys.exit(2)
    rest = [a for a in argv if not a.lstrip("+").startswith("resume=")]
    return [*rest, f"resume={run_dir}", f"hydra.run.dir={run_dir}", "hydra.output_subdir=null"]


def main() -> None:
    """Console-script entry point (a Hydra app over the repository's ``conf/`` tree).

    The working directory is put on ``sys.path`` so that ``_target_`` can name your own
    modules (as ``python -m`` would).
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        try:
            print(help_text(sys.argv[1:]))
            sys.stdout.flush()
        except BrokenPipeError:  # `fedpriv --help | head`: the reader has gone
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    register_schema()
    quiet_hydra_lookups()
    sys.argv[1:] = resume_argv(sys.argv[1:])
    precheck(sys.argv[1:])
    hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")(_main)()


def quiet_hydra_lookups() -> None:
    """Drop the ERROR line Hydra logs when a ``_target_`` cannot be imported
    (``hydra.utils.get_class``): fedpriv refuses that target in its own one line."""
    logging.getLogger("hydra.utils").addFilter(_not_a_lookup_error)


def _not_a_lookup_error(record: logging.LogRecord) -> bool:
    """``False`` for ``hydra.utils``' ``Error getting class/callable/object at ...`` records."""
    return not str(record.msg).startswith("Error getting ")


def console_main() -> NoReturn:
    """The ``fedpriv`` command: :func:`main`, then the process ends without the
    interpreter's slow module teardown (:mod:`fedpriv.cli.quick_exit`)."""
    run_then_exit(main)


if __name__ == "__main__":
    console_main()
