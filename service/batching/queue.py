"""The fair queue: admitted requests waiting for the pipeline, and how a batch is taken.

A synchronous data structure with no I/O, no threads and no clock of its own (callers pass
``now``), so it is unit-tested directly (``tests/service/batching/test_queue.py``). The
:class:`~genaug.service.batching.batcher.Batcher` owns one and drives it from the event loop.

Order of service:

1. **Priority.** ``interactive`` images go before ``bulk`` ones.
2. **Round-robin between clients, hierarchically.** Each priority keeps one FIFO of requests per
   client identity; a batch is filled one image per identity *group* per turn, and the group
   that opened a batch goes to the back for the next one. A group is an API key (identities
   ``key-XXXXXXXX/<client id>`` share their key's turn, the key's client ids taking it in
   rotation), or one identity on its own. A trainer that floods 200 images shares every
   batch with a notebook that asks for one, and a key holder sending ten client ids gets
   the turn of one.
3. **Time, not turns, picks who opens a batch.** Each group is charged the generator
   seconds its images took, measured per segment of a batch (from its start or resume to
   its end or pause) and split over the batch's images by :func:`image_cost` (latent pixels
   x steps x UNet rows): :meth:`FairQueue.settle`. The next batch is opened by the group, in
   the highest priority with work, that has been served the least so far (start-time fair
   queueing, equivalent to deficit round-robin). A client asking 1024x1024 at 50 steps opens
   batches as often as its cost allows, not one per turn. The same ledger tells the batcher
   when a batch in the pipeline should yield to a less-served group (time slices,
   :meth:`FairQueue.least_served`).
4. **Lag is kept, credit is bounded.** A group counts as competing while it has work
   queued, in the pipeline or paused. A new group joins level with the least-served
   competitor. A group the ledger already knows (it was served since the generator was
   last idle) keeps its own standing, but at most one slice behind the least-served
   competitor: a client that keeps two requests in flight loses no lag in the moment
   between an answer and its next request, and waiting saves up at most one slice of
   credit, with which it goes first at the next step boundary.
5. **Grouping.** A batch holds only images of one :class:`~genaug.service.batching.items.GroupKey`;
   requests of other keys keep their place.

Why one file, long as it is: :class:`FairQueue` is one class with one request, the
order of service above, and each of its methods reads the same state (the FIFOs per priority
and client, the rotation, the ledger of time served, the images held by a batch). The rest is
what it hands out (:class:`Part`, the :class:`Batch` parts make) and
the two measures its ledger keeps (:func:`image_cost`, :func:`group_of`).

Example::

    queue = FairQueue()
    queue.push(request)                    # a QueuedRequest made by Batcher.submit
    priority, client, head = queue.head()
    parts = queue.take(head.key, capacity=8, now=time.monotonic(),
                       opened_by=(priority, client))
    queue.images                           # images still waiting
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from .items import Flight, GroupKey, IdleWork, Item, Paused
from .request import PRIORITIES, Priority, QueuedRequest

_KEY_ID = re.compile(r"key-[0-9a-f]{8}")
_LEDGER_SIZE = 1024  # groups kept on the ledger before those not competing are forgotten


@dataclass
class Part:
    """``count`` consecutive images of ``request``, from item ``start``, inside one batch;
    ``cost`` is their :func:`image_cost` summed (what their share of the batch's time is
    split by)."""

    request: QueuedRequest
    start: int
    count: int
    cost: float = 0.0

    @property
    def items(self) -> list[Item]:
        return self.request.items[self.start : self.start + self.count]


@dataclass
class Batch:
    """One pipeline batch from its first step to its end, across pauses: request ``parts``
    (taken by :meth:`FairQueue.take`), or pool ``idle`` work (then ``parts`` is empty).

    ``priority`` is its opener's (pool work counts as ``bulk``), ``opener`` the group that
    opened it. The batcher speaks to it in the pipeline through ``flight``; ``paused`` holds
    it between segments, ``segment_start`` is when its current segment began, ``seconds``
    sums its generator time, ``timers`` are its requests' deadlines."""

    key: GroupKey
    parts: list[Part]
    idle: IdleWork | None = None
    priority: Priority = "bulk"
    opener: str = ""
    flight: Flight = field(default_factory=Flight)
    paused: Paused | None = None
    segment_start: float = 0.0
    seconds: float = 0.0  # generator time over all its segments
    timers: list[asyncio.TimerHandle] = field(default_factory=list)

    @property
    def groups(self) -> set[str]:
        """The identity groups with images in this batch."""
        return {group_of(part.request.client) for part in self.parts}

    def share_of(self, group: str) -> float:
        """``group``'s share of this batch's cost, 0 to 1 (how its time is split)."""
        total = sum(part.cost for part in self.parts)
        mine = sum(part.cost for part in self.parts if group_of(part.request.client) == group)
        return mine / total if total > 0 else 0.0

    @property
    def items(self) -> list[Item]:
        if self.idle is not None:
            return self.idle.items
        return [item for part in self.parts for item in part.items]

    def rows_of(self, request: QueuedRequest) -> list[int]:
        """The rows of ``request``'s images in this batch."""
        rows: list[int] = []
        offset = 0
        for part in self.parts:
            if part.request is request:
                rows.extend(range(offset, offset + part.count))
            offset += part.count
        return rows


