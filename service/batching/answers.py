"""What a batch's end means for its callers and the books: one request, apart from scheduling.

The :class:`~genaug.service.batching.batcher.Batcher` decides what runs and when; when a
segment of a batch ends (the batch finished, paused at a step boundary, or failed) it calls
here, on the event loop, and this module settles it:

- :func:`charge`: the segment's generator seconds, to the fair queue's ledger and to each
  client's usage, split over the batch's requests by cost (:func:`shares`);
- :func:`answer`: a finished batch's images to their requests (or a 500 per request with an
  image that failed), its rows cut at a step boundary counted as dropped, and the counts of
  ``GET /v1/clients``, the throughput history and the recent thumbnails;
- :func:`answer_failure`: a batch whose pipeline call raised: every request in it fails with
  one error id, which the service log carries with the traceback.

Storing a pool batch is not done here: the batcher hands it to its store thread.

Example::

    charge(batch, seconds=0.4, queue=queue, activity=activity)
    answer(batch, outcome, queue=queue, activity=activity, metrics=metrics)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..errors import GenerationFailedError, ShuttingDownError, new_id
from ..metrics import Metrics
from .items import Outcome
from .queue import Batch, FairQueue, Part
from .usage import POOL_CLIENT, Activity

# The batcher's logger (this module's answers are the batcher's): log filters and the
# reliability check that finds a failed batch's error id (reliability/faults.py) read
# "genaug.service.batching.batcher".
log = logging.getLogger("genaug.service.batching.batcher")

SHUTTING_DOWN = "the service is shutting down; retry on a replica"


def shares(parts: Sequence[Part], images: int) -> list[float]:
    """Each part's share (0 to 1) of a segment of the batch that holds ``parts``: by
    :func:`~genaug.service.batching.queue.image_cost`, or by image count where the parts
    carry no cost (``images`` is the batch's image count)."""
    total = sum(part.cost for part in parts)
    return [part.cost / total if total > 0 else part.count / images for part in parts]


def charge(batch: Batch, seconds: float, *, queue: FairQueue, activity: Activity) -> None:
    """Charge a segment of ``batch`` that took ``seconds`` (start or resume to end, pause or
    failure): to the fair queue's ledger and to each client's usage; a pool batch's to
    :data:`~genaug.service.batching.usage.POOL_CLIENT`."""
    batch.seconds += seconds
    if batch.idle is not None:
        activity.used(POOL_CLIENT, seconds)
        return
    queue.settle(batch.parts, seconds)
    for part, share in zip(batch.parts, shares(batch.parts, len(batch.items)), strict=True):
        activity.used(part.request.client, seconds * share)


def answer(batch: Batch, outcome: Outcome, *, queue: FairQueue, activity: Activity,
           metrics: Metrics) -> None:
    """``batch`` ran to its end with ``outcome``: answer each request and count it."""
    for timer in batch.timers:
        timer.cancel()
    made = len(batch.items) - len(outcome.dropped)
    activity.remember(outcome)
    if batch.idle is not None:
        activity.record(made, batch.seconds, "pool")
        stats = activity.client(POOL_CLIENT)
        stats.requests += 1
        stats.images += made
        return
    queue.release(batch.parts)
    activity.record(made, batch.seconds, "request")
    offset = 0
    for part in batch.parts:
        rows = range(offset, offset + part.count)
        offset += part.count
        stats = activity.client(part.request.client)
        dropped = [i for i in rows if i in outcome.dropped]
        if dropped:
            reason = part.request.cancel_reason or "shutting_down"
            metrics.dropped_in_pipeline.labels(reason).inc(len(dropped))
            metrics.steps_saved.labels(reason).inc(sum(outcome.dropped[i] for i in dropped))
            part.request.fail(ShuttingDownError(SHUTTING_DOWN))  # (already answered: a no-op)
            continue
        failed = [i for i in rows if i in outcome.errors]
        if failed:
            stats.failed += 1
            error_id = new_id()
            log.error(
                "request %s: %d images failed (error id %s): %s",
                part.request.id,
                len(failed),
                error_id,
                outcome.errors[failed[0]],
            )
            part.request.fail(
                GenerationFailedError(
                    f"{len(failed)} of this request's images could not be generated: "
                    f"{outcome.errors[failed[0]]} (error id {error_id})",
                    error_id=error_id,
                )
            )
        else:
            stats.images += part.count
            part.request.deliver(part.start, outcome.images[rows.start : rows.stop])


def answer_failure(batch: Batch, exc: Exception, *, queue: FairQueue, activity: Activity,
                   metrics: Metrics) -> None:
    """``batch``'s pipeline call raised ``exc`` (called from its ``except``, so the log has
    the traceback): fail every request in it, or tell a pool batch's source."""
    for timer in batch.timers:
        timer.cancel()
    if batch.idle is not None:
        log.exception("pre-generation batch failed (error id %s)", new_id())
        metrics.batch_failures.labels("exception").inc()
        if batch.idle.on_failed is not None:
            batch.idle.on_failed(exc)
        return
    queue.release(batch.parts)
    error_id = new_id()
    log.exception(
        "batch of %d images failed (error id %s); failing its %d requests",
        len(batch.items),
        error_id,
        len(batch.parts),
    )
    metrics.batch_failures.labels(type(exc).__name__).inc()
    for part in batch.parts:
        activity.client(part.request.client).failed += 1
        part.request.fail(
            GenerationFailedError(
                f"generation failed for this request's batch ({type(exc).__name__}); "
                f"error id {error_id} is in the service log; retrying may succeed",
                error_id=error_id,
            )
        )
