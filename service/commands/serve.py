"""Run the generation service.

``genaug serve`` (and ``python -m genaug.service``, the same command) runs the service under
uvicorn. Every flag is also a ``GENAUG_*`` variable (one per
:class:`~genaug.service.settings.Settings` field); only the flags given on the command line
override. Settings, torch and the app are imported when the command runs (the flags read the
Settings fields, so ``genaug serve --help`` imports the settings, never torch).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per Settings field, and ``--lora NAME=PATH`` (repeatable)."""
    from ..settings import Settings

    for name, info in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = (info.description or "") + f" [GENAUG_{name.upper()}]"
        parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, help=help_text)
    parser.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                        help="a LoRA adapter a recipe or request may name; repeatable (adds to "
                             "--loras / GENAUG_LORAS)")
    parser.add_argument("--warm-only", action="store_true",
                        help="load, warm up (filling GENAUG_COMPILE_CACHE with what compiling "
                             "made) and exit, without listening: for an init container or a "
                             "CI step; exit status 0 once warmed and the compile cache holds "
                             "what compiling made, 1 if it kept nothing, 2 for a setting "
                             "refused at start (a compile cache that cannot be written "
                             "included)")


def run(args: argparse.Namespace) -> int:
    """``genaug serve``: the flags given, as overrides of the ``GENAUG_*`` settings."""
    overrides = {k: v for k, v in vars(args).items()
                 if k not in {"command", "lora", "warm_only"}}
    flags = {name: "--" + name.replace("_", "-") for name in overrides}
    loras = list(getattr(args, "lora", []))
    if loras:  # --lora a=x --lora b=y, together with --loras / GENAUG_LORAS if given
        overrides["loras"] = ",".join([*([overrides["loras"]] if "loras" in overrides else []),
                                       *loras])
        flags["loras"] = "--loras" if "loras" in flags else "--lora"
    return serve(overrides, warm_only=bool(getattr(args, "warm_only", False)), flags=flags)