class FairQueue:
    """Requests by priority, then by client FIFO; OrderedDict order is the round-robin order.

    ``slice_s`` is the time slice (``GENAUG_SLICE_MS``): the most credit a group joining gets
    over the least-served competitor (module docstring, 4)."""

    def __init__(self, *, slice_s: float = 0.0) -> None:
        self._queues: dict[Priority, OrderedDict[str, deque[QueuedRequest]]] = {
            p: OrderedDict() for p in PRIORITIES
        }
        self.images = 0  # images waiting, over all requests
        self.slice_s = slice_s
        self._rotation: dict[str, int] = {}  # group -> turns taken, to rotate its clients
        self._served: dict[str, float] = {}  # group -> generator seconds served (measured)
        self._holding: dict[str, int] = {}  # group -> batches of it in the pipeline or paused

    # -- adding and removing -------------------------------------------------------------

    def push(self, request: QueuedRequest) -> None:
        group = group_of(request.client)
        active = self._active()
        if not active:
            self._served.clear()  # nobody competing: everyone starts even
        elif group not in active:
            # A new group starts level with the least-served competitor; one the ledger still
            # knows keeps its own standing, but at most one slice behind that competitor: a
            # client between two of its requests loses no lag, and waiting saves up no
            # more credit than one slice (with which it goes first at the next step).
            floor = min(self._served.get(g, 0.0) for g in active)
            own = self._served.get(group)
            self._served[group] = floor if own is None else max(own, floor - self.slice_s)
            if len(self._served) > _LEDGER_SIZE:  # many identities come and go: forget them
                for g in [g for g in self._served if g not in active and g != group]:
                    del self._served[g]
        self._queues[request.priority].setdefault(request.client, deque()).append(request)
        self.images += request.pending

    def hold(self, parts: list[Part]) -> None:
        """The batch of ``parts`` is in the pipeline (or paused) until :meth:`release`: its
        groups keep their ledger while they have nothing queued."""
        for group in {group_of(p.request.client) for p in parts}:
            self._holding[group] = self._holding.get(group, 0) + 1

    def release(self, parts: list[Part]) -> None:
        """The batch of ``parts`` has ended (or failed)."""
        for group in {group_of(p.request.client) for p in parts}:
            left = self._holding.get(group, 0) - 1
            if left > 0:
                self._holding[group] = left
            else:
                self._holding.pop(group, None)

    def _active(self) -> set[str]:
        """Groups with work queued, in the pipeline or paused."""
        queued = {group_of(c) for queues in self._queues.values() for c in queues}
        return queued | set(self._holding)

    def served(self, group: str) -> float:
        """Generator seconds ``group`` has been served, on the ledger's scale (comparable
        between groups, not an absolute total: see ``GET /v1/clients`` for those)."""
        return self._served.get(group, 0.0)

    def least_served(self, priority: Priority, exclude: set[str]) -> float | None:
        """The least ledger among groups with ``priority`` work queued, not in ``exclude``;
        ``None`` when there is none."""
        groups = [g for g in _groups(self._queues[priority]) if g not in exclude]
        if not groups:
            return None
        return min(self.served(g) for g in groups)

    def queued(self) -> Iterator[QueuedRequest]:
        for queues in self._queues.values():
            for fifo in queues.values():
                yield from fifo

    @property
    def requests(self) -> int:
        """Requests with images waiting."""
        return sum(len(fifo) for queues in self._queues.values() for fifo in queues.values())

    def has(self, priority: Priority) -> bool:
        """Whether any request of ``priority`` has images waiting."""
        return any(
            request.pending for fifo in self._queues[priority].values() for request in fifo
        )

    def by_client(self) -> dict[str, int]:
        """Images waiting per client identity (cancelled requests not counted)."""
        out: dict[str, int] = {}
        for request in self.queued():
            if request.pending and request.cancel_reason is None:
                out[request.client] = out.get(request.client, 0) + request.pending
        return out

    def prune(self, now: float) -> list[QueuedRequest]:
        """Remove requests that no longer need the pipeline (cancelled, expired); return those
        that still had images waiting, with their ``pending`` images given up."""
        removed: list[QueuedRequest] = []
        for queues in self._queues.values():
            for client in list(queues):
                kept: deque[QueuedRequest] = deque()
                for request in queues[client]:
                    if request.pending and request.alive(now):
                        kept.append(request)
                    elif request.pending:
                        self.images -= request.pending
                        removed.append(request)
                if kept:
                    queues[client] = kept
                else:
                    del queues[client]
        return removed

    def drain(self) -> list[QueuedRequest]:
        """Remove and return every request (shutdown)."""
        requests = list(self.queued())
        for queues in self._queues.values():
            queues.clear()
        self.images = 0
        return requests

    # -- choosing the next batch ---------------------------------------------------------

    def head(self) -> tuple[Priority, str, QueuedRequest] | None:
        """The request that opens the next batch: in the highest priority with work, the group
        that has been served the least generator cost (ties: round-robin order), and within
        it the client whose turn it is."""
        for priority in PRIORITIES:
            queues = self._queues[priority]
            groups = _groups(queues)
            if not groups:
                continue
            group = min(groups, key=lambda g: self._served.get(g, 0.0))
            clients = groups[group]
            client = clients[self._rotation.get(group, 0) % len(clients)]
            return priority, client, queues[client][0]
        return None

    def waiting(self, key: GroupKey) -> tuple[float, int]:
        """(earliest admission time, images waiting) over the requests of ``key``."""
        oldest = math.inf
        count = 0
        for request in self.queued():
            if request.key == key:
                oldest = min(oldest, request.admitted)
                count += request.pending
        return oldest, count

    def take(
        self, key: GroupKey, *, capacity: int, now: float, opened_by: tuple[Priority, str]
    ) -> list[Part]:
        """Take up to ``capacity`` images of ``key``: priority first, then one image per
        identity group per turn, and within a group (an API key's client ids) the clients in
        rotation. The group that opened the batch goes to the back of its priority.

        Requests handed their first image get ``started = now``.
        """
        parts: dict[str, Part] = {}
        for priority in PRIORITIES:
            queues = self._queues[priority]
            while capacity and queues:
                took = False
                groups = _groups(queues)
                opener = group_of(opened_by[1])
                if opener in groups:  # the group that opened the batch takes the first image
                    groups = {opener: groups.pop(opener), **groups}
                for group, clients in groups.items():
                    request = self._next_request(queues, group, clients, key)
                    if request is None:
                        continue
                    part = parts.get(request.id)
                    if part is None:
                        part = parts[request.id] = Part(request, request.next_index, 0)
                        if request.started is None:
                            request.started = now
                    part.count += 1
                    part.cost += image_cost(key, request.items[request.next_index])
                    request.next_index += 1
                    self.images -= 1
                    capacity -= 1
                    took = True
                    if not request.pending:
                        fifo = queues[request.client]
                        fifo.remove(request)
                        if not fifo:
                            del queues[request.client]
                    if not capacity:
                        break
                if not took:
                    break
        head_priority, head_client = opened_by
        queues = self._queues[head_priority]
        for client in [c for c in queues if group_of(c) == group_of(head_client)]:
            queues.move_to_end(client)
        live = {group_of(c) for queues in self._queues.values() for c in queues}
        self._rotation = {g: n for g, n in self._rotation.items() if g in live}
        return list(parts.values())

    def settle(self, parts: list[Part], seconds: float) -> None:
        """A segment of the batch of ``parts`` (from its start or resume to its end or pause)
        took ``seconds`` of generator time: charge each part's group its share, split by cost.

        Measured time includes what the cost formula leaves out (text encoding, decoding,
        per-batch overheads), so shares converge on generator time, not on the formula."""
        total = sum(p.cost for p in parts)
        if total <= 0 or seconds <= 0:
            return
        for part in parts:
            group = group_of(part.request.client)
            self._served[group] = self._served.get(group, 0.0) + seconds * part.cost / total

    def _next_request(
        self, queues: OrderedDict[str, deque[QueuedRequest]], group: str, clients: list[str],
        key: GroupKey,
    ) -> QueuedRequest | None:
        """The request of ``key`` that gives ``group`` its image this turn: its clients take
        turns."""
        start = self._rotation.get(group, 0)
        for step in range(len(clients)):
            client = clients[(start + step) % len(clients)]
            request = next((j for j in queues[client] if j.key == key and j.pending), None)
            if request is not None:
                self._rotation[group] = start + step + 1
                return request
        return None


