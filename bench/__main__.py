"""``python -m bench``: list the benchmarks, or run one by name (``python -m bench all``: the
service and pool ones in turn, as ``make bench`` does).

    python -m bench --help
    python -m bench NAME [ITS ARGUMENTS]       # python -m bench NAME --help: its own
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Sequence

from bench.harness import catalogue, families, find, main
from bench.run_all import BENCHMARKS


def usage() -> str:
    entries = catalogue()
    width = max(len(e.name) for e in entries) + 2
    lines = [
        "usage: python -m bench NAME [ARGUMENTS]    (from the repository root)",
        "       python -m bench NAME --help         its arguments",
        "       python -m bench all [--quick] [--only NAME ...] [--json FILE]",
        "",
        "Each benchmark is also `python -m bench.FAMILY.NAME`; every one takes --json FILE",
        "and returns the same dict from run(argv). * = in `all` (make bench).",
    ]
    for family, line in families().items():
        lines += ["", f"{family}/: {line}"]
        for e in (e for e in entries if e.family == family):
            mark = "*" if e.name in BENCHMARKS else " "
            text = textwrap.shorten(e.line, 108 - width, placeholder=" ...")
            lines.append(f"  {mark}{e.name:<{width}}{text}")
    return "\n".join(lines)


def dispatch(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], list(argv[1:])
    module = "bench.run_all" if name == "all" else None
    if module is None:
        try:
            module = find(name).module
        except KeyError:
            print(f"python -m bench: no benchmark {name!r}\n\n{usage()}", file=sys.stderr)
            return 2
    benchmark = importlib.import_module(module)
    sys.argv[0] = benchmark.__file__ or sys.argv[0]  # its usage line names it, not bench
    main(benchmark.run, rest)
    return 0


sys.exit(dispatch(sys.argv[1:]))
