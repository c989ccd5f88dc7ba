"""Content negotiation for the routes that answer bytes: which of a route's media types the
request's ``Accept`` header asks for (RFC 9110 section 12.5.1), or a 406 naming them.

A route declares what it answers once, as :class:`Offers` (:data:`BATCH`: the safetensors
batch or one PNG grid; :data:`IMAGE`: one PNG). The same declaration documents the route's
200 and 406 answers in ``/openapi.json`` (:meth:`Offers.responses`) and chooses the answer of
each request (:meth:`Offers.choose`), first thing in the handler: a request that accepts none
of the types is refused before its body is read or any generation is queued, so a 406 costs
no GPU time. Every offer also comes as ``application/octet-stream`` (the same bytes), the one
binary type client generators read as bytes without configuration.

The ``Accept`` parser is the RFC's grammar, small enough to hold here (no dependency of the
service parses it): comma-separated media ranges (``*/*``, ``type/*``, ``type/subtype``) with
parameters (quoted strings included) and a weight ``q`` of at most three decimals in [0, 1].
A range that does not parse, or whose ``q`` does not, accepts nothing.

Example::

    answer = BATCH.choose(request)        # 406 here when Accept admits none of them
    if answer.payload == PNG_MEDIA_TYPE: ...
    return Response(payload, media_type=answer.media_type, headers={"Vary": "Accept"})
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from fastapi import Request

from genaug.wire import PNG_MEDIA_TYPE, SAFETENSORS_MEDIA_TYPE

from ..errors import ServiceError
from .responses import ErrorBody, binary_answer

#: Any bytes: every binary answer is also offered under this type.
OCTET_STREAM = "application/octet-stream"

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_OWS = r"[ \t]*"
_PAIR = rf"({_TOKEN}){_OWS}={_OWS}({_TOKEN}|{_QUOTED})"
# Each parameter follows its own ";" and whitespace is matched once: no backtracking over
# a long run of spaces.
_RANGE = re.compile(rf"{_OWS}({_TOKEN})/({_TOKEN}){_OWS}((?:;{_OWS}(?:{_PAIR}{_OWS})?)*)")
_PARAMETER = re.compile(_PAIR)
_QVALUE = re.compile(r"0(?:\.\d{0,3})?|1(?:\.0{0,3})?")


class NotAcceptableError(ServiceError):
    """The ``Accept`` header admits none of the media types the route answers (406, with
    ``Vary: Accept``: :mod:`~genaug.service.api.errors`)."""


class MediaRange(NamedTuple):
    """One member of an ``Accept`` header: ``type/subtype`` (either may be ``*``), its
    media-type parameters (lower-cased names; those before ``q``) and its weight."""

    type: str
    subtype: str
    parameters: tuple[tuple[str, str], ...]
    q: float

    def specificity(self, media: str) -> int:
        """How exactly this range names ``media`` (a type without parameters): 3 for
        ``type/subtype``, 2 for ``type/*``, 1 for ``*/*``; 0 when it does not match (a range
        with parameters matches only a type with the same ones: none here)."""
        kind, _, sub = media.partition("/")
        if self.parameters:
            return 0
        if (self.type, self.subtype) == ("*", "*"):
            return 1
        if self.type != kind:
            return 0
        return 2 if self.subtype == "*" else 3 if self.subtype == sub else 0


def _members(header: str) -> Iterator[str]:
    """The comma-separated members of a list header, commas inside quoted strings kept (a
    scan, not a regular expression: linear in the header's length whatever its quotes)."""
    start, quoted, escaped = 0, False, False
    for i, char in enumerate(header):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            yield header[start:i]
            start = i + 1
    yield header[start:]


def parse_accept(header: str) -> list[MediaRange]:
    """The media ranges of an ``Accept`` value that parse, in order. A member that is not
    ``type/subtype`` with well-formed parameters, ``*/subtype``, or a ``q`` that is not a
    qvalue (``0`` to ``1``, at most three decimals) is left out: it accepts nothing.

    Example: ``parse_accept('image/*;q=0.5, text/banana')`` gives two ranges, the first with
    ``q`` 0.5."""
    ranges: list[MediaRange] = []
    for element in _members(header):
        found = _RANGE.fullmatch(element)
        if found is None:
            continue
        kind, sub = found.group(1).lower(), found.group(2).lower()
        if kind == "*" and sub != "*":
            continue
        parameters: list[tuple[str, str]] = []
        q: float | None = 1.0
        for name, value in _PARAMETER.findall(found.group(3)):
            if name.lower() == "q":
                q = float(value) if _QVALUE.fullmatch(value) else None
                break  # what follows the weight is an extension, not the media type's
            parameters.append((name.lower(), value))
        if q is not None:
            ranges.append(MediaRange(kind, sub, tuple(parameters), q))
    return ranges


def preferred(header: str | None, offers: tuple[str, ...]) -> str | None:
    """The one of ``offers`` that ``header`` prefers, or None when it admits none. Each
    offer's weight is the ``q`` of the most specific range that matches it; the highest
    weight wins, then the offer matched more specifically (``image/png`` over ``image/*``
    over ``*/*``), then the earlier offer. No header, or an empty one: ``offers[0]``.

    Example: ``preferred("image/png, */*", BATCH.types)`` is ``image/png``."""
    if header is None or not header.strip():
        return offers[0]
    ranges = parse_accept(header)
    best: tuple[float, int, int] | None = None
    chosen = None
    for order, offer in enumerate(offers):
        matched = [(r.specificity(offer), r.q) for r in ranges if r.specificity(offer)]
        if not matched:
            continue
        specificity, q = max(matched)  # the most specific range decides (at a tie, its best q)
        key = (q, specificity, -order)
        if q > 0 and (best is None or key > best):
            best, chosen = key, offer
    return chosen


class Answer(NamedTuple):
    """What one request gets: the ``Content-Type`` to send and whose bytes it labels (one of
    the route's own types: ``application/octet-stream`` carries the route's first)."""

    media_type: str
    payload: str


@dataclass(frozen=True)
class Offers:
    """The media types a route answers, in the service's order of preference (the first is
    what a request without ``Accept`` gets), each also as ``application/octet-stream``.

    Example::

        @router.get("/v1/recent.png", response_class=Response,
                    responses={**IMAGE.responses("The most recent images as one grid PNG.")})
        async def recent_png(request: Request) -> Response:
            answer = IMAGE.choose(request)
    """

    own: tuple[str, ...]

    @property
    def types(self) -> tuple[str, ...]:
        """Every type offered: the route's own, then :data:`OCTET_STREAM`."""
        return (*self.own, OCTET_STREAM)

    def choose(self, request: Request) -> Answer:
        """The answer ``request``'s ``Accept`` header prefers (:func:`preferred`; several
        ``Accept`` lines read as one list); :class:`NotAcceptableError` (406) naming the
        offered types when it admits none."""
        lines = request.headers.getlist("accept")
        header = ", ".join(lines) if lines else None
        chosen = preferred(header, self.types)
        if chosen is None:
            given = header or ""
            shown = given if len(given) <= 120 else given[:117] + "..."
            raise NotAcceptableError(
                f"Accept {shown!r} admits none of the types {request.url.path} answers "
                f"({', '.join(self.types)}); send Accept: {self.own[0]} (or one of the others, "
                f"or */*), or no Accept header for {self.own[0]}",
                field="Accept")
        return Answer(chosen, self.own[0] if chosen == OCTET_STREAM else chosen)

    def responses(self, description: str) -> dict[int | str, dict[str, Any]]:
        """The route's 200 (each offered type, its bytes; ``description`` says what they
        hold) and its 406, for the route's ``responses=``."""
        return {
            **binary_answer(description, *self.types),
            406: {"model": ErrorBody,
                  "description": f"The Accept header admits none of {', '.join(self.types)} "
                                 "(a missing Accept header, or */*, gets "
                                 f"{self.own[0]}): nothing was done."},
        }


#: The batch routes (``/v1/generate``, ``/v1/variants``, a recipe's sample): the safetensors
#: batch, or one PNG grid.
BATCH = Offers((SAFETENSORS_MEDIA_TYPE, PNG_MEDIA_TYPE))
#: The routes that answer one PNG (``/v1/recent.png``, a pool image).
IMAGE = Offers((PNG_MEDIA_TYPE,))
