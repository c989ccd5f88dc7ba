"""Generation throughput with webhooks hanging on a receiver that never answers vs. without.

The real path, in one run: one service runs in this process (``create_app`` with the tiny
model under uvicorn, in a thread whose event loop is built as uvicorn builds it), started with
``GENAUG_WEBHOOK_HOSTS`` naming the receiver's ``127.0.0.1:<port>`` and a
``GENAUG_WEBHOOK_SECRET``, a tiny recipe (two labels, 32x32, 2 steps; pool on a temporary
SQLite file, pregeneration off). Before each webhooks phase, ``--deliveries`` fill jobs
(``POST /v1/recipes/bench/fill`` with ``per_label`` 1 and ``notify_url`` the receiver) are
started on a pool that already holds one image per label, so each ends ``done`` at once; the
app's :class:`~genaug.service.jobs.loop.JobLoop` claims their webhooks from the pool and hands
them to its sender, and the phase is measured once all of them wait there on the receiver.
Interleaved rounds, three phases:

- ``none``: ``clients`` async clients ask for ``n=B`` images back to back
  (:func:`bench.services.saturate`, as ``service_throughput`` does); no webhook pending (the
  job loop still polls the pool every second, as it does in service).
- ``shipped``: the same, while the jobs' webhooks hang in the app's own sender
  (``state.job_loop.sender``, :class:`WebhookSender`'s defaults: 8 attempts at once,
  ``timeout_s`` 10, back-off from 1 s): the case the goal is about.
- ``stress``: the same path, with the job loop's sender swapped for one of the phase's own on
  the same loop (the service has no setting for a sender's timeouts): every delivery in an
  attempt at once (concurrency = ``--deliveries``), each timing out after
  ``--stress-timeout-s`` and retried 50-200 ms later: about ``deliveries / timeout`` new
  connections, timeouts and retries per second, about 70 times the shipped sender's steady
  rate at 64 deliveries. Its extra event-loop CPU, scaled by that rate, estimates what the
  shipped sender costs once its 10 s attempts time out (printed). The app's sender is put
  back after. Full size measures 64 images per phase: the shipped phase ends before its
  first 10 s attempts time out, which is why the estimate is printed beside it.

Beside images/s, each phase reports the CPU share of the service's event-loop thread (from
``/proc``): it hardly moves with a neighbour's load, and every second of it held the GIL that
the pipeline's thread also needs, so on a busy machine it says what the webhooks cost when the
images/s ratio is noise.

A webhooks phase is measured from a steady state (all its jobs' webhooks pending in the job
loop's sender, ``concurrency`` attempts in flight; in the stress arm every delivery has also
timed out and been retried once), and fails if any delivery ended during it. The receiver is a
listening socket that is never accepted from while measuring: the kernel completes each
connection and takes the request, and no answer ever comes, exactly as from a receiver that
hangs, at no cost to this process. After the phase it answers ``200`` to every request (after
checking its signature), so the deliveries end, the pool records each job's webhook as
delivered (what the job loop's ``on_result`` writes), and the next phase starts with none
pending. All phases share one torch thread count (``--threads``). Ratios are taken per round,
then the median.

    python -m bench.service.webhook_overhead [--quick] [--deliveries 64] [--stress-timeout-s 1]

Goal: shipped / none >= 0.95 (issue 42: "a webhook receiver that never answers: generation
keeps at least 0.95 of its throughput without webhooks"); stress / none is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.harness import finish, goal_text, interleave, main, make_parser, median, table
from bench.services import pin_threads, saturate, tiny_model, write_recipe

GOAL = 0.95
SECRET = "bench-webhook-secret-0123456789abcdef"
RECIPE = "bench"
#: A plain 200: what the receiver answers once a phase is measured.
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class HangingReceiver:
    """A socket listening on 127.0.0.1:<port 0>: while hanging nobody accepts from it
    (connections complete in the kernel's backlog, requests are buffered, nothing answers);
    :meth:`answer` then answers 200 to every request and notes the signed job ids."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(4096)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        #: Job ids of the correctly signed bodies received (any attempt, answered or not).
        self.told: set[str] = set()
        self.bad_signatures = 0

    def answer(self, until: Callable[[], bool], timeout: float = 120.0) -> None:
        """Answer whatever arrives until ``until()`` (polled between passes)."""
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise RuntimeError(f"deliveries still pending after {timeout:g} s of answers")
            while self._answer_one():
                pass
            time.sleep(0.01)

    def _answer_one(self) -> bool:
        from genaug.service.jobs.webhooks import verify

        try:
            conn, _ = self._sock.accept()
        except BlockingIOError:
            return False
        with conn:
            conn.settimeout(2.0)
            data = b""
            try:
                while b"\r\n\r\n" not in data or len(data) < _request_length(data):
                    chunk = conn.recv(65536)
                    if not chunk:  # an attempt the sender gave up on (timed out) and closed
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                headers = dict(
                    (k.strip().lower(), v.strip()) for k, _, v in
                    (line.partition(":") for line in head.decode("latin-1").split("\r\n")[1:]))
                if body and len(body) >= _request_length(data) - len(head) - 4:
                    if verify(body, SECRET, headers.get("x-genaug-signature")):
                        self.told.add(str(json.loads(body)["id"]))
                    else:
                        self.bad_signatures += 1
                conn.sendall(OK)
            except OSError:  # the sender closed it first: it retries on a new connection
                pass
        return True

    def __enter__(self) -> HangingReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


def _request_length(data: bytes) -> int:
    """Bytes of the whole request once its head is in ``data`` (a large number before)."""
    head, sep, _ = data.partition(b"\r\n\r\n")
    if not sep:
        return 1 << 30
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(head) + 4


class ServiceWithWebhooks:
    """The genaug app under uvicorn in a thread of this process, with its job loop's webhooks."""

    def __init__(self, model: Any, settings: Any) -> None:
        import uvicorn

        from genaug.service.app import create_app

        self.settings = settings
        self.url = f"http://127.0.0.1:{settings.port}"
        app = create_app(settings, loader=lambda _s: model)
        self.state = app.state.genaug
        self.config = uvicorn.Config(app, host="127.0.0.1", port=settings.port,
                                     log_level="warning", access_log=False)
        self.server = uvicorn.Server(self.config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread_id = 0
        #: The sender the app's lifespan made (``_job_loop``), kept while a stress one is in.
        self.app_sender: Any = None
        self._thread = threading.Thread(target=self._run, name="service", daemon=True)

    def _run(self) -> None:
        # The loop uvicorn would make (uvloop where installed): the one the lifespan's job
        # loop and its sender share with the HTTP server.
        with asyncio.Runner(loop_factory=self.config.get_loop_factory()) as runner:
            self.loop = runner.get_loop()
            self.loop_thread_id = threading.get_native_id()
            runner.run(self.server.serve())

    def __enter__(self) -> ServiceWithWebhooks:
        from genaug.service.testing import wait_ready

        self._thread.start()
        wait_ready(self.url, timeout=120, alive=self._thread.is_alive)
        job_loop = self.state.job_loop
        if job_loop is None or job_loop.sender is None:
            raise RuntimeError("the service started without its job loop's webhook sender: "
                               "set webhook_hosts and webhook_secret")
        self.app_sender = job_loop.sender
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def loop_cpu_s(self) -> float:
        """CPU seconds the event loop's thread has used (Linux; NaN elsewhere). Unlike
        images/s it hardly moves with a neighbour's load, and every second of it held the GIL
        the pipeline's thread also needs."""
        try:
            fields = Path(f"/proc/self/task/{self.loop_thread_id}/stat").read_text()
        except OSError:
            return float("nan")
        utime, stime = fields.rsplit(")", 1)[1].split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")

    def call(self, coroutine: Any, timeout: float = 60.0) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def use_sender(self, options: dict[str, Any] | None) -> None:
        """The job loop's sender: a new one with ``options`` (stress), or the app's (None).
        On the loop, between two of the job loop's rounds."""
        from genaug.service.jobs.webhooks import WebhookSender

        job_loop = self.state.job_loop
        current = job_loop.sender
        job_loop.sender = (self.app_sender if options is None
                           else WebhookSender(SECRET, **options))
        if current is not self.app_sender:
            await current.aclose()

    async def counts(self) -> dict[str, Any]:
        """The job loop's sender now: which one, its gauges and counters."""
        sender = self.state.job_loop.sender
        return {"sender": "app" if sender is self.app_sender else "own",
                "pending": sender.pending, "in_flight": sender.in_flight,
                "retries": sender.retries, "failed": sender.failed,
                "delivered": sender.delivered}


@contextlib.contextmanager
def running(model: Any, folder: Path, receiver: HangingReceiver,
            **settings: Any) -> Iterator[ServiceWithWebhooks]:
    from genaug.local_service import free_port
    from genaug.service.settings import Settings

    recipes = write_recipe(folder, name=RECIPE, labels=("A", "B"), size=32, steps=2)
    config = Settings(port=free_port(), model=model.source, recipes=recipes,
                      pool_path=folder / "pool.db", pregenerate=False,
                      webhook_hosts=f"127.0.0.1:{receiver.port}", webhook_secret=SECRET,
                      **settings)
    with ServiceWithWebhooks(model, config) as live:
        yield live


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "")
    parser.add_argument("--deliveries", type=int, default=None,
                        help="fill jobs whose webhooks hang during a webhooks phase "
                             "(64; quick: 16)")
    parser.add_argument("--stress-timeout-s", type=float, default=1.0,
                        help="the stress phase's per-attempt timeout: shorter churns more")
    args = parser.parse_args(argv)
    batch, clients, size, steps = 8, 4, 64, 4
    rounds = 2 if args.quick else 10
    # Full size: 64 images (about 4 s) per phase; at 24 a neighbour's burst moved single
    # rounds by +-40 % on a shared 2-core machine.
    batches_per_round = 2 if args.quick else 8
    deliveries = args.deliveries or (16 if args.quick else 64)
    from genaug.service.jobs.webhooks import CONCURRENCY, TIMEOUT_S

    arms: dict[str, dict[str, Any] | None] = {
        "shipped": None,  # the app's own sender, as the lifespan made it
        # Retried quickly and never given up within a run: every delivery stays in flight.
        "stress": {"concurrency": deliveries, "timeout_s": args.stress_timeout_s,
                   "base_delay_s": 0.05, "max_delay_s": 0.2, "max_elapsed_s": 3600.0},
    }
    concurrency = {"shipped": min(deliveries, CONCURRENCY),
                   "stress": deliveries}
    # The shipped sender's steady attempt rate against a silent receiver: concurrency
    # attempts per timeout (plus a back-off that only grows); the stress one's.
    shipped_rate = concurrency["shipped"] / TIMEOUT_S
    stress_rate = deliveries / (args.stress_timeout_s + 0.1)
    # A retried or cancelled delivery is logged: expected here, not news.
    logging.getLogger("genaug.service.jobs.webhooks").setLevel(logging.ERROR)

    import httpx

    from genaug.client import AsyncClient

    pin_threads(args.threads)
    model = tiny_model()
    loop = asyncio.new_event_loop()
    counts: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    loop_cpu: dict[str, list[float]] = {"none": [], **{arm: [] for arm in arms}}
    with tempfile.TemporaryDirectory() as tmp, HangingReceiver() as receiver, running(
        model, Path(tmp), receiver, max_batch_images=batch, max_wait_ms=10,
        max_queue_images=4096,
    ) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        client = AsyncClient(live.url, client_id="bench", timeout=120)

        def job_state(job_id: str) -> dict[str, Any]:
            got = http.get(f"/v1/jobs/{job_id}")
            got.raise_for_status()
            return dict(got.json())

        def fill(notify_url: str | None) -> str:
            body: dict[str, Any] = {"per_label": 1}
            if notify_url is not None:
                body["notify_url"] = notify_url
            got = http.post(f"/v1/recipes/{RECIPE}/fill", json=body)
            if got.status_code != 200:
                raise RuntimeError(f"fill: HTTP {got.status_code}: {got.text}")
            return str(got.json()["job"]["id"])

        def wait(what: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
            deadline = time.monotonic() + timeout
            while not ready():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not in {timeout:g} s: {what}")
                time.sleep(0.02)

        def generate(arm: str = "none") -> float:
            if arm == "none" and (found := live.call(live.counts()))["pending"]:
                raise RuntimeError(f"none: webhooks pending in the job loop's sender: {found}")
            cpu, started = live.loop_cpu_s(), time.perf_counter()
            rate = loop.run_until_complete(saturate(
                client, concurrency=clients, requests=batches_per_round, n=batch, height=size,
                width=size, steps=steps, guidance=5.0,
            ))
            loop_cpu[arm].append((live.loop_cpu_s() - cpu) / (time.perf_counter() - started))
            return float(rate)

        def hanging(arm: str) -> float:
            live.call(live.use_sender(arms[arm]))
            before = live.call(live.counts())
            jobs = [fill(receiver.url) for _ in range(deliveries)]
            # Measure from a steady state: every job ended and its webhook in the job loop's
            # sender, every attempt in flight, and for the stress arm every delivery already
            # timed out and retried once.
            settled = deliveries if arm == "stress" else 0
            steady: dict[str, Any] = {}

            def is_steady() -> bool:
                steady.update(live.call(live.counts()))
                return bool(steady["pending"] == deliveries
                            and steady["in_flight"] >= concurrency[arm]
                            and steady["retries"] - before["retries"] >= settled)

            wait(f"{arm}: {deliveries} webhooks hanging in the job loop's sender "
                 f"({concurrency[arm]} in flight, {settled} retried): {steady}", is_steady)
            rate = generate(arm)
            found = live.call(live.counts())
            ended = {k: found[k] - steady[k] for k in ("failed", "delivered")}
            if found["pending"] != deliveries or any(ended.values()):
                raise RuntimeError(f"{arm}: deliveries ended during the phase: {found}")
            phase = {**found, "retries": found["retries"] - before["retries"],
                     "retries_measured": found["retries"] - steady["retries"],
                     "failed": found["failed"] - before["failed"],
                     "delivered": found["delivered"] - before["delivered"],
                     "in_flight_steady": steady["in_flight"], "jobs": len(jobs)}
            # Answer now: the deliveries end, the job loop records them in the pool.
            receiver.told.clear()
            receiver.answer(lambda: live.call(live.counts())["pending"] == 0)
            after = live.call(live.counts())
            phase["received"] = len(receiver.told & set(jobs))
            phase["delivered_after"] = after["delivered"] - before["delivered"]
            wait(f"{arm}: the pool records every webhook delivered",
                 lambda: all((job_state(j)["webhook"] or {}).get("state") == "delivered"
                             for j in jobs))
            phase["recorded"] = len(jobs)
            live.call(live.use_sender(None))
            counts[arm].append(phase)
            return rate

        try:
            # One image per label, so that every later per_label=1 fill ends at once.
            first = fill(None)
            wait("the first fill's job done", lambda: job_state(first)["state"] == "done", 120)
            generate()  # first connections, first batches
            loop_cpu["none"].clear()
            values = interleave(rounds, {"none": generate,
                                         "shipped": lambda: hanging("shipped"),
                                         "stress": lambda: hanging("stress")})
        finally:
            loop.run_until_complete(client.aclose())
            loop.close()
        bad_signatures = receiver.bad_signatures

    ratios = {arm: [w / n for w, n in zip(values[arm], values["none"], strict=True)]
              for arm in arms}
    ratio = {arm: median(r) for arm, r in ratios.items()}
    retries = {arm: median([float(c["retries_measured"]) for c in found])
               for arm, found in counts.items()}
    cpu = {arm: median(v) for arm, v in loop_cpu.items()}
    # What the shipped sender takes once its 10 s attempts start timing out: the stress arm's
    # extra event-loop CPU per attempt, at the shipped rate. A pipeline thread that needs the
    # GIL throughout (the tiny model on the CPU) loses at most that share of its time.
    shipped_steady = 1 - max(0.0, cpu["stress"] - cpu["none"]) * shipped_rate / stress_rate
    met = ratio["shipped"] >= GOAL
    table(
        f"Generation while fill jobs' webhooks hang on a silent receiver vs. none: in-process "
        f"service, batch {batch}, {size}x{size}, {steps} steps, {args.threads} torch "
        f"thread(s), {rounds} rounds",
        ["phase", "images/s (median)", "ratio vs none", "event-loop CPU", "goal"],
        [
            ["none", median(values["none"]), "1.00", cpu["none"], ""],
            [f"shipped: {deliveries} jobs' webhooks in the app's sender, "
             f"{concurrency['shipped']} in flight, timeout_s {TIMEOUT_S:g} "
             f"({retries['shipped']:.0f} retries/phase)",
             median(values["shipped"]), ratio["shipped"], cpu["shipped"],
             f">= {GOAL} {goal_text(met)}"],
            [f"stress: {deliveries} in flight in the job loop's own sender, timeout_s "
             f"{args.stress_timeout_s:g} (~{stress_rate:.0f} attempts/s, "
             f"{retries['stress']:.0f} retries/phase)",
             median(values["stress"]), ratio["stress"], cpu["stress"], "(report)"],
            [f"shipped once its attempts time out (~{shipped_rate:.1f} attempts/s): 1 - "
             "stress's extra loop CPU at that rate", "", shipped_steady, "", "(estimate)"],
        ],
    )
    for arm in arms:
        print(f"per-round ratios {arm}: {', '.join(f'{r:.3f}' for r in ratios[arm])}")
    return finish(
        {
            "benchmark": "webhook_overhead",
            "batch": batch,
            "clients": clients,
            "threads": args.threads,
            "rounds": rounds,
            "deliveries": deliveries,
            "stress_timeout_s": args.stress_timeout_s,
            "images_s": values,
            "phases": counts,
            "bad_signatures": bad_signatures,
            "ratios": ratios,
            "ratio_shipped": ratio["shipped"],
            "ratio_stress": ratio["stress"],
            "loop_cpu": loop_cpu,
            "shipped_steady_estimate": shipped_steady,
            "goal": GOAL,
            "met": met,
        },
        args.json,
    )


if __name__ == "__main__":
    main(run)
