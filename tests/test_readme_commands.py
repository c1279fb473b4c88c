"""Every command of the README runs as written from the project root, or parses (issue 23,
item 9: the README's audit and resume commands used a bare ``fedpriv`` and failed with
"command not found").

The commands are the lines of the README's ```bash blocks (``\\`` continuations joined,
comments dropped, ``$VARS`` expanded). Each must have one of these forms:

- ``make TARGET [VAR=VALUE ...]``: TARGET is a target of the Makefile, VAR a variable it uses;
  ``ARGS=...`` is checked as a ``.venv/bin/fedpriv`` command line;
- ``.venv/bin/fedpriv ARGS``: no old key or moved class (``check_argv``), a run directory path
  that can be one, then the config composed exactly as the command line composes it
  (``compose_config``: config groups, ``+experiment=``; a sweep's ``-m`` dropped and each comma
  list cut to its first value), with no key outside the schema (``check_known_keys``) and no old
  spelling in it (``check_migrated``); ``--help`` prints the help; ``resume=DIR`` may come only
  with the keys a resume may change;
- ``.venv/bin/fedpriv-account ANALYSIS ...``: run (every analysis the README shows is fast);
- ``.venv/bin/fedpriv-report DIR`` and ``.venv/bin/python scripts/X.py ARGS``: the script
  exists and its argparse parser accepts ARGS (the parser is stopped right after parsing, so
  nothing runs);
- ``.venv/bin/python -m pytest PATHS``: the test files exist; ``-m MODULE``: it imports;
- anything else only if :data:`NOT_RUN` lists its program with the reason.

A bare ``fedpriv`` (or ``fedpriv-account``, ``python``, ...) anywhere in a README code block
fails: copy-paste from the project root must work.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAKEFILE = REPO / "Makefile"

#: Programs a README command may start with that the test does not run, and why.
NOT_RUN: dict[str, str] = {
    ".venv/bin/ray": "starts or stops a Ray cluster on the machine: an outside process the test "
    "must not start (tests/test_sweep.py starts its own two-node cluster)",
}
#: Programs that must be called through .venv/bin from the project root.
BARE = ("fedpriv", "fedpriv-account", "fedpriv-report", "python", "python3", "pytest", "ray")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """``[(language, body)]`` of the fenced code blocks of ``text``."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def commands(text: str) -> list[str]:
    """The commands of the ```bash blocks of ``text``: continuation lines joined."""
    out = []
    for language, body in code_blocks(text):
        if language != "bash":
            continue
        joined = re.sub(r"\\\n\s*", " ", body)
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(" ".join(shlex.quote(w) for w in words))
    return out


def words_of(command: str) -> list[str]:
    """The command's words, ``$VARS`` expanded, leading ``VAR=value`` assignments dropped."""
    words = [os.path.expandvars(w) for w in shlex.split(command)]
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    return words


COMMANDS = list(dict.fromkeys(commands(README.read_text())))


def test_the_readme_has_commands() -> None:
    programs = {words_of(c)[0] for c in COMMANDS}
    assert {"make", ".venv/bin/fedpriv", ".venv/bin/fedpriv-account"} <= programs


def test_the_extraction_joins_continuations_and_drops_comments() -> None:
    text = "```bash\n.venv/bin/fedpriv a=1 \\\n    b=2   # why\n# only a comment\n```\n"
    assert commands(text) == [".venv/bin/fedpriv a=1 b=2"]
    assert commands("```text\n.venv/bin/fedpriv x=1\n```\n") == []


def test_no_readme_code_block_uses_a_bare_program() -> None:
    """Item 9: ``fedpriv audit=canaries`` copied from the README gave "command not found"."""
    bare = []
    for _, body in code_blocks(README.read_text()):
        for line in body.splitlines():
            first = line.strip().removeprefix("$").strip().split(" ", 1)[0]
            if first in BARE:
                bare.append(line.strip())
    assert bare == [], "use .venv/bin/PROGRAM (copy-paste from the project root must work)"


# --------------------------------------------------------------------------- each form


def makefile_targets() -> set[str]:
    text = MAKEFILE.read_text()
    return {
        t
        for t in re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.M)
        if not t.startswith(".")
    }


def makefile_variables() -> set[str]:
    text = MAKEFILE.read_text()
    return set(re.findall(r"\$\((\w+)\)", text)) | set(
        re.findall(r"^(\w+)\s*[?:]?=", text, flags=re.M)
    )


def check_make(args: list[str]) -> None:
    targets, variables = makefile_targets(), makefile_variables()
    goals = [a for a in args if "=" not in a]
    assert goals, "make without a target"
    assert sorted(set(goals) - targets) == [], f"not a Makefile target (targets: {targets})"
    for assignment in (a for a in args if "=" in a):
        name, _, value = assignment.partition("=")
        assert name in variables, f"{name} is not a variable of the Makefile"
        if name == "ARGS":  # make run ARGS="...": the fedpriv command line
            check_fedpriv(shlex.split(value))


