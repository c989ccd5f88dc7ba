"""The command contract: every ``genaug`` subcommand is a module of :mod:`genaug.commands`
with one shape (a docstring whose first line is its help, ``add_arguments``, ``run``), listed
once in :data:`genaug.cli.COMMANDS`; ``genaug --help`` shows exactly that table, one line per
command, without importing torch or TensorFlow."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genaug.cli import COMMANDS, build_parser, help_line

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_of_the_commands_room_is_in_the_table() -> None:
    modules = {f"genaug.commands.{p.stem}" for p in (ROOT / "genaug" / "commands").glob("*.py")
               if p.stem != "__init__"}
    assert modules == set(COMMANDS.values())
    assert all(path.endswith(name.replace("-", "_")) for name, path in COMMANDS.items())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_the_contract(name: str) -> None:
    module = importlib.import_module(COMMANDS[name])
    line = help_line(module)
    assert line and "\n" not in line and len(line) <= 90, f"{name}: one-line help {line!r}"
    assert module.__doc__ is not None and module.__doc__.startswith(line)
    for function, parameter in (("add_arguments", "parser"), ("run", "args")):
        fn = getattr(module, function, None)
        assert callable(fn), f"{name} has no {function}()"
        signature = inspect.signature(fn)
        assert list(signature.parameters) == [parameter], f"{name}.{function}{signature}"
    assert inspect.signature(module.run).return_annotation in (int, "int")


def _help(argv: list[str]) -> dict[str, object]:
    """``genaug ARGV`` (a help) in a fresh interpreter: its output and the heavy modules loaded."""
    code = ("import contextlib, io, json, sys\n"
            "from genaug.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
            f"    main({argv!r})\n"
            "loaded = [m for m in ('torch', 'tensorflow') if m in sys.modules]\n"
            "print(json.dumps({'out': out.getvalue(), 'loaded': loaded}))\n")
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_help_lists_the_table_one_line_each_and_imports_neither_torch_nor_tensorflow() -> None:
    result = _help(["--help"])
    assert result["loaded"] == []
    out = str(result["out"])
    listed = dict(re.findall(r"^    (\S+)\s{2,}(\S.*)$", out, flags=re.M))
    assert list(listed) == list(COMMANDS), "--help and the table disagree"
    for name, path in COMMANDS.items():
        assert listed[name] == help_line(importlib.import_module(path))


@pytest.mark.parametrize(("command", "never"), [("serve", "tensorflow"), ("train", "torch"),
                                                ("doctor", "torch"), ("pool", "torch")])
def test_a_commands_help_loads_only_its_side(command: str, never: str) -> None:
    result = _help([command, "--help"])
    assert f"usage: genaug {command}" in str(result["out"])
    assert never not in result["loaded"]  # type: ignore[operator]


def test_only_the_command_that_runs_gets_its_flags() -> None:
    args = build_parser("export").parse_args(["export", "--recipe", "r", "--out", "o"])
    assert (args.command, args.recipe, args.out, args.pool) == ("export", "r", "o", None)
    with pytest.raises(SystemExit):  # export's flags were not added for `pool`
        build_parser("pool").parse_args(["export", "--recipe", "r", "--out", "o"])


def test_serve_overrides_only_the_flags_given(monkeypatch: pytest.MonkeyPatch) -> None:
    import genaug.service.commands.serve as library

    seen: list[dict[str, object]] = []
    monkeypatch.setattr(library, "serve", lambda overrides: seen.append(overrides) or 0)
    from genaug.cli import main

    assert main(["serve", "--port", "9", "--lora", "a=x", "--lora", "b=y"]) == 0
    assert seen == [{"port": "9", "loras": "a=x,b=y"}]


def test_ctrl_c_in_any_command_ends_in_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one place for every command: KeyboardInterrupt out of ``run`` is one line naming
    the command and what it leaves (its module's ``interrupted(args)``), never a traceback.
    The processes themselves are interrupted in tests/test_interrupt.py."""
    import genaug.commands.train as train

    def run(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run", run)
    from genaug.cli import main

    assert main(["train", "--epochs", "1"]) == 130
    err = capsys.readouterr().err
    assert err == ("genaug train: interrupted; nothing is saved (the reference trainer keeps no "
                   "checkpoint); run it again\n")


def test_sigterm_runs_the_same_cleanup_and_ends_in_one_line_with_143(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real SIGTERM while a command runs raises where the command is (so its ``finally``
    blocks stop its children), ends in one line with 143, and the caller's handler is back."""
    import signal

    import genaug.commands.pregenerate as pregenerate

    cleaned: list[str] = []

    def run(args: object) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises during this sleep
            return 0
        finally:
            cleaned.append("children stopped")

    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        monkeypatch.setattr(pregenerate, "run", run)
        from genaug.cli import main

        code = main(["pregenerate", "--recipe", "digits", "--per-label", "1"])
        restored = signal.getsignal(signal.SIGTERM)
    finally:
        handler = signal.signal(signal.SIGTERM, previous)
    assert code == 143 and cleaned == ["children stopped"] and received == []
    assert restored is handler  # this test's own handler, back after main
    assert capsys.readouterr().err == (
        "genaug pregenerate: terminated (SIGTERM); every batch stored before the interrupt is "
        "kept; run the same command again to resume\n")