def serve(overrides: dict[str, Any] | None = None, *, warm_only: bool = False,
          flags: dict[str, str] | None = None) -> int:
    """Start the service with ``GENAUG_*`` settings plus ``overrides``; return an exit code.
    ``flags`` names the command-line flag each override came from (a refusal names it).

    Start-up problems (a wrong device, a missing model path, an invalid setting, a compile
    cache that cannot be written) print one clear line each and exit 2 before anything
    listens, loads or compiles.
    """
    from pydantic import ValidationError

    from ..settings import Settings, configure_logging
    from ..settings.errors import settings_refusal

    try:
        settings = Settings(**(overrides or {}))
    except ValidationError as exc:
        for line in settings_refusal(exc, flags=flags):
            print(f"genaug serve: {line}", file=sys.stderr)
        return 2
    refused = _refused_before_loading(settings)
    if refused:
        print(f"genaug serve: {refused}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    failures: list[BaseException] = []

    def fatal(exc: BaseException) -> None:
        from ..app import is_refusal

        failures.append(exc)
        if is_refusal(exc):  # one line that names the fix, as the refusals before listening
            print(f"genaug serve: {exc}", file=sys.stderr)
        else:
            log.error("stopping: the model could not be loaded (%s)", exc)
        os.kill(os.getpid(), signal.SIGTERM)

    # A SQLite pool file this start creates is removed again if the start fails (nothing
    # can have been stored before the model loaded): a failed start leaves nothing behind.
    new_file = (settings.pool_url is None and settings.recipes is not None
                and not Path(settings.pool_path).exists())
    code: object = 1
    if warm_only:
        try:
            return _warm_only(settings)
        finally:
            if new_file:
                _remove_empty_pool(Path(settings.pool_path))
    try:
        code = _serve(settings, failures, fatal)
    except SystemExit as exc:  # the signal handler's exit, after uvicorn's shutdown
        code = exc.code
        raise
    finally:
        if code != 0 and new_file:
            _remove_empty_pool(Path(settings.pool_path))
    return int(code) if isinstance(code, int) else 1


def _refused_before_loading(settings: Any) -> str:
    """What the settings name that can never work, found in a second before anything loads
    ("" when nothing): ``GENAUG_REPLICA`` not written ``i/N``; a ``GENAUG_COMPILE_CACHE`` that
    cannot keep what ``GENAUG_COMPILE`` compiles (found now rather than by the save after
    minutes of compiling; nothing is checked when nothing compiles or nothing is kept)."""
    from ..pipeline.acceleration import compile_cache_root
    from ..pipeline.compile_cache import CompileCacheError, check_cache_folder
    from ..pool.types import PoolConfigError, parse_partition

    try:
        parse_partition(settings.replica)
    except PoolConfigError as exc:
        return str(exc)
    root = compile_cache_root(settings.compile_cache) if settings.compile != "off" else None
    if root is None:
        return ""
    try:
        check_cache_folder(root)
    except CompileCacheError as exc:
        return str(exc)
    return ""


def _serve(settings: Any, failures: list[BaseException],
           fatal: Callable[[BaseException], None]) -> int:
    from ..pool.open import open_pool_store
    from ..pool.types import PoolError
    from ..recipes.spec import RecipeError

    try:
        if settings.recipes is not None:
            # Reachable, credentials, schema version: checked first, so that a wrong pool URL
            # fails in a second, before torch and the model's libraries load.
            open_pool_store(settings).close()
    except PoolError as exc:
        print(f"genaug serve: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    from ..app import check_startup, create_app
    from ..pipeline.errors import ModelLoadError

    try:
        check_startup(settings)
        app = create_app(settings, on_fatal=fatal)
    except (ModelLoadError, RecipeError, PoolError) as exc:
        print(f"genaug serve: {exc}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=10,
        access_log=False,
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler it found. A start that failed (on_fatal sent the SIGTERM) exits 1, its reason
    # already said; otherwise the handler genaug's command line installed runs (Ctrl-C:
    # KeyboardInterrupt, SIGTERM: Terminated), and the command ends as every command does,
    # in one line (exit status 130, or 143), after the graceful shutdown.
    previous: dict[int, Any] = {sig: signal.getsignal(sig)
                                for sig in (signal.SIGINT, signal.SIGTERM)}

    def after_shutdown(signum: int, frame: Any) -> None:
        if failures:
            sys.exit(1)
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        raise KeyboardInterrupt  # no Python handler was there: Ctrl-C's own exception

    for sig in previous:
        signal.signal(sig, after_shutdown)
    server = _quiet_server(config)
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if failures or not server.started else 0


def _warm_only(settings: Any) -> int:
    """``genaug serve --warm-only``: the service's own start (load, acceleration options, warm-up
    through the compile cache) without a socket, then its own shutdown; 0 once warmed and,
    with compilation and a compile cache, once the cache holds what compiling made (1 when
    it kept nothing: the next start would compile again)."""
    import asyncio
    import time

    from ..app import check_startup, create_app, is_refusal
    from ..pipeline.compile_cache import kept
    from ..pipeline.errors import ModelLoadError
    from ..pool.types import PoolError
    from ..recipes.spec import RecipeError

    failures: list[BaseException] = []
    try:
        check_startup(settings)
        # Nothing is generated into the pool: the planner would start once warmed.
        app = create_app(settings.model_copy(update={"pregenerate": False}),
                         on_fatal=failures.append)
    except (ModelLoadError, RecipeError, PoolError) as exc:
        print(f"genaug serve: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()

    async def warm() -> Any:
        async with app.router.lifespan_context(app):
            state = app.state.genaug
            while not state.ready and not failures:
                await asyncio.sleep(0.1)
            return (state.acceleration.info() if state.acceleration is not None
                    else {})

    info = asyncio.run(warm())
    if failures:
        failed = failures[0]
        print(f"genaug serve: {failed}" if is_refusal(failed) else
              f"genaug serve: the model could not be loaded ({type(failed).__name__}: "
              f"{failed})", file=sys.stderr)
        return 1
    warmup = info.get("warmup") or {}
    cache = info.get("compile_cache")
    took = f"{warmup.get('text', 'warmed up')} ({time.monotonic() - started:.0f} s with loading)"
    if cache and not kept(str(cache["state"])):
        print(f"genaug serve --warm-only: {took}, but the compile cache {cache['folder']}/"
              f"{cache['key']} kept nothing ({cache['state']}): the next start compiles again; "
              "fix GENAUG_COMPILE_CACHE (the log above says why) and run this again",
              file=sys.stderr)
        return 1
    if cache:
        where = f"; compile cache {cache['folder']}/{cache['key']}: {cache['state']}"
    elif settings.compile == "off":
        where = "; compilation is off (GENAUG_COMPILE), nothing to keep"
    else:
        where = "; GENAUG_COMPILE_CACHE is off, nothing kept"
    print(f"genaug serve --warm-only: {took}{where}")
    return 0


def _quiet_server(config: Any) -> Any:
    """uvicorn's server, whose graceful shutdown logs only warnings and errors: the one line
    ``genaug serve: interrupted; ...`` says that it stopped (uvicorn's four INFO lines said
    it again: shutting down, waiting, complete, finished)."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
            await super().shutdown(sockets=sockets)

    return QuietServer(config)


def interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C (or SIGTERM) leaves: a graceful stop; the pool keeps every stored image."""
    return ("the service stopped (requests in flight were answered or refused; every image "
            "stored in the pool is kept); run the same command to start it again")


def _remove_empty_pool(path: Path) -> None:
    """Remove the SQLite pool at ``path`` (and its WAL files) if it holds no image."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            (count,) = conn.execute("SELECT COUNT(*) FROM images").fetchone()
    except sqlite3.Error:
        return  # not a pool this start made: leave it
    if count == 0:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
