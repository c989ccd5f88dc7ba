"""The curation routes: a person looks through a recipe's pool and takes images out of it.

- ``POST /v1/recipes/{name}/verdicts``: reject (``keep: false``) or restore (``keep: true``)
  images of one label by seed; all or nothing (a seed the label has no image of: 404, nothing
  applied). A rejected image is never sampled again, by any replica of the pool.
- ``GET /v1/recipes/{name}/images``: one page of a label's accepted or rejected images with
  their judge scores (what the pool page shows); each seed also as a decimal string
  (``seed_str``) and its PNG's path, since a browser reads 63-bit JSON numbers with lost
  digits. The verdicts route takes a seed as an integer or as that string.
- ``GET /v1/recipes/{name}/images/{label}/{seed}.png``: one image's pixels.
- ``GET /pool/{name}``: the pool page itself (``static/pool.html``), open like the status page;
  its script sends the API key to the routes above. An unknown recipe is a 404.

docs/curation.md describes what a verdict does to the pool's counts.

Example::

    curl -X POST http://127.0.0.1:8000/v1/recipes/digits/verdicts \\
         -d '{"label": "3", "seeds": [17, 42], "keep": false}'
"""

from __future__ import annotations

import asyncio
import html
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, Response

from genaug.wire import encode_png_grid

from ..intake.fields import SEED_MAX
from ..intake.parse import read_body
from ..intake.schemas import MAX_BROWSE_LIMIT
from .negotiation import IMAGE
from .recipes import _hints, _pools_for
from .requests import known_query, state_of
from .responses import (
    RECIPE_ERRORS,
    ImagePage,
    PoolImageInfo,
    VerdictResponse,
    error_responses,
)

POOL_PAGE = Path(__file__).parents[1] / "static" / "pool.html"
#: The largest ``offset`` a listing takes (far beyond any pool; keeps the number a database
#: integer).
MAX_BROWSE_OFFSET = 10**9

router = APIRouter()


@router.post(
    "/v1/recipes/{name}/verdicts", response_model=VerdictResponse, tags=["recipes"],
    responses=RECIPE_ERRORS,
)
async def verdicts(name: str, request: Request) -> VerdictResponse:
    """A person's verdict on images of one label, named by their seeds: ``keep: false``
    rejects them (never sampled again, on every replica; the label's fill drops and the
    planner makes replacements), ``keep: true`` restores them (also overriding the judge's
    reject). All or nothing: a seed the label has no image of is a 404 naming it, and
    nothing is applied. Answers the seeds that changed and the label's counts now."""
    state = state_of(request)
    pools = _pools_for(state, name)
    body = await read_body(request, state.api.verdicts[name], _hints(state, "verdicts", name))
    answer = await asyncio.to_thread(pools.verdict, name, body.label, body.seeds, body.keep)
    return VerdictResponse(**answer)


@router.get(
    "/v1/recipes/{name}/images", response_model=ImagePage, tags=["recipes"],
    responses=error_responses(404, 422, 503), dependencies=[Depends(known_query)],
)
async def list_images(
    name: str,
    request: Request,
    label: Annotated[str, Query(description="The label to list.")],
    rejected: Annotated[bool, Query(
        description="false: the accepted images (samples may return them); true: the "
                    "rejected ones (by the judge or a person).")] = False,
    offset: Annotated[int, Query(ge=0, le=MAX_BROWSE_OFFSET,
                                 description="Images to skip.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_BROWSE_LIMIT,
                                description="Most images to list.")] = 50,
) -> ImagePage:
    """One page of a label's accepted (or rejected) images with their judge scores, the
    least-scored first (unjudged last), then the oldest; each with the path of its PNG."""
    pools = _pools_for(state_of(request), name)
    page, stats = await asyncio.to_thread(
        pools.browse, name, label, rejected=rejected, offset=offset, limit=limit)
    base = f"/v1/recipes/{quote(name, safe='')}/images/{quote(label, safe='')}"
    return ImagePage(
        recipe=name, label=label, rejected=rejected, total=page.total, offset=offset,
        limit=limit, accepted=stats.accepted, rejected_by_judge=stats.rejected,
        rejected_by_person=stats.rejected_by_person,
        images=[PoolImageInfo(**image.as_dict(), seed_str=str(image.seed),
                              png=f"{base}/{image.seed}.png")
                for image in page.images],
    )


@router.get(
    "/v1/recipes/{name}/images/{label}/{seed}.png",
    tags=["recipes"],
    response_class=Response,
    responses={**IMAGE.responses("The image as a PNG (greyscale for one-channel recipes)."),
               **error_responses(404, 422, 503)},
)
async def image_png(
    name: str,
    label: str,
    seed: Annotated[int, PathParam(ge=0, le=SEED_MAX, description="The image's seed.")],
    request: Request,
) -> Response:
    """One pool image, accepted or rejected, as a PNG (not counted as served)."""
    answer = IMAGE.choose(request)
    pools = _pools_for(state_of(request), name)
    image = await asyncio.to_thread(pools.image, name, label, seed)
    payload = encode_png_grid(image[None])
    return Response(payload, media_type=answer.media_type,
                    headers={"Cache-Control": "private, max-age=3600", "Vary": "Accept"})


@router.get("/pool/{name}", response_class=HTMLResponse, include_in_schema=False)
async def pool_page(name: str, request: Request) -> HTMLResponse:
    """The pool page of a recipe: each label's images as a paged contact sheet with their
    judge scores, accepted and rejected apart, and a button per image to reject or restore
    it. Open (no key, no data in it); its script asks for the key when the API needs one.
    An unknown recipe is a 404 page of one line (:func:`unknown_pool_page`)."""
    state = state_of(request)
    if name not in state.recipes:
        return unknown_pool_page(name, sorted(state.recipes), keyed=bool(state.settings.api_keys))
    return HTMLResponse(POOL_PAGE.read_text(encoding="utf-8"),
                        headers={"Cache-Control": "no-store"})


def unknown_pool_page(name: str, known: list[str], *, keyed: bool) -> HTMLResponse:
    """The 404 of ``/pool/{name}`` for a recipe this service lacks: one line naming it and
    the known ones. The page is open, so with API keys set the names stay behind the key
    (the status page lists them once a key is entered), as ``/v1/recipes`` keeps them."""
    if keyed:
        where = "the status page (/) lists this service's recipes once given an API key"
    else:
        where = "this service has: " + (", ".join(known) or "none (set GENAUG_RECIPES)")
    line = f"no recipe named {name[:80]!r}; {where}"
    return HTMLResponse(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>genaug pool: no such recipe</title></head>"
        f"<body><p id=\"error\">{html.escape(line)}</p></body></html>\n",
        status_code=404, headers={"Cache-Control": "no-store"})
