"""``Client``: the synchronous client (httpx), for notebooks and scripts. It only sends and
sleeps: it takes the steps of the flows ``_flows`` writes once for both clients; ``_base`` and
the modules beside it decide (``_progress`` draws a wait's bar). Same methods as
``AsyncClient``, without ``await``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx
import numpy as np

from ._base import BaseClient
from ._calls import Call
from ._flows import Flow, Run, Sleep, Step, send_call, wait_job, wait_ready
from ._jobs import JOB_POLL_S, JOBS_LIMIT, FillAnswer, JobWatch, OnUpdate
from ._options import SAMPLE_N, SAMPLE_WAIT_S, GenerateOptions, VariantOptions
from ._progress import job_bar
from ._results import GenerateResult, SampleResult
from ._transport import mounts

T = TypeVar("T")


class Client:
    """Synchronous client for one or several genaug services.

    Example::

        with Client("http://127.0.0.1:8000") as client:
            client.wait_ready()
            result = client.generate("depth image of a wound", n=4, seed=1)
            result.images.shape  # (4, 64, 64, 3) on the tiny default

    ``url`` may be a list of replicas; each call goes to the healthy one with the fewest
    outstanding requests. Connection errors, 429 and 503 are retried with backoff and jitter,
    honouring ``Retry-After``, for at most ``retry_deadline`` seconds per call. ``api_key``
    and ``url`` default to ``GENAUG_API_KEY`` and ``GENAUG_URL``. A URL that is not
    ``http(s)://HOST[:PORT]`` (or a ``GENAUG_URL`` entry that is not) is a ``ValueError`` here,
    in one line naming it and the fix, before anything is sent.
    """

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        *,
        api_key: str | None = None,
        client_id: str | None = None,
        timeout: float = 60.0,
        retry_deadline: float = 30.0,
    ) -> None:
        self._base = BaseClient(
            url, api_key=api_key, client_id=client_id, timeout=timeout,
            retry_deadline=retry_deadline, owner="Client",
        )
        # http:// goes over the standard library's http.client (see _transport: a sample of
        # 64 images is ms faster); https:// and proxies stay with httpx's own transport.
        self._http = httpx.Client(timeout=timeout, mounts=mounts())

    @property
    def urls(self) -> list[str]:
        return self._base.urls

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, call: Call[T]) -> T:
        return self._run(send_call(self._base, call))

    def _run(self, flow: Flow[T]) -> T:
        """Take ``flow``'s steps (``_flows``: send, sleep) and return what it returns."""
        run = Run(flow)
        while (step := run.next_step()) is not None:
            try:
                run.reply = self._take(step)
            except BaseException as exc:  # Ctrl-C too: the flow's ``finally`` runs
                run.failure = exc
        return run.result

    def _take(self, step: Step) -> httpx.Response | None:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        return self._http.request(step.method, step.url, headers=step.headers,
                                  timeout=step.timeout, **step.content)

    def generate(self, prompt: str, **options: Unpack[GenerateOptions]) -> GenerateResult:
        """Generate ``n`` images; ``seed`` makes them reproducible (image i uses seed + i).

        The options (keywords only, all optional) are :class:`GenerateOptions`: ``n``,
        ``height``, ``width``, ``negative_prompt``, ``output_height``, ``output_width``,
        ``steps``, ``guidance``, ``seed``, ``priority``, ``timeout_s``, ``scheduler``,
        ``adapter``, ``adapter_scale``, ``speed``. ``adapter`` / ``adapter_scale`` pick one of
        the service's LoRA adapters (``info()["adapters"]``), ``scheduler`` one of its
        schedulers, ``speed="turbo"`` its few-step setting (``info()["turbo"]``); unset: its
        defaults.
        """
        result: GenerateResult = self._call(self._base.calls.generate(prompt, **options))
        return result

    def generate_png(self, prompt: str, **options: Unpack[GenerateOptions]) -> bytes:
        """Like :meth:`generate`, but one PNG (a grid when n > 1), e.g. to show in a notebook."""
        png: bytes = self._call(
            self._base.calls.generate(prompt, png=True, **options))
        return png

    def variants(
        self, images: np.ndarray, prompt: str, **options: Unpack[VariantOptions]
    ) -> GenerateResult:
        """``n_per_image`` img2img variants of each of ``images`` (uint8 ``[N, H, W, 3]`` or
        one ``[H, W, 3]``), guided by ``prompt``.

        The options are :class:`VariantOptions`: ``strength``, ``n_per_image`` and the
        shared ones of :meth:`generate` (without ``n``, ``height``, ``width``).
        ``strength`` in (0, 1]: how far from the source a variant may go (1 ignores it). The
        sources are generated at their own size (all one size, a multiple of 8); the
        result's ``sources`` says which input each output came from, source-major, and
        ``seed`` makes them reproducible. Raises ``ValueError`` for images of another
        dtype or shape, before anything is sent.

        Example::

            out = client.variants(real_images, "a handwritten three", strength=0.5,
                                  n_per_image=4, seed=0)
            out.images[out.sources == 0]   # the 4 variants of the first image
        """
        result: GenerateResult = self._call(
            self._base.calls.variants(images, prompt, **options))
        return result

    def sample(
        self, recipe: str, *, labels: str | Sequence[str] | None = None, n: int = SAMPLE_N,
        wait_s: float = SAMPLE_WAIT_S,
    ) -> SampleResult:
        """Up to ``n`` pre-generated images of ``recipe``, spread over ``labels`` (default all:
        label names, strings even where they are digits; a number raises ``TypeError``).

        With ``wait_s`` > 0 the service waits up to that long for generation when its pool
        holds too few; the count returned may still be below ``n`` (never an error). It does
        not wait for a label its judge stopped (no more images of it are made; once every
        label it waits for is stopped or full it answers with what it has), and
        ``result.stopped`` names those labels with the judge's reason and fix.
        """
        return self._call(self._base.calls.sample(recipe, labels=labels, n=n, wait_s=wait_s))

    def info(self) -> dict[str, Any]:
        """Model identity, device, dtype, limits and version."""
        return self._call(self._base.calls.info())

    def recipes(self) -> list[dict[str, Any]]:
        """The service's recipes with their pools' fill per label."""
        return self._call(self._base.calls.recipes())

    def recipe(self, name: str) -> dict[str, Any]:
        """One recipe: spec, pool identity, fill, generated and served counts."""
        return self._call(self._base.calls.recipe(name))

    def fill(
        self, recipe: str, per_label: int | None = None, images: int | None = None, *,
        notify_url: str | None = None,
    ) -> FillJob:
        """Hand the service a fill of ``recipe``'s pool; returns at once with the
        :class:`FillJob` the service runs it as (``wait()`` for it, ``cancel()`` it), which
        reads as the fill's answer: the recipe's counts and targets (``job["fill"]``,
        ``job["budget"]``). Give one of:

        - ``per_label``: fill every label to at least that many images;
        - ``images``: generate that many more, split over the labels by the trainers'
          combined need (:meth:`feedback`) and recent demand, each label within the pool
          capacity (a fixed generation budget spent where it is needed). Asked-for images
          go before background pre-generation, so on a pre-generating service, whose labels
          are already headed for the capacity, this moves that much of the remaining work
          forward. The answer's ``budget`` says what happens (``asked`` is less than
          ``images`` when less room is left; a full pool is :class:`ConflictError`, 409).

        ``notify_url``: the service POSTs the job there once it ends (an ``https://`` URL on a
        host the operator allowed, ``GENAUG_WEBHOOK_HOSTS``; docs/webhooks.md).

        Example::

            job = client.fill("digits", images=2000)
            job["budget"]["asked"]          # what the service took on
            done = job.wait(timeout=600)    # the job once it ended
            done["state"]                   # "done", or "stopped" (done["reason"] says why)
        """
        answer = self._call(self._base.calls.fill(recipe, per_label, images, notify_url))
        return FillJob(self, answer)

    def job(self, job_id: str) -> dict[str, Any]:
        """The job ``job_id`` now: its ``state`` (queued, running; then done, stopped, failed
        or cancelled), ``reason``, per-label counts (``labels``), ``asked``, ``accepted``,
        ``missing``, ``rate`` and ``eta_s``. An unknown id is :class:`NotFoundError`."""
        return self._call(self._base.calls.job(job_id))

    def jobs(self, recipe: str | None = None, state: str | None = None,
             limit: int = JOBS_LIMIT) -> list[dict[str, Any]]:
        """The most recent jobs (of ``recipe``, in ``state``), newest first, at most
        ``limit``.

        Example::

            [j["id"] for j in client.jobs("digits", state="running")]
        """
        return self._call(self._base.calls.jobs(recipe, state, limit))

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a queued or running job; returns it, ``cancelled``. What it asked for and
        no live job still wants is no longer made (what is made or being made is kept). A job
        that already ended is :class:`ConflictError` (409, naming its state), an unknown id
        :class:`NotFoundError`."""
        return self._call(self._base.calls.cancel_job(job_id))

    def forget_job(self, job_id: str) -> dict[str, Any]:
        """Forget a job: the service removes it (a queued or running one is cancelled first,
        as :meth:`cancel_job` does; its webhook is never sent); returns it as it was
        forgotten. Asking for it afterwards is :class:`NotFoundError`, as is an unknown id."""
        return self._call(self._base.calls.forget_job(job_id))

    def wait_job(self, job_id: str, timeout: float | None = None, *,
                 poll_s: float = JOB_POLL_S, progress: bool | None = None,
                 on_update: OnUpdate | None = None) -> dict[str, Any]:
        """Poll the job every ``poll_s`` seconds until it ended; returns it (``state`` done,
        stopped, failed or cancelled: a stopped job's ``reason`` names each label the judge
        stopped, with its fix). ``progress``: a tqdm bar on stderr (``None``: where stderr is
        a terminal). ``on_update``: called with the job after every poll, the last included
        (a bar or a log of your own; pass ``progress=False`` to draw only yours). Raises
        ``TimeoutError`` naming the job and its state after ``timeout`` seconds (``None``: no
        limit); the job goes on in the service."""
        watch = JobWatch(job_id, timeout=timeout, poll_s=poll_s, on_update=on_update)
        with job_bar(watch, progress):
            return self._run(wait_job(self._base, watch))

    def feedback(self, recipe: str, need: Mapping[str, float]) -> dict[str, Any]:
        """Tell the service what this client needs from ``recipe``'s pool: ``need`` maps
        label names to numbers >= 0 (per-class error or loss; only proportions count). The
        pre-generation planner fills labels in proportion to the need of all clients (each
        client's report normalised, so none dominates by scale); a report replaces this
        client's previous one and decays when not renewed (``GENAUG_NEED_HALF_LIFE_S``).
        ``{}`` withdraws it. Identity: the API key and ``client_id``. Returns the combined
        need now in force (``need``, ``need_clients``).

        Example::

            client.feedback("digits", {"3": 0.40, "8": 0.25, "1": 0.02})
        """
        return self._call(self._base.calls.feedback(recipe, need))

    def verdict(self, recipe: str, label: str, seeds: Iterable[int], *, keep: bool
                ) -> dict[str, Any]:
        """A person's verdict on ``recipe``'s pool images of ``label``, named by the seeds
        samples return: ``keep=False`` rejects them (never sampled again, on every replica),
        ``keep=True`` restores them (also overriding the recipe's judge). All or nothing: a
        seed the label has no image of raises :class:`NotFoundError` naming it and nothing is
        applied. Returns the seeds that changed and the label's counts now (docs/curation.md).

        Example::

            client.verdict("digits", "3", sample.seeds[:2], keep=False)
        """
        return self._call(self._base.calls.verdict(recipe, label, seeds, keep))

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once a replica answers ``/readyz`` with 200; raise after ``timeout`` s."""
        self._run(wait_ready(self._base, timeout))


class FillJob(FillAnswer):
    """A fill the service runs as a job: the fill's answer (a mapping: ``job["fill"]``,
    ``job["budget"]``), the job's ``id`` and ``url``, and what follows it, through the
    :class:`Client` that made it (keep it open meanwhile).

    Example::

        with Client("http://127.0.0.1:8000") as client:
            job = client.fill("digits", per_label=200)
            job.id                       # "j_0123456789abcdef"
            job.status()["state"]        # "queued" or "running"
            final = job.wait(timeout=600)
            if final["state"] == "stopped":
                print(final["reason"])   # each stopped label, with the judge's reason and fix
    """

    def __init__(self, client: Client, answer: dict[str, Any]) -> None:
        super().__init__(answer)
        self._client = client

    def status(self) -> dict[str, Any]:
        """The job now (:meth:`Client.job`)."""
        return self._client.job(self._job_id())

    def wait(self, timeout: float | None = None, *, poll_s: float = JOB_POLL_S,
             progress: bool | None = None, on_update: OnUpdate | None = None
             ) -> dict[str, Any]:
        """Poll until the job ended and return it (:meth:`Client.wait_job`)."""
        return self._client.wait_job(self._job_id(), timeout, poll_s=poll_s,
                                     progress=progress, on_update=on_update)

    def cancel(self) -> dict[str, Any]:
        """Cancel the job (:meth:`Client.cancel_job`); :class:`ConflictError` once it
        ended."""
        return self._client.cancel_job(self._job_id())
