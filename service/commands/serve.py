"""Run the service under uvicorn: ``genaug serve`` and ``python -m genaug.service``."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

from pydantic import ValidationError

log = logging.getLogger(__name__)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def serve(overrides: dict[str, Any] | None = None) -> int:
    """Start the service with ``GENAUG_*`` settings plus ``overrides``; return an exit code.

    Start-up problems (a wrong device, a missing model path, an invalid setting) print one
    clear line and exit 2 before anything listens.
    """
    from ..pool.open import open_pool_store
    from ..pool.types import PoolError
    from ..recipes.spec import RecipeError
    from ..settings import Settings

    try:
        settings = Settings(**(overrides or {}))
    except ValidationError as exc:
        print(f"genaug serve: invalid settings:\n{exc}", file=sys.stderr)  # noqa: T201
        return 2
    configure_logging(settings.log_level)
    failures: list[BaseException] = []

    def fatal(exc: BaseException) -> None:
        from ..app import is_refusal

        failures.append(exc)
        if is_refusal(exc):  # one line that names the fix, as the refusals before listening
            print(f"genaug serve: {exc}", file=sys.stderr)  # noqa: T201
        else:
            log.error("stopping: the model could not be loaded (%s)", exc)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        if settings.recipes is not None:
            # Reachable, credentials, schema version: checked first, so that a wrong pool URL
            # fails in a second, before torch and the model's libraries load.
            open_pool_store(settings).close()
    except PoolError as exc:
        print(f"genaug serve: {exc}", file=sys.stderr)  # noqa: T201
        return 2

    import uvicorn

    from ..app import check_startup, create_app
    from ..pipeline.load import ModelLoadError

    try:
        check_startup(settings)
        app = create_app(settings, on_fatal=fatal)
    except (ModelLoadError, RecipeError, PoolError) as exc:
        print(f"genaug serve: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=10,
        access_log=False,
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler it found; make that handler exit with a code that says how it went.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(1 if failures else 0))
    server.run()
    return 1 if failures or not server.started else 0
