"""The time-slice policy: when the batch in the pipeline yields, and which batch runs next.

The batcher (:class:`~genaug.service.batching.batcher.Batcher`) asks these two questions and
does what they say; the fair queue (:class:`~genaug.service.batching.queue.FairQueue`) keeps
the ledger they read.

**People first.** Interactive work waiting pauses bulk and pool work at the next denoising
step boundary; pool work yields to people only (bulk requests wait for it).

**Time slices.** Within one priority, a request batch (interactive or bulk) pauses the same
way once the group that opened it has been served ``slice`` more than a group that waits
(queued or paused) with none of its images in the batch: the flight is told *when*
(:meth:`Flight.pause_at <genaug.service.batching.items.Flight.pause_at>`), from the fair
queue's ledger plus the segment's own running time, and told again whenever the queue
changes. A lone client is never paused. The next batch is the least-served group's, its
oldest paused batch before new work (:func:`pick`).

Example::

    when = yield_at(running, queue, paused, slice_s=1.0)  # clock time, -inf, or None
    running.flight.pause_at(when)
    nxt = pick(paused, queue)  # a paused Batch, the queue's head, or None
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .queue import Batch, FairQueue, group_of
from .request import PRIORITIES, Priority, QueuedRequest

_RANK = {p: i for i, p in enumerate(PRIORITIES)}


def yield_at(batch: Batch, queue: FairQueue, paused: Sequence[Batch], *,
             slice_s: float) -> float | None:
    """When ``batch`` (in the pipeline) should pause, on the flight's clock; ``None``: never.

    Interactive work waiting pauses bulk and pool work at once. Otherwise a request batch
    yields to the least-served group waiting at its own priority (queued, or among ``paused``)
    with no image in it, once the batch's opener has been served ``slice_s`` more: the ledger
    at the segment's start plus the opener's share of the segment's running time."""
    if batch.idle is not None or batch.priority != "interactive":
        if queue.has("interactive"):
            return -math.inf
        if batch.idle is not None:
            return None  # pool work yields to people only; bulk requests wait for it
    inside = batch.groups
    least = queue.least_served(batch.priority, inside)
    for other in paused:
        if other.idle is None and other.priority == batch.priority and \
                other.opener not in inside:
            served = queue.served(other.opener)
            least = served if least is None else min(least, served)
    if least is None:
        return None  # nobody else waits: a lone client is never paused
    share = batch.share_of(batch.opener)
    if share <= 0:
        return None
    behind = least + slice_s - queue.served(batch.opener)
    return batch.segment_start + behind / share


def pick(paused: Sequence[Batch], queue: FairQueue
         ) -> Batch | tuple[Priority, str, QueuedRequest] | None:
    """What runs next: a paused batch to resume, or the queue's head to open a batch.

    Highest priority first (a paused pool batch counts as bulk, ahead of every bulk
    group: it holds a pool reservation); within it the least-served group; a group's
    oldest paused batch before its new work. A paused batch whose requests are all gone
    goes first: it only frees its place. ``paused`` is oldest first."""
    head = queue.head()
    best: Batch | None = None
    best_rank: tuple[int, float] | None = None
    for batch in paused:  # oldest first: ties keep the oldest
        if batch.idle is None and all(part.request.finished for part in batch.parts):
            return batch  # nobody waits for it: it ends at its first step boundary
        served = -math.inf if batch.idle is not None else queue.served(batch.opener)
        rank = (_RANK[batch.priority], served)
        if best_rank is None or rank < best_rank:
            best, best_rank = batch, rank
    if best is not None and best_rank is not None:
        if head is None or best_rank <= (_RANK[head[0]], queue.served(group_of(head[1]))):
            return best
    return head
