"""The api role's way to the model: ``/v1/generate`` and ``/v1/variants`` sent on to a live
worker, :class:`Forwarder`.

An api (``GENAUG_ROLE=api``) loads no model. It checks a generation request as every role does
(a 406, a 413 or a 422 is answered here, naming the field), then sends the same body to a
worker that announced itself in the shared pool (:mod:`~genaug.service.pool.workers`) and
answers with the worker's answer. The workers alive are read every second by the app
(:attr:`Forwarder.alive`, the newest first); a request goes to the next of them in turn, and
to the one after when a worker gives no answer. With none alive the answer is 503 with
``Retry-After`` and one line: no worker is running, and what starts one.

Example::

    forwarder = Forwarder(read_timeout_s=3630.0)
    forwarder.alive = store.workers.alive()
    response = await forwarder.forward(request)   # the worker's answer, or a 503
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

import httpx
from fastapi import Request, Response

from ..errors import NotReadyError

if TYPE_CHECKING:
    from ..pool.workers import WorkerRow

__all__ = ["NO_WORKER", "Forwarder"]

log = logging.getLogger(__name__)

#: What a generation request at zero workers is told (with Retry-After).
NO_WORKER = ("no worker is running: generation runs on workers, this api loads no model; "
             "start one (genaug serve --role worker with the same GENAUG_POOL_URL, or scale the "
             "workers up: KEDA starts them on pending pool images); samples, fills and the pool "
             "page keep answering here")
#: Seconds a client waits before asking again at zero workers (a worker's start).
RETRY_S = 15
#: Request headers the worker needs: the body's type, the answer asked for, who asks.
_SENT = ("content-type", "accept", "authorization", "x-api-key", "x-client-id")
#: Answer headers not passed on: the connection's own, and what the bytes no longer are.
_DROPPED = {"connection", "keep-alive", "transfer-encoding", "content-length",
            "content-encoding", "date", "server"}


class Forwarder:
    """Sends generation requests on to the live workers (module doc)."""

    def __init__(self, *, read_timeout_s: float) -> None:
        #: The workers alive, newest first (the app refreshes it).
        self.alive: list[WorkerRow] = []
        self._turn = itertools.count()
        self._timeout = httpx.Timeout(10.0, read=read_timeout_s)
        self._client: httpx.AsyncClient | None = None

    async def forward(self, request: Request) -> Response:
        """The answer of a live worker to ``request`` (its body as received); a 503 with
        ``Retry-After`` when none is alive or none answers."""
        workers = list(self.alive)
        if not workers:
            raise NotReadyError(NO_WORKER, retry_after_s=RETRY_S)
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in _SENT}
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout)
        first = next(self._turn) % len(workers)
        for worker in workers[first:] + workers[:first]:
            try:
                answer = await self._client.request(
                    request.method, worker.url + request.url.path, content=body,
                    headers=headers, params=request.query_params)
            except httpx.TransportError as exc:
                log.warning("worker %s at %s gave no answer (%s); trying the next", worker.id,
                            worker.url, exc)
                continue
            return Response(answer.content, status_code=answer.status_code,
                            headers={k: v for k, v in answer.headers.items()
                                     if k.lower() not in _DROPPED})
        raise NotReadyError(f"no live worker answered ({len(workers)} announced); "
                            + NO_WORKER.split(": ", 1)[1], retry_after_s=RETRY_S)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