def image_cost(key: GroupKey, item: Item) -> float:
    """What one image costs the generator, in latent-pixel denoising steps: latent pixels
    (an 8x-downscaled height x width) x steps x UNet rows (two with classifier-free guidance,
    ``guidance > 1``: the unconditional half runs too)."""
    rows = 2 if item.guided else 1
    return (key.height / 8) * (key.width / 8) * key.steps * rows


def group_of(client: str) -> str:
    """The top level of a client identity, the group that takes one turn: the API key's id
    for ``key-XXXXXXXX/<client id>`` (all of a key's client ids share that key's turn),
    otherwise the client id's first part (``trainer-a/r0/w1``: a trainer's ranks and
    DataLoader workers are one trainer), else the identity itself."""
    head, sep, _ = client.partition("/")
    return head if sep and head else client


def trainer_of(client: str) -> str:
    """The trainer a client identity belongs to, for the need it reports: the identity up to
    its client id's first part (``key-1a2b3c4d/trainer-a/r0/w1`` -> ``key-1a2b3c4d/trainer-a``,
    ``trainer-a/r0/w1`` -> ``trainer-a``): each trainer's ranks and workers report as one."""
    parts = client.split("/")
    keep = 2 if _KEY_ID.fullmatch(parts[0]) else 1
    return "/".join(parts[:keep])


def _groups(queues: OrderedDict[str, deque[QueuedRequest]]) -> dict[str, list[str]]:
    """Clients by group, groups in the order their first client stands in ``queues``."""
    out: dict[str, list[str]] = {}
    for client in queues:
        out.setdefault(group_of(client), []).append(client)
    return out
