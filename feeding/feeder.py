"""Keep a reservoir fresh from the genaug service: the feeder both trainers run.

:class:`Feeder` fills any :class:`~genaug.feeding.cycle.ReservoirLike`: the TensorFlow
trainer's :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir` (through
:class:`~genaug.trainer.feeding.feeder.ReservoirFeeder`, which adds a Keras callback) and each
``genaug.torch`` stream's reservoir.

The feeder is a daemon thread with its own asyncio loop and its own ``AsyncClient``. It asks
the service for images (a recipe's pool via ``sample``, or ``generate`` with per-label prompts),
writes them into the reservoir by class, and otherwise stays out of the way: when the service
is down it backs off exponentially and retries, and nothing it does ever raises into training.
Training never waits for it; the reservoir's map falls back to real images while a class is
empty.

Configuration mistakes are another matter: a training run that quietly goes on without
synthetic images because of a typo is worse than one that stops. A strict feeder (the
default) checks its first contact with the service (at :meth:`Feeder.start`, which the
Keras callback calls when ``fit`` begins) and raises :class:`FeederConfigError` before any
training step for a rejected API key, an unknown recipe, a ``label_map`` name the recipe
lacks, images of another size or channel count than the reservoir's, or a pool that is empty
with nothing to fill it; the checks live in :mod:`genaug.feeding.preflight`. Outages
(connection refused, 503, 429, timeouts) are not mistakes: they stay tolerant, and the check
runs at the first contact that gets an answer.

With ``match`` (a :class:`~genaug.match.DomainMatch`, or the real images to fit one from) every
batch the feeder receives is brought to the real images' size, channels, framing and light on
the feeder's thread before it is written: the reservoir then holds images of the real images'
shape, whatever size the recipe makes.

Importing this module imports neither TensorFlow nor torch; ``genaug.client`` is imported when
the feeder thread builds its client from ``url``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Self

import numpy as np

from genaug.client import InvalidRequestError
from genaug.match import DomainMatch
from genaug.urls import url_refusal

from .cycle import (
    FeederStats,
    ReservoirLike,
    after_failure,
    after_success,
    backoff_delay,
    close_client,
    fetch_once,
    wanted_labels,
)
from .preflight import (
    FeederConfigError,
    first_contact_answers,
    first_contact_problems,
    match_shape_refusal,
)

__all__ = ["Feeder"]

log = logging.getLogger(__name__)


class Feeder:
    """Daemon thread that refills a reservoir from the genaug service.

    Each cycle asks for ``batch`` images of the classes that are least filled (all classes once
    every class is full, so slots keep being replaced by fresh images), writes them, and sleeps
    ``interval_s``. Failures back off from ``backoff_initial_s`` doubling up to
    ``backoff_max_s`` (with jitter) until the service answers again.

    With ``strict=True`` (the default), :meth:`start` checks the first contact and raises
    :class:`FeederConfigError` for configuration mistakes (see the module docstring);
    ``strict=False`` only logs and keeps trying. What a trainer adds at first contact (the
    TensorFlow side warns when TensorFlow can use the generator's GPU) is
    :meth:`_service_info`.

    Example::

        feeder = Feeder(reservoir, url="http://gen-host:8000", recipe="wounds",
                        label_map={"healthy": 0, "ulcer": 1})
        with feeder:                       # start(): the first contact checked
            ...                            # draw from the reservoir
        feeder.stats.images_received

    With ``match=shots`` (your real training images, uint8 ``[N, 28, 28, 1]`` say) the
    reservoir is built at their shape (``image_shape == shots.shape[1:]``), and every pool
    image reaches it framed, sized and lit as they are.

    Args:
        reservoir: where images go.
        url: service URL (or list of URLs) for a ``genaug.client.AsyncClient`` built inside the
            feeder thread and closed by it. With neither ``url`` nor ``client`` the client's
            own default applies (``GENAUG_URL``). A URL the client would refuse (not
            ``http(s)://HOST[:PORT]``) is a ``ValueError`` here, not in the thread.
        client: instead of ``url``: an ``AsyncClient``-like object, or a zero-argument callable
            returning one (called inside the feeder thread; the feeder closes what it builds).
            A ready object is not closed by the feeder and must not be used by another loop.
        recipe: the service recipe to ``sample`` from.
        label_map: recipe label name -> reservoir class index.
        prompts: without ``recipe``: label name -> prompt, used with ``generate`` at the
            reservoir's image size.
        batch: images per request.
        interval_s: pause between successful requests.
        wait_s: how long ``sample`` may wait for the pool to produce images.
        backoff_initial_s / backoff_max_s: retry delays while the service fails.
        api_key: passed to the client built from ``url``.
        client_kwargs: extra keyword arguments for that client (``timeout``, ``client_id``...).
            ``retry_deadline`` defaults to 5 s there: the feeder has its own backoff, and a
            short client deadline keeps :attr:`stats` close to the service's real state.
        generate_kwargs: extra keyword arguments for ``generate`` (``steps``, ``priority``...).
        strict: check the first contact and raise :class:`FeederConfigError` on mistakes.
        first_contact_timeout_s: how long :meth:`start` waits for that first answer; past
            it (a service that hangs) training starts and the check runs when it comes.
        match: bring every received image to your real images' domain before it is written
            (:class:`~genaug.match.DomainMatch`): a ``DomainMatch``, or uint8 real images
            ``[N, H, W, C]`` (``C`` 1 or 3: the images you train on) to fit one from. The
            reservoir's ``image_shape`` must then be the match's ``(H, W, C)`` (a
            ``ValueError`` here otherwise), the recipe's size and channels may be anything,
            and ``generate`` (``prompts=``) is asked for the service's own size. Matching
            runs on the feeder's thread, never in the graph.
    """

    def __init__(
        self,
        reservoir: ReservoirLike,
        *,
        url: str | list[str] | None = None,
        client: Any = None,
        recipe: str | None = None,
        label_map: Mapping[str, int],
        prompts: Mapping[str, str] | None = None,
        batch: int = 64,
        interval_s: float = 1.0,
        wait_s: float = 0.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        api_key: str | None = None,
        client_kwargs: Mapping[str, Any] | None = None,
        generate_kwargs: Mapping[str, Any] | None = None,
        strict: bool = True,
        first_contact_timeout_s: float = 20.0,
        match: DomainMatch | np.ndarray | None = None,
    ) -> None:
        if url is not None and client is not None:
            raise ValueError("pass url= or client=, not both")
        if client is None:  # its client is built in the thread: a malformed URL is said now
            refused = url_refusal(url, owner=type(self).__name__)
            if refused is not None:
                raise ValueError(refused)
        if recipe is None and not prompts:
            raise ValueError("pass recipe= (sample from the service's pool) or prompts=")
        if not label_map:
            raise ValueError("label_map is empty; map recipe label names to class indices")
        for name, idx in label_map.items():
            if not 0 <= int(idx) < reservoir.num_classes:
                raise ValueError(
                    f"label_map[{name!r}] = {idx} is outside the reservoir's classes "
                    f"[0, {reservoir.num_classes})"
                )
        if prompts is not None and recipe is None:
            missing = sorted(set(label_map) - set(prompts))
            if missing:
                raise ValueError(f"prompts has no prompt for labels {missing}")
        if batch < 1 or interval_s < 0 or backoff_initial_s <= 0 or backoff_max_s <= 0:
            raise ValueError("batch must be >= 1, interval_s >= 0 and backoffs > 0")
        #: What brings received images to the real images' domain (``match=``), or ``None``.
        self.match: DomainMatch | None = _domain_match(match, type(self).__name__)
        matched = self.match_shape
        if matched is not None:
            refused = match_shape_refusal(reservoir.image_shape, matched)
            if refused is not None:
                raise ValueError(f"{type(self).__name__}: {refused}")
        self.reservoir = reservoir
        self.recipe = recipe
        self.label_map = {str(k): int(v) for k, v in label_map.items()}
        self.prompts = dict(prompts) if prompts else {}
        self.batch = int(batch)
        self.interval_s = float(interval_s)
        self.wait_s = float(wait_s)
        self.backoff_initial_s = float(backoff_initial_s)
        self.backoff_max_s = float(backoff_max_s)
        self._url = url
        self._client_arg = client
        self._api_key = api_key
        self._client_kwargs = dict(client_kwargs or {})
        self._generate_kwargs = dict(generate_kwargs or {})
        self.strict = bool(strict)
        self.first_contact_timeout_s = float(first_contact_timeout_s)
        self._checked = False  # strict checks passed (sticky across restarts)
        self._contact = threading.Event()  # first contact answered (or failed by outage)
        self._config_error: FeederConfigError | None = None

        self._stats_lock = threading.Lock()
        self._stats = FeederStats()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = threading.Event()
        self._cycle = 0
        self._need: dict[str, float] | None = None  # reported by report_need, not sent yet
        self._need_lock = threading.Lock()
        #: The last need the service accepted (label name -> value), or ``None``.
        self.need_sent: dict[str, float] | None = None

    @property
    def match_shape(self) -> tuple[int, int, int] | None:
        """``(H, W, C)`` of every image the match writes (the real images'), or ``None``."""
        if self.match is None:
            return None
        return (self.match.size[0], self.match.size[1], self.match.channels)

    # ------------------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        """The feeder thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the feeder thread (no-op if it is running).

        Non-strict: returns at once. Strict, before its checks have passed: waits for the
        first contact (at most ``first_contact_timeout_s``) and raises
        :class:`FeederConfigError` if it found a mistake (the thread has ended then). An
        outage is not a mistake: it returns and the feeder keeps trying.
        """
        if self.running:
            return
        self._stopping.clear()
        self._contact.clear()
        self._config_error = None
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready,), name="genaug-feeder", daemon=True
        )
        self._thread.start()
        atexit.register(self.stop)  # Ctrl-C in fit skips on_train_end: stop before TF's teardown
        ready.wait(timeout=10.0)
        if self.strict and not self._checked:
            if not self._contact.wait(self.first_contact_timeout_s):
                log.warning(
                    "genaug feeder: no answer from the service within %.0f s; training starts "
                    "on real images and the configuration is checked when it answers",
                    self.first_contact_timeout_s,
                )
            if self._config_error is not None:
                self.stop()
                raise self._config_error

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread: cancel the request in flight, close the client, join.

        Waits at most ``timeout`` seconds; a thread that does not finish by then is left as a
        daemon (logged), it cannot hold up interpreter exit.
        """
        thread = self._thread
        if thread is None:
            return
        atexit.unregister(self.stop)
        self._stopping.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("genaug feeder thread did not stop within %.1f s", timeout)
        else:
            self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def config_error(self) -> FeederConfigError | None:
        """The configuration mistake that stopped the thread (strict or not), else None."""
        return self._config_error

    @property
    def stats(self) -> FeederStats:
        """A consistent snapshot of the counters."""
        with self._stats_lock:
            s = self._stats
        return replace(s, running=self.running, checked=self._checked)

    def report_need(self, need: Mapping[str, float]) -> None:
        """Tell the service what training needs (recipe label name -> number >= 0, e.g.
        per-class error), without waiting: the feeder thread posts it to
        ``POST /v1/recipes/{recipe}/feedback`` before its next request, under this feeder's
        client identity (``client_kwargs={"client_id": ...}``). A newer report replaces one
        not sent yet; labels not in ``label_map`` are left out. A recipe feeder only.

        Example::

            feeder.report_need({"healthy": 0.05, "ulcer": 0.4})
        """
        if self.recipe is None:
            raise ValueError("report_need needs a recipe feeder (recipe=...): prompts have "
                             "no pool for the service to steer")
        clean = {str(k): float(v) for k, v in need.items() if str(k) in self.label_map}
        with self._need_lock:
            self._need = clean

    async def _send_need(self, client: Any) -> None:
        """Post the need waiting, if any. A refused report (422: say, a label the recipe
        lacks) is dropped with an error in the log; an outage keeps it for the next try."""
        with self._need_lock:
            need, self._need = self._need, None
        if need is None or self.recipe is None:
            return
        try:
            await client.feedback(self.recipe, need)
        except Exception as exc:
            if getattr(exc, "status", None) == 422:
                log.error("genaug feeder: the service refused the need report: %s", exc)
                return
            with self._need_lock:
                if self._need is None:  # keep it unless a newer one came meanwhile
                    self._need = need
            raise
        self.need_sent = need

    # ------------------------------------------------------------------------------ thread

    def _thread_main(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException:  # never let anything escape the thread
            log.exception("genaug feeder thread ended with an error")
        finally:
            ready.set()
            self._loop = None
            self._task = None

    def _make_client(self) -> tuple[Any, bool]:
        """(client, owned)."""
        if self._client_arg is None:
            from genaug.client import AsyncClient

            kwargs = {"retry_deadline": 5.0, **self._client_kwargs}
            try:
                return AsyncClient(self._url, api_key=self._api_key, **kwargs), True
            except ValueError as exc:  # a client_id the service would refuse
                raise FeederConfigError(f"genaug feeder: client_kwargs: {exc}") from None
        if callable(self._client_arg) and not hasattr(self._client_arg, "sample"):
            return self._client_arg(), True
        return self._client_arg, False

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        ready.set()
        client: Any = None
        owned = False
        try:
            while not self._stopping.is_set():
                try:
                    if client is None:
                        client, owned = self._make_client()
                    if self.strict and not self._checked:
                        await self._first_contact(client)
                    try:
                        await self._cycle_once(client)
                    except InvalidRequestError as exc:  # a 4xx naming a field: no retry helps
                        if not self.strict:  # lenient: logged, kept trying, as documented
                            raise
                        raise FeederConfigError(f"genaug feeder: the service refused its "
                                                f"request: {exc}") from None
                except asyncio.CancelledError:
                    raise
                except FeederConfigError as exc:
                    self._record_failure(exc)
                    self._config_error = exc
                    if self._contact.is_set() or not self.strict:  # start() will not raise it
                        log.error("genaug feeder stopped: %s", exc)
                    self._contact.set()
                    return
                except Exception as exc:  # never raise into training
                    self._record_failure(exc)
                    self._contact.set()  # an outage: start() returns, training goes on
                    await asyncio.sleep(self._backoff_delay(exc))
                else:
                    await asyncio.sleep(self.interval_s)
        except asyncio.CancelledError:
            pass
        finally:
            self._contact.set()
            if client is not None and owned:
                await close_client(client)
            with self._stats_lock:
                self._stats = replace(self._stats, connected=False)

    async def _first_contact(self, client: Any) -> None:
        """Strict checks (:mod:`~genaug.feeding.preflight`); raises
        :class:`FeederConfigError` for mistakes, the client's error for an outage (the caller
        backs off and comes back here)."""
        where = ", ".join(getattr(client, "urls", None) or [str(self._url or "the service")])
        info, detail = await first_contact_answers(client, recipe=self.recipe, where=where)
        self._service_info(info, where)
        problems = first_contact_problems(
            info=info, recipe_detail=detail, recipe=self.recipe, label_map=self.label_map,
            image_shape=self.reservoir.image_shape,
            wait_s=self.wait_s, matched_shape=self.match_shape,
        )
        if problems:
            raise FeederConfigError(
                f"genaug feeder: {len(problems)} configuration problem(s) with the service at "
                f"{where}:\n  - " + "\n  - ".join(problems)
            )
        self._checked = True
        self._contact.set()

    def _service_info(self, info: Mapping[str, Any], where: str) -> None:
        """What this trainer's feeder does with ``/v1/info``'s answer at first contact, before
        the checks (nothing here; never raises)."""

    def _backoff_delay(self, exc: BaseException | None = None) -> float:
        return backoff_delay(self._stats.consecutive_failures, exc,
                             initial_s=self.backoff_initial_s, max_s=self.backoff_max_s)

    def _record_failure(self, exc: BaseException) -> None:
        with self._stats_lock:
            first = self._stats.consecutive_failures == 0
            self._stats = after_failure(self._stats, exc)
        if first and not isinstance(exc, FeederConfigError):
            log.warning(
                "genaug feeder: request failed (%s: %s); training continues on real images, "
                "retrying with backoff up to %.1f s",
                type(exc).__name__,
                exc,
                self.backoff_max_s,
            )
        else:
            log.debug("genaug feeder: still failing: %s: %s", type(exc).__name__, exc)

    async def _cycle_once(self, client: Any) -> None:
        await self._send_need(client)
        cycle = self._cycle
        if self.recipe is None:
            self._cycle += 1
        received, dropped = await fetch_once(
            client, self.reservoir, wanted=wanted_labels(self.reservoir, self.label_map),
            label_map=self.label_map, recipe=self.recipe, prompts=self.prompts,
            batch=self.batch, wait_s=self.wait_s, generate_kwargs=self._generate_kwargs,
            cycle=cycle, match=self.match,
        )
        with self._stats_lock:
            reconnected = self._stats.consecutive_failures > 0
            self._stats = after_success(self._stats, received=received, dropped=dropped)
        if reconnected:
            log.info("genaug feeder: service reachable again")
        if dropped:
            log.debug("genaug feeder: dropped %d images with unmapped labels", dropped)


def _domain_match(match: DomainMatch | np.ndarray | None, owner: str) -> DomainMatch | None:
    """``match=`` as a :class:`~genaug.match.DomainMatch` (fitted on real images when it is
    some); a ``ValueError`` naming the option for anything else."""
    if match is None or isinstance(match, DomainMatch):
        return match
    try:
        return DomainMatch.fit(np.asarray(match))
    except ValueError as exc:
        raise ValueError(f"{owner} match=: {exc}; pass a DomainMatch or your real "
                         "training images as uint8 [N, H, W, C]") from None