def fedpriv_overrides(args: list[str]) -> list[str]:
    """The overrides a (sweep) command line composes for its first job."""
    overrides = []
    for arg in args:
        if arg in ("-m", "--multirun"):
            continue
        if arg.lstrip("+~").startswith("hydra."):  # Hydra's own settings (run / sweep dir)
            continue
        key, sep, value = arg.partition("=")
        if sep and "," in value and not value.startswith(("[", "{", "'", '"')):
            value = value.split(",")[0]  # a sweep's first value
        overrides.append(f"{key}{sep}{value}")
    return overrides


def check_fedpriv(args: list[str]) -> None:
    from fedpriv.cli.experiment import check_run_dirs
    from fedpriv.run.config import check_known_keys, compose_config, to_container
    from fedpriv.run.migration import check_argv, check_migrated
    from fedpriv.run.resume import RESUMABLE_KEYS

    assert "..." not in args, "a README command must run as written (no '...')"
    if any(a in ("-h", "--help") for a in args):
        from fedpriv.cli.help import print_help

        assert "Fields, defaults" in print_help([a for a in args if a not in ("-h", "--help")])
        return
    check_argv(args)
    check_run_dirs(args)
    resume = [a for a in args if a.lstrip("+").startswith("resume=")]
    if resume:
        assert resume[-1].split("=", 1)[1], "resume= must name a run directory"
        others = {a.lstrip("+").split("=", 1)[0] for a in args if a not in resume}
        assert others <= set(RESUMABLE_KEYS), f"resume takes only {RESUMABLE_KEYS}"
        return
    cfg = compose_config(fedpriv_overrides(args))
    check_known_keys(cfg)
    check_migrated(to_container(cfg))


def check_account(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from fedpriv.cli.account import main

    status = main(args)
    out = capsys.readouterr()
    assert status == 0, out.err


class _Parsed(Exception):
    """Raised by the patched ``parse_args`` once a script's own parser accepted its words."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = namespace


def parsed_args(
    script: Path, args: list[str], monkeypatch: pytest.MonkeyPatch, main: object = None
) -> argparse.Namespace:
    """``args`` parsed by the argparse parser ``script`` builds; nothing after the parse runs.

    Raises
    ------
    AssertionError
        If the parser refuses ``args`` (argparse exits 2) or the script parses nothing.
    """
    real = argparse.ArgumentParser.parse_args

    def stop_after_parsing(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        raise _Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    try:
        if callable(main):
            main()
        else:
            runpy.run_path(str(script), run_name="__main__")
    except _Parsed as done:
        return done.namespace
    except SystemExit as exc:
        raise AssertionError(f"{script.name} refused {args} (exit {exc.code})") from None
    raise AssertionError(f"{script.name} parsed no arguments")


def check_python(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    if args[:1] == ["-m"]:
        module, rest = args[1], args[2:]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
        if module == "pytest":
            paths = [a.split("::")[0] for a in rest if not a.startswith("-")]
            assert paths, "pytest without a test path"
            missing = [p for p in paths if not (REPO / p).exists()]
            assert missing == []
        return
    script = REPO / args[0]
    assert script.is_file(), f"no script {args[0]}"
    if "argparse" in script.read_text():
        parsed_args(script, args[1:], monkeypatch)
    else:
        assert args[1:] == [], f"{args[0]} takes no arguments"


def check_report(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from fedpriv.report import sweep_report

    namespace = parsed_args(Path(sweep_report.__file__), args, monkeypatch, main=sweep_report.main)
    assert namespace.sweep_dir


@pytest.mark.parametrize("command", COMMANDS, ids=[c[:72] for c in COMMANDS])
def test_readme_command_runs_or_parses(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    program, *args = words_of(command)
    if program == "make":
        check_make(args)
    elif program == ".venv/bin/fedpriv":
        check_fedpriv(args)
    elif program == ".venv/bin/fedpriv-account":
        check_account(args, capsys)
    elif program == ".venv/bin/fedpriv-report":
        check_report(args, monkeypatch)
    elif program == ".venv/bin/python":
        check_python(args, monkeypatch)
    else:
        assert program in NOT_RUN, (
            f"{program}: a README command must start with make, .venv/bin/fedpriv, "
            ".venv/bin/fedpriv-account, .venv/bin/fedpriv-report or .venv/bin/python (or be "
            "listed in NOT_RUN with the reason)"
        )


def test_a_bad_command_fails_its_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks are not vacuous: a wrong key, target or script argument is caught."""
    from fedpriv.common.errors import ConfigError

    with pytest.raises(ConfigError):
        check_fedpriv(["+foo=1"])
    with pytest.raises(AssertionError):
        check_make(["no-such-target"])
    with pytest.raises(AssertionError):
        check_python(["scripts/local_vs_distributed.py", "--no-such-flag"], monkeypatch)
