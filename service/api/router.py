"""The service's one router: the routes of every resource, assembled in one place, hot ones
first.

``create_app`` puts these routes at the head of the app's own table (not through
``include_router``, which FastAPI matches in an extra pass behind the docs routes). Their
order is also the order in which ``/openapi.json`` lists the paths.

- :mod:`~genaug.service.api.status`: probes, info, metrics, clients, status, the status page;
- :mod:`~genaug.service.api.generate`: ``/v1/generate`` and ``/v1/variants``;
- :mod:`~genaug.service.api.recipes`: ``/v1/recipes`` and each recipe's detail, sample, fill;
- :mod:`~genaug.service.api.jobs`: ``/v1/jobs``, each fill job's progress and its cancel;
- :mod:`~genaug.service.api.curation`: each recipe's verdicts, image listing and pool page.

Example::

    app.router.routes[:0] = router.routes
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.routing import BaseRoute

from . import curation, generate, jobs, recipes, status

# Matched first: a pool sample or a generation should not walk past the probes.
HOT_PATHS = ("/v1/recipes/{name}/sample", "/v1/generate", "/v1/variants")


def _rank(route: BaseRoute) -> int:
    path = getattr(route, "path", "")
    return HOT_PATHS.index(path) if path in HOT_PATHS else len(HOT_PATHS)


# The routes themselves, not include_router: FastAPI keeps an included router as one entry
# that it matches in a pass of its own.
router = APIRouter()
router.routes.extend(sorted(
    (route for part in (status.router, generate.router, recipes.router, jobs.router,
                  curation.router)
     for route in part.routes),
    key=_rank,
))
