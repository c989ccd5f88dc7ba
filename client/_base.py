"""Everything both clients share and that does no I/O: options, request bodies, endpoint
choice, retry timing, status translation and response decoding.

``Client`` and ``AsyncClient`` only send requests and sleep; every decision is made here,
once.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar, Unpack

import numpy as np

from genaug.wire import (
    CLIENT_ID_PATTERN,
    PNG_MEDIA_TYPE,
    SAFETENSORS_MEDIA_TYPE,
    WireError,
    decode_batch,
    encode_image_upload,
)

from .errors import (
    KEY_HINT,
    URL_ARGUMENT,
    DecodeError,
    GenaugError,
    RateLimitedError,
    StatusError,
    TransportError,
    UnavailableError,
    error_class,
)

DEFAULT_URL = "http://127.0.0.1:8000"
PROBE_TIMEOUT_S = 2.0
RETRYABLE = (TransportError, RateLimitedError, UnavailableError)

# ``sample``'s defaults, once for both clients: the service's own (``SampleRequest``), which
# tests/client pins them to, so a call that leaves them out means what the service means.
SAMPLE_N = 64
SAMPLE_WAIT_S = 0.0


@dataclass
class GenerateResult:
    """Images from ``generate`` or ``variants``: ``images`` uint8 ``[n, h, w, 3]``, ``seeds``
    int64 ``[n]``.

    ``sources`` int32 ``[n]``: for ``variants``, which input image each output came from
    (source-major: all variants of image 0, then of image 1...); ``None`` for text-to-image.
    ``metadata`` holds the request as the service understood it (``request``,
    ``resolved``) and the model's ``model_hash``.
    """

    images: np.ndarray
    seeds: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    sources: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])


@dataclass
class SampleResult:
    """Images from a recipe's pool: ``labels`` int32 indices into ``label_names``.

    ``source_hashes``: for pools with img2img labels, the hash of the real image each image
    is a variant of (``None`` for a text-to-image one, the hash ``/v1/variants`` answers);
    ``None`` when no image of the sample is a variant. ``empty_labels``: labels asked for
    that the sample holds no image of (their pool is still filling; ``[]`` from a service
    that does not say). ``stopped``: labels asked for that the service's judge stopped (it
    accepted too few of their images, so no more are made and ``wait_s`` does not wait for
    them), each with the judge's reason and fix (``{}`` from a service that does not say).
    A loop that waits for a label to fill ends when it appears here.

    Example::

        result = client.sample("digits", labels=["3", "8"], n=64, wait_s=30.0)
        for label, why in result.stopped.items():
            print(label, why)   # "stopped: the judge accepted 2 of the 50 images ... Fix: ..."
    """

    images: np.ndarray
    labels: np.ndarray
    seeds: np.ndarray
    label_names: list[str]
    recipe: str
    metadata: dict[str, Any] = field(default_factory=dict)
    source_hashes: list[str | None] | None = None
    empty_labels: list[str] = field(default_factory=list)
    stopped: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.images.shape[0])


def backoff_s(
    attempt: int, *, initial_s: float, max_s: float, jitter: float = 0.0,
    rng: random.Random | None = None,
) -> float:
    """The one backoff formula: ``initial_s * 2**(attempt - 1)`` capped at ``max_s``, times a
    uniform factor in ``[1 - jitter, 1]`` (``jitter=1``: "full jitter").

    Used by the clients' retries, their replica cooldown and the trainer's feeder. Why not a
    retry library (stamina, tenacity, backoff): none of these loops re-invokes one function.
    The client picks a replica per attempt, probes a resting one's ``/readyz``, skips the
    wait when another replica is healthy and honours ``Retry-After`` as a floor; the feeder
    never gives up, counts every failure in its stats and must stop at once when asked.
    Expressed through a library's callbacks that is more code than this, and the client
    extra (small enough for a notebook) would carry two more dependencies.

    Example::

        backoff_s(3, initial_s=0.5, max_s=30.0)   # 2.0
    """
    exp = initial_s * 2.0 ** min(max(attempt, 1) - 1, 60)
    delay = min(max_s, exp)
    if jitter:
        delay *= (rng or random).uniform(1.0 - jitter, 1.0)
    return delay


def _env_urls() -> list[str]:
    raw = os.environ.get("GENAUG_URL", DEFAULT_URL)
    return [u.strip() for u in raw.split(",") if u.strip()]


@dataclass
class Endpoint:
    """One replica: where it is, how busy we keep it, and whether it is resting after a fault."""

    url: str
    outstanding: int = 0
    down_until: float = 0.0
    failures: int = 0


class Endpoints:
    """Choose a replica per call: the healthy one with the fewest outstanding requests.

    A replica that refused a connection or answered 503 rests for a short, growing cooldown;
    after it, the client rechecks ``/readyz`` before sending it real work again. When all
    rest, the one that comes back first is tried.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("give at least one service URL")
        self.endpoints = [Endpoint(u.rstrip("/")) for u in urls]

    def pick(self, now: float | None = None) -> Endpoint:
        now = time.monotonic() if now is None else now
        healthy = [e for e in self.endpoints if e.down_until <= now]
        if healthy:
            return min(healthy, key=lambda e: (e.outstanding, random.random()))
        return min(self.endpoints, key=lambda e: e.down_until)

    def healthy_count(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        return sum(e.down_until <= now for e in self.endpoints)

    def mark_down(self, endpoint: Endpoint, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        endpoint.failures += 1
        endpoint.down_until = now + backoff_s(endpoint.failures, initial_s=1.0, max_s=30.0)

    def mark_up(self, endpoint: Endpoint) -> None:
        endpoint.failures = 0
        endpoint.down_until = 0.0


class RetryState:
    """Exponential backoff with full jitter, honouring ``Retry-After``, within one deadline.

    Example::

        retry = RetryState(deadline_s=30)
        delay = retry.next_delay(error)   # raises ``error`` when it should not be retried
    """

    def __init__(self, *, deadline_s: float, base_s: float = 0.2, cap_s: float = 5.0) -> None:
        self.deadline = time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0

    def next_delay(self, error: GenaugError, *, failover: bool = False) -> float:
        """Seconds to wait before the next attempt; ``failover``: another replica is healthy,
        so only ``Retry-After`` (not backoff) applies."""
        if not isinstance(error, RETRYABLE):
            raise error
        self.attempt += 1
        remaining = self.deadline - time.monotonic()
        backoff = backoff_s(self.attempt, initial_s=2 * self.base_s, max_s=self.cap_s, jitter=1.0)
        if failover:
            backoff = 0.0
        retry_after = error.retry_after if isinstance(error, StatusError) else None
        if failover and isinstance(error, UnavailableError):
            retry_after = None  # that replica is down, not this call's next one
        delay = max(backoff, retry_after or 0.0)
        if remaining <= 0 or delay > remaining:
            note = (
                f" (gave up after {self.attempt} attempts within the client's "
                f"retry_deadline of {self.deadline_s:g} s)"
            )
            if isinstance(error, StatusError):
                error.message += note
                error.args = (error.message,)
                raise error
            raise type(error)(f"{error}{note}") from error
        return delay


def _client_id_fix(given: str) -> str:
    """``given`` made a valid client id: other characters become '-', cut to 64."""
    return (re.sub(r"[^A-Za-z0-9._:@/-]+", "-", given).strip("-")[:64]) or "trainer-a"


class BaseClient:
    """Shared, I/O-free state of a client."""

    def __init__(
        self,
        url: str | Sequence[str] | None,
        *,
        api_key: str | None,
        client_id: str | None,
        timeout: float,
        retry_deadline: float,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url) if url is not None else _env_urls()
        self.endpoints = Endpoints(urls)
        self.api_key = api_key if api_key is not None else os.environ.get("GENAUG_API_KEY")
        if client_id is not None and not re.fullmatch(CLIENT_ID_PATTERN, client_id):
            raise ValueError(
                f"client_id {client_id[:80]!r} is not 1-64 characters of letters, digits and "
                f"'._:@/-'; use a short name such as {_client_id_fix(client_id)!r}")
        self.client_id = client_id
        self.timeout = timeout
        self.retry_deadline = retry_deadline
        self.calls = Calls(timeout)

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.endpoints.endpoints]

    def headers(self, accept: str | None = None) -> dict[str, str]:
        out = {"User-Agent": "genaug-client"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        if self.client_id:
            out["X-Client-Id"] = self.client_id
        if accept:
            out["Accept"] = accept
        return out

    def retry_state(self, deadline_s: float | None = None) -> RetryState:
        return RetryState(deadline_s=self.retry_deadline if deadline_s is None else deadline_s)

    def transport_error(self, exc: Exception, endpoint: Endpoint) -> TransportError:
        self.endpoints.mark_down(endpoint)
        return TransportError(
            f"no answer from the genaug service at {endpoint.url} ({type(exc).__name__}: "
            f"{exc}). Is it running? Start one with `genaug serve` (or `docker compose up`), "
            f"or point the client at it with {URL_ARGUMENT} / GENAUG_URL"
        )

    def status_error(
        self, status: int, body: bytes, headers: Any, endpoint: Endpoint
    ) -> StatusError:
        """Translate an error answer; marks the replica down on 503."""
        error_type, message, field_name, error_id = "", "", None, None
        try:
            detail = json.loads(body)["error"]
            error_type = str(detail.get("type", ""))
            message = str(detail.get("message", ""))
            field_name = detail.get("field")
            error_id = detail.get("id")
        except (ValueError, KeyError, TypeError):
            message = body[:200].decode("utf-8", "replace")
        retry_after = None
        raw = headers.get("retry-after")
        if raw is not None:
            try:
                retry_after = float(raw)
            except ValueError:
                retry_after = None
        cls = error_class(status)
        if cls is UnavailableError:
            self.endpoints.mark_down(endpoint)
        text = f"{status} from {endpoint.url}: {message or error_type or 'error'}"
        if status == 401:
            text += KEY_HINT
        return cls(
            text, status=status, error_type=error_type, field=field_name, error_id=error_id,
            retry_after=retry_after, url=endpoint.url,
        )

    def can_fail_over(self) -> bool:
        """True when several replicas are configured and one is healthy now."""
        return len(self.endpoints.endpoints) > 1 and self.endpoints.healthy_count() > 0


class GenerationOptions(TypedDict, total=False):
    """The options ``generate``, ``generate_png`` and ``variants`` share, all optional (unset:
    the service's defaults; ``None`` is the same as unset). The service's request schema
    (``GET /openapi.json``) says each one's bounds.

    - ``negative_prompt``: what to avoid;
    - ``output_height`` / ``output_width``: resize the output (one of them keeps the aspect);
    - ``steps``, ``guidance``: denoising steps, classifier-free guidance scale;
    - ``seed``: seed of the first image (image i uses seed + i): reproducible images;
    - ``priority``: ``"interactive"`` (default) or ``"bulk"``;
    - ``timeout_s``: the deadline; past it the service answers 504;
    - ``scheduler``: one of the service's schedulers (``info()``);
    - ``adapter`` / ``adapter_scale``: one of its LoRA adapters (``info()["adapters"]``)
      and its strength (default 1.0).
    """

    negative_prompt: str | None
    output_height: int | None
    output_width: int | None
    steps: int | None
    guidance: float | None
    seed: int | None
    priority: str
    timeout_s: float | None
    scheduler: str | None
    adapter: str | None
    adapter_scale: float | None


class GenerateOptions(GenerationOptions, total=False):
    """``generate``'s options: the shared ones, ``n`` images (default 1) and the generation
    ``height`` / ``width`` (a multiple of 8; default: the service's)."""

    n: int
    height: int | None
    width: int | None


class VariantOptions(GenerationOptions, total=False):
    """``variants``' options: the shared ones, ``strength`` in (0, 1] (default 0.5: how far
    from the source a variant may go; 1 ignores it) and ``n_per_image`` (default 1)."""

    strength: float
    n_per_image: int


#: Per method: the option names it takes, and what it sends for an option left unset (the
#: service's own defaults).
OPTIONS: Mapping[str, tuple[frozenset[str], Mapping[str, Any]]] = {
    "generate": (frozenset(GenerateOptions.__annotations__),
                 {"n": 1, "priority": "interactive"}),
    "variants": (frozenset(VariantOptions.__annotations__),
                 {"strength": 0.5, "n_per_image": 1, "priority": "interactive"}),
}


def request_body(method: str, prompt: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a ``method`` (``generate`` or ``variants``) request: the prompt, the
    defaults, then the options given (one set to ``None`` is left out: the service's default
    applies).

    Raises:
        TypeError: an option ``method`` does not take (as for any unknown keyword).
    """
    names, defaults = OPTIONS[method]
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r} (its "
                        f"options: {', '.join(sorted(names))})")
    body: dict[str, Any] = {"prompt": prompt, **defaults}
    body.update((k, v) for k, v in options.items() if v is not None)
    return body


def source_images(images: Any) -> np.ndarray:
    """``images`` as uint8 ``[N, H, W, 3]`` (one ``[H, W, 3]`` becomes N = 1).

    Raises:
        ValueError: another dtype or shape, or no image (nothing was sent).
    """
    given = np.asarray(images)
    # the message quotes ``given``, not the batch of one made below: a user who passed
    # (2, 64, 64) must read (2, 64, 64), or the shape they are told to fix is not theirs
    arr = given[None] if given.ndim == 3 else given
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] == 0:
        raise ValueError(
            f"variants() takes uint8 images [N, H, W, 3] or one [H, W, 3]; got {given.dtype} "
            f"{tuple(given.shape)}. {_source_fix(given)}"
        )
    return arr


def _source_fix(given: np.ndarray) -> str:
    """The conversion that turns ``given`` into what ``variants()`` takes."""
    if given.ndim in (3, 4) and given.shape[0] == 0:
        return "Send at least one image"
    fixes: list[str] = []
    if given.dtype != np.uint8:
        fixes.append("np.clip(x * 255, 0, 255).astype(np.uint8) for floats in [0, 1]")
    channels = given.shape[-1] if given.ndim else 0
    if given.ndim == 2 or (given.ndim == 3 and channels not in (1, 3, 4)):
        # [H, W] or [N, H, W]: gray images without a channel axis
        fixes.append("np.repeat(x[..., None], 3, axis=-1) for gray images without a channel "
                     "axis")
    elif given.ndim in (3, 4) and channels == 1:
        fixes.append("np.repeat(x, 3, axis=-1) for one channel")
    elif given.ndim in (3, 4) and channels == 4:
        fixes.append("x[..., :3] to drop the alpha channel")
    if not fixes:
        fixes.append("np.stack(images) for a list of [H, W, 3] images")
    return "Convert with " + ", then ".join(fixes)


Multipart = list[tuple[str, tuple[str | None, bytes, str]]]


def variants_parts(images: Any, params: dict[str, Any]) -> Multipart:
    """``multipart/form-data`` parts: one ``images`` part (a genaug safetensors batch, so
    no image library is needed here) and the ``params`` JSON part."""
    payload = encode_image_upload(source_images(images))
    return [
        ("images", ("images.safetensors", payload, SAFETENSORS_MEDIA_TYPE)),
        ("params", (None, json.dumps(params).encode("utf-8"), "application/json")),
    ]


def need_body(need: Mapping[str, float]) -> dict[str, float]:
    """``need`` as the feedback body's mapping: label names to plain floats.

    Raises:
        ValueError: a value that is not a finite number >= 0 (the service would answer 422).
    """
    out: dict[str, float] = {}
    for label, value in need.items():
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError(
                f"need[{label!r}] = {value!r}: give each label a finite number >= 0 (only "
                "proportions count; 0 or leaving the label out means it needs nothing)"
            )
        out[str(label)] = number
    return out


def sample_body(labels: str | Sequence[str] | None, n: int, wait_s: float) -> dict[str, Any]:
    body: dict[str, Any] = {"n": n, "wait_s": wait_s}
    if labels is not None:
        body["labels"] = sample_labels(labels)
    return body


def sample_labels(labels: str | Iterable[str]) -> list[str]:
    """``labels`` as the list of names the service takes; a number (``labels=3``, or one in
    a list) raises ``TypeError`` naming the value and the fix: a recipe's labels are names
    (strings), even where they are digits."""
    if isinstance(labels, str):
        return [labels]
    if not isinstance(labels, Iterable):
        raise TypeError(
            f"labels={labels!r}: give a label name or a list of names, e.g. "
            f"labels={str(labels)!r} or labels=[{str(labels)!r}]; a recipe's labels are "
            "strings, even digits (client.recipe(name)['labels'] lists them)")
    given = list(labels)
    wrong = [x for x in given if not isinstance(x, str)]
    if wrong:
        raise TypeError(
            f"labels={given!r}: {wrong[0]!r} ({type(wrong[0]).__name__}) is not a label "
            f"name; a recipe's labels are strings, even digits: pass "
            f"labels={[str(x) for x in given]!r} (client.recipe(name)['labels'] lists them)")
    return [str(x) for x in given]


def decode_generate(payload: bytes) -> GenerateResult:
    try:
        batch = decode_batch(payload)
    except WireError as exc:
        raise DecodeError(f"the service sent a body that is not a genaug batch: {exc}") from exc
    return GenerateResult(
        images=batch.images, seeds=batch.seeds, metadata=batch.metadata, sources=batch.sources
    )


def decode_sample(payload: bytes, recipe: str) -> SampleResult:
    try:
        batch = decode_batch(payload)
    except WireError as exc:
        raise DecodeError(f"the service sent a body that is not a genaug batch: {exc}") from exc
    names = batch.metadata.get("label_names", [])
    labels = batch.labels if batch.labels is not None else np.zeros(len(batch), np.int32)
    hashes = batch.metadata.get("source_hashes")
    if hashes is not None and (not isinstance(hashes, list) or len(hashes) != len(batch)):
        raise DecodeError(
            f"the service sent source_hashes for {len(hashes) if isinstance(hashes, list) else 0}"
            f" images with a sample of {len(batch)}"
        )
    return SampleResult(
        images=batch.images, labels=labels, seeds=batch.seeds, label_names=list(names),
        recipe=recipe, metadata=batch.metadata, source_hashes=hashes,
        empty_labels=[str(x) for x in batch.metadata.get("empty_labels") or []],
        stopped={str(k): str(v) for k, v in (batch.metadata.get("stopped") or {}).items()},
    )


def expect_png(payload: bytes) -> bytes:
    if not payload.startswith(b"\x89PNG\r\n\x1a\n"):
        raise DecodeError("asked for a PNG but the body is not one")
    return payload


# -- jobs: a fill handed off -----------------------------------------------------------------

#: A job's states while the service still works on it, and once it ended (the service's
#: ``JOB_STATES``); a waiter returns at the latter.
LIVE_JOB_STATES = ("queued", "running")
ENDED_JOB_STATES = ("done", "stopped", "failed", "cancelled")
#: ``wait()``'s default seconds between polls of ``GET /v1/jobs/{id}``, and ``jobs()``'s
#: default count (the service's own).
JOB_POLL_S = 1.0
JOBS_LIMIT = 50


def job_ended(job: Mapping[str, Any]) -> bool:
    """True once ``job`` (a ``GET /v1/jobs/{id}`` answer) is done, stopped, failed or
    cancelled."""
    return str(job.get("state")) in ENDED_JOB_STATES


def job_held(job: Mapping[str, Any]) -> tuple[int, int]:
    """``(held, asked)``: how much of what ``job`` asked its labels hold now (``asked -
    missing``: a ``per_label`` job counts the images its labels held before it began, an
    ``images`` one only those it made), and what it asked."""
    asked = int(job.get("asked") or 0)
    return max(0, asked - int(job.get("missing") or 0)), asked


def job_path(job_id: str) -> str:
    """``/v1/jobs/{job_id}``, the id quoted (an id with a ``/`` is a 404, never another
    route).

    Raises:
        ValueError: an empty id (it would name the list, not a job).
    """
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"job id {job_id!r}: give the id a fill answered (fill(...).id: 'j_' "
                         "and 16 hex characters); jobs() lists the recent ones")
    return "/v1/jobs/" + urllib.parse.quote(job_id, safe="")


def jobs_query(recipe: str | None, state: str | None, limit: int) -> str:
    """``GET /v1/jobs``' query string (only the filters given)."""
    query = {key: value for key, value in (("recipe", recipe), ("state", state))
             if value is not None}
    query["limit"] = str(int(limit))
    return "?" + urllib.parse.urlencode(query)


class FillAnswer(Mapping[str, Any]):
    """What a fill answered: the recipe's counts and targets at once (read it as a mapping:
    ``job["budget"]``, ``job["fill"]``, ``dict(job)``), and the job the service carries the
    fill out as (``id``, ``url``). :class:`~genaug.client.FillJob` and
    :class:`~genaug.client.AsyncFillJob` add ``status()``, ``wait()`` and ``cancel()``.

    ``id`` is ``None`` only from a service older than jobs (its answer names none): the fill
    still runs there, but there is nothing to follow or cancel.
    """

    def __init__(self, answer: Mapping[str, Any]) -> None:
        self.answer: dict[str, Any] = dict(answer)
        job = self.answer.get("job")
        found = isinstance(job, Mapping) and isinstance(job.get("id"), str)
        self.id: str | None = str(job["id"]) if found and isinstance(job, Mapping) else None
        self.url: str | None = (str(job["url"]) if found and isinstance(job, Mapping)
                                and job.get("url") else None)

    def __getitem__(self, key: str) -> Any:
        return self.answer[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.answer)

    def __len__(self) -> int:
        return len(self.answer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, recipe={self.answer.get('name')!r})"

    def _job_id(self) -> str:
        if self.id is None:
            raise DecodeError(
                f"the service's fill answer names no job (keys: {sorted(self.answer)}): it is "
                "older than this client, so there is nothing to follow or cancel; watch "
                "recipe(name)['fill'] instead, or upgrade the service")
        return self.id


class JobWatch:
    """One wait for a job, without I/O: its deadline, its progress bar, and whether the job
    ended. The clients poll; this decides.

    ``progress``: ``None`` draws a tqdm bar (held of asked images; the rate and time left of
    what the job made while it was watched; the state) when
    ``sys.stderr`` is a terminal and tqdm is installed, ``True`` always (tqdm required),
    ``False`` never.

    Example::

        watch = JobWatch("j_0123456789abcdef", timeout=60.0, poll_s=1.0, progress=False)
        while not watch.seen(client.job(watch.job_id)):
            time.sleep(watch.delay())   # raises TimeoutError at the deadline
        watch.close()
    """

    def __init__(self, job_id: str, *, timeout: float | None, poll_s: float,
                 progress: bool | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        job_path(job_id)  # the id is one before anything waits
        if not (isinstance(poll_s, int | float) and math.isfinite(poll_s) and poll_s > 0):
            raise ValueError(f"poll_s={poll_s!r}: give the seconds between polls, a number > 0 "
                             f"(default {JOB_POLL_S:g})")
        if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
            raise ValueError(f"timeout={timeout!r}: give seconds >= 0, or None to wait until "
                             "the job ends")
        self.job_id = job_id
        self.timeout = timeout
        self.poll_s = float(poll_s)
        self._clock = clock
        self.deadline = None if timeout is None else clock() + float(timeout)
        self.last: Mapping[str, Any] | None = None
        self._tqdm = _tqdm_class(progress)
        self._bar: Any = None

    def seen(self, job: Mapping[str, Any]) -> bool:
        """Record a poll's answer (the bar follows it); True when the job ended."""
        self.last = job
        if self._tqdm is not None:
            held, asked = job_held(job)
            if self._bar is None:
                # The bar starts where the job stood at the first poll (a per_label job's
                # labels held images before it began): tqdm's rate and time left count only
                # what came after, the job's own work, never that first jump.
                self._bar = self._tqdm(total=asked, initial=min(held, asked), desc=self.job_id,
                                       unit="img", file=sys.stderr, dynamic_ncols=True,
                                       leave=True)
            self._bar.total = asked
            self._bar.n = max(self._bar.initial, min(held, asked))
            self._bar.set_postfix_str(str(job.get("state")), refresh=False)
            self._bar.refresh()
        return job_ended(job)

    def delay(self) -> float:
        """Seconds to sleep before the next poll.

        Raises:
            TimeoutError: the deadline passed; the message names the job and its state.
        """
        if self.deadline is None:
            return self.poll_s
        remaining = self.deadline - self._clock()
        if remaining <= 0:
            raise TimeoutError(self.timeout_message())
        return min(self.poll_s, remaining)

    def timeout_message(self) -> str:
        job = self.last or {}
        held, asked = job_held(job)
        return (f"job {self.job_id} is still {job.get('state', 'unknown')} after "
                f"{self.timeout:g} s ({held} of {asked} images); it goes on in the service: "
                f"wait again, or cancel it (cancel_job({self.job_id!r}), or genaug jobs cancel "
                f"{self.job_id})")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _tqdm_class(progress: bool | None) -> Any:
    """tqdm's class when a bar is wanted (see :class:`JobWatch`), else None."""
    if progress is False or (progress is None and not _stderr_is_a_terminal()):
        return None
    try:
        from tqdm import tqdm
    except ImportError as exc:
        if progress is None:
            return None  # the bar is a nicety where a terminal shows it; waiting works without
        raise ImportError("wait(progress=True) draws a tqdm bar: pip install tqdm, or pass "
                          "progress=False") from exc
    return tqdm


def _stderr_is_a_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call, fully described: both clients send it and decode the answer with it."""

    method: str
    path: str
    decode: Callable[[bytes], T]
    body: dict[str, Any] | None = None
    accept: str | None = None
    timeout: float | None = None
    files: Multipart | None = None

    def content(self) -> dict[str, Any]:
        """The request body as httpx keyword arguments: JSON, or multipart parts."""
        if self.files is not None:
            return {"files": self.files}
        return {"json": self.body}


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError as exc:
        raise DecodeError(f"expected JSON from the service: {exc}") from exc


def http_timeout(timeout_s: float | None, default: float) -> float:
    """The HTTP timeout for a call whose deadline is ``timeout_s``: the service answers 504
    at the deadline, so leave it a moment to say so."""
    return max(default, timeout_s + 5.0) if timeout_s is not None else default


class Calls:
    """Builders for every call of the API (the one place that knows paths and bodies)."""

    def __init__(self, default_timeout: float) -> None:
        self.default_timeout = default_timeout

    def generate(
        self, prompt: str, *, png: bool = False, **options: Unpack[GenerateOptions]
    ) -> Call[Any]:
        body = request_body("generate", prompt, options)
        return Call(
            "POST", "/v1/generate",
            decode=expect_png if png else decode_generate,
            body=body, accept=PNG_MEDIA_TYPE if png else SAFETENSORS_MEDIA_TYPE,
            timeout=http_timeout(options.get("timeout_s"), self.default_timeout),
        )

    def variants(
        self, images: Any, prompt: str, **options: Unpack[VariantOptions]
    ) -> Call[GenerateResult]:
        params = request_body("variants", prompt, options)
        return Call(
            "POST", "/v1/variants", decode=decode_generate,
            files=variants_parts(images, params), accept=SAFETENSORS_MEDIA_TYPE,
            timeout=http_timeout(options.get("timeout_s"), self.default_timeout),
        )

    def sample(
        self, recipe: str, *, labels: str | Sequence[str] | None = None, n: int = SAMPLE_N,
        wait_s: float = SAMPLE_WAIT_S,
    ) -> Call[SampleResult]:
        return Call(
            "POST", f"/v1/recipes/{recipe}/sample",
            decode=lambda content: decode_sample(content, recipe),
            body=sample_body(labels, n, wait_s), accept=SAFETENSORS_MEDIA_TYPE,
            timeout=self.default_timeout + wait_s,
        )

    def info(self) -> Call[dict[str, Any]]:
        return Call("GET", "/v1/info", decode=_json)

    def recipes(self) -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/recipes", decode=lambda content: _json(content)["recipes"])

    def recipe(self, name: str) -> Call[dict[str, Any]]:
        return Call("GET", f"/v1/recipes/{name}", decode=_json)

    def fill(
        self, name: str, per_label: int | None = None, images: int | None = None,
        notify_url: str | None = None,
    ) -> Call[dict[str, Any]]:
        """``per_label``: fill every label to that many; ``images``: that many more, split
        by need; ``notify_url``: where the service POSTs the job once it ended. Only what is
        given is sent (the service requires exactly one of the first two)."""
        body = {key: value for key, value in (("per_label", per_label), ("images", images),
                                              ("notify_url", notify_url))
                if value is not None}
        return Call("POST", f"/v1/recipes/{name}/fill", decode=_json, body=body)

    def job(self, job_id: str) -> Call[dict[str, Any]]:
        return Call("GET", job_path(job_id), decode=_json)

    def jobs(self, recipe: str | None = None, state: str | None = None,
             limit: int = JOBS_LIMIT) -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/jobs" + jobs_query(recipe, state, limit),
                    decode=lambda content: _json(content)["jobs"])

    def cancel_job(self, job_id: str) -> Call[dict[str, Any]]:
        return Call("POST", job_path(job_id) + "/cancel", decode=_json)

    def forget_job(self, job_id: str) -> Call[dict[str, Any]]:
        return Call("DELETE", job_path(job_id), decode=_json)

    def feedback(self, name: str, need: Mapping[str, float]) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/recipes/{name}/feedback", decode=_json,
                    body={"need": need_body(need)})

    def verdict(self, name: str, label: str, seeds: Iterable[int], keep: bool
                ) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/recipes/{name}/verdicts", decode=_json,
                    body={"label": label, "seeds": [int(s) for s in seeds], "keep": keep})
