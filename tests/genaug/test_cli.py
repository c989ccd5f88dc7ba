"""The command contract: every ``genaug`` subcommand is one module of one shape (a docstring
whose first line is its help, ``add_arguments``, ``run``), named straight by its line in
:data:`genaug.cli.COMMANDS` with its help and its extra; ``genaug --help`` shows exactly that
table without importing any command module, torch, TensorFlow or numpy, and a missing extra
is one line."""

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

ROOT = Path(__file__).resolve().parents[2]


def test_no_forwarders_the_table_names_each_command_module() -> None:
    assert not (ROOT / "genaug" / "commands").exists(), "genaug/commands/ is gone"
    assert len({entry.module for entry in COMMANDS.values()}) == len(COMMANDS)
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert all(entry.extra in extras for entry in COMMANDS.values())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_the_contract(name: str) -> None:
    module = importlib.import_module(COMMANDS[name].module)
    line = help_line(module)
    assert line and "\n" not in line and len(line) <= 90, f"{name}: one-line help {line!r}"
    assert module.__doc__ is not None and module.__doc__.startswith(line)
    assert COMMANDS[name].help == line, f"{name}: the table's help is not its docstring's"
    for function, parameter in (("add_arguments", "parser"), ("run", "args")):
        fn = getattr(module, function, None)
        assert callable(fn), f"{name} has no {function}()"
        assert fn.__module__ == module.__name__, f"{name}.{function} is a forwarded name"
        # one positional parameter; keyword-only ones with defaults are for tests to inject
        parameters = inspect.signature(fn).parameters.values()
        positional = [p.name for p in parameters if p.kind is not p.KEYWORD_ONLY]
        assert positional == [parameter], f"{name}.{function}{inspect.signature(fn)}"
        assert all(p.default is not p.empty for p in parameters if p.kind is p.KEYWORD_ONLY)
    assert inspect.signature(module.run).return_annotation in (int, "int")


def _help(argv: list[str]) -> dict[str, object]:
    """``genaug ARGV`` (a help) in a fresh interpreter: its output, the heavy modules loaded
    and the command modules imported."""
    code = ("import contextlib, io, json, sys\n"
            "from genaug.cli import COMMANDS, main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
            f"    main({argv!r})\n"
            "loaded = [m for m in ('torch', 'tensorflow', 'numpy') if m in sys.modules]\n"
            "commands = [n for n, e in COMMANDS.items() if e.module in sys.modules]\n"
            "print(json.dumps({'out': out.getvalue(), 'loaded': loaded,"
            " 'commands': commands}))\n")
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_help_lists_the_table_and_imports_no_command_nor_anything_heavy() -> None:
    result = _help(["--help"])
    assert result["loaded"] == [] and result["commands"] == []
    out = str(result["out"])
    listed = dict(re.findall(r"^    (\S+)\s{2,}(\S.*)$", out, flags=re.M))
    listed.update(re.findall(r"^    (\S+)\n\s{10,}(\S.*)$", out, flags=re.M))  # long names
    assert list(listed) == list(COMMANDS), "--help and the table disagree"
    assert {name: entry.help for name, entry in COMMANDS.items()} == listed


#: What a command's ``--help`` may import of torch, TensorFlow and numpy: nothing, except
#: serve's flags, read off the Settings fields, whose module imports the batching vocabulary
#: (numpy) for the scheduler names.
HELP_MAY_LOAD: dict[str, list[str]] = {}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_commands_help_imports_only_its_own_module_and_nothing_heavy(command: str) -> None:
    result = _help([command, "--help"])
    assert f"usage: genaug {command}" in str(result["out"])
    assert result["commands"] == [command]
    assert result["loaded"] == HELP_MAY_LOAD.get(command, [])


def _genaug_without(blocked: list[str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``genaug ARGV`` in a fresh interpreter where importing ``blocked`` fails, as it does
    where the package is not installed."""
    code = ("import sys\n"
            f"for name in {blocked!r}:\n"
            "    sys.modules[name] = None  # import raises ImportError naming it\n"
            "from genaug.cli import main\n"
            f"sys.exit(main({argv!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize(("blocked", "argv", "extra"), [
    ("pydantic_settings", ["serve", "--help"], "service"),  # while adding the flags
    ("httpx", ["doctor", "--url", "http://127.0.0.1:9", "--json"], "client"),  # in run
])
def test_a_missing_extra_is_one_line_with_status_2(blocked: str, argv: list[str],
                                                   extra: str) -> None:
    done = _genaug_without([blocked], argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"genaug {argv[0]} needs the {extra} extras: pip install "
                                  f"'genaug[{extra}]' (")
    assert blocked in done.stderr and done.stderr.count("\n") == 1 and done.stdout == ""


def test_a_genaug_module_that_fails_to_import_is_a_bug_not_a_missing_extra() -> None:
    done = _genaug_without(["genaug.service.commands._pool_args"], ["pool", "list"])
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "needs the" not in done.stderr
    assert "genaug.service.commands._pool_args" in done.stderr.splitlines()[-1]


def test_only_the_command_that_runs_gets_its_flags() -> None:
    args = build_parser("export").parse_args(["export", "--recipe", "r", "--out", "o"])
    assert (args.command, args.recipe, args.out, args.pool) == ("export", "r", "o", None)
    with pytest.raises(SystemExit):  # export's flags were not added for `pool`
        build_parser("pool").parse_args(["export", "--recipe", "r", "--out", "o"])


def test_serve_overrides_only_the_flags_given(monkeypatch: pytest.MonkeyPatch) -> None:
    import genaug.service.commands.serve as library

    seen: list[dict[str, object]] = []
    monkeypatch.setattr(library, "serve",
                        lambda overrides, **options: seen.append(overrides) or 0)
    from genaug.cli import main

    assert main(["serve", "--port", "9", "--lora", "a=x", "--lora", "b=y"]) == 0
    assert seen == [{"port": "9", "loras": "a=x,b=y"}]


def test_ctrl_c_in_any_command_ends_in_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one place for every command: KeyboardInterrupt out of ``run`` is one line naming
    the command and what it leaves (its module's ``interrupted(args)``), never a traceback.
    The processes themselves are interrupted in tests/genaug/test_interrupt.py."""
    import genaug.trainer.reference.command as train

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

    import genaug.service.commands.pregenerate as pregenerate

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
