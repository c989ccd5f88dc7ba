"""A genaug service with what the CLI has no flag for: the benchmarks' child entry point.

:func:`bench.services.start_child` runs it for a truly batched tiny pipeline
(``--batch-invariant false``: the default tiny pipeline runs its modules per image, so it
cannot show batching gains) or a worker wrapped by a benchmark's function (``--wrap
module:name``, ``bench.service.mixed_guidance:per_guidance`` emulating the old denoising).
Every other flag is a setting, as ``python -m genaug.service`` takes it::

    python -m bench.serve --port 8123 --batch-invariant false --max-batch-images 16

It serves ``create_app`` with that model until SIGTERM or SIGINT (the parent stops it).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from bench.services import tiny_model


def main(argv: Sequence[str] | None = None) -> int:
    from genaug.service.settings import Settings, configure_logging
    from genaug.service.testing import start_service

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--batch-invariant", choices=["true", "false"], default="true")
    parser.add_argument("--wrap", default=None, help="module:function that wraps the worker")
    known, rest = parser.parse_known_args(argv)
    overrides: dict[str, Any] = {}
    it = iter(rest)
    for flag in it:
        overrides[flag.removeprefix("--").replace("-", "_")] = next(it)
    settings = Settings(**overrides)
    configure_logging(settings.log_level)
    wrap = None
    if known.wrap is not None:
        module, _, name = known.wrap.partition(":")
        wrap = getattr(importlib.import_module(module), name)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    model = tiny_model(batch_invariant=known.batch_invariant == "true")
    with start_service(model, wrap=wrap, record=False, settings=settings, ready_timeout=180.0):
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
