"""The HTTP edge: where a request enters and its answer leaves.

In the order a request meets them: ``guard`` (API keys, body limits; pure ASGI), ``fastpath``
(the pool sample answered from the ASGI call; pure ASGI), ``router`` (the one router) over the
routes per resource, ``status``, ``generate`` and ``recipes``, which read what they need from
the request through ``requests``, choose the media type of a binary answer through
``negotiation`` and answer with ``responses``; ``handlers`` turn errors into
the one error shape, ``openapi`` serves the schema, ``state`` is what the routes see.
Imports the intake, batching and the pool (recipes and the pipeline only as types); nothing
imports it but ``app.py`` and ``testing.py``. Importing it loads no torch (tested).
"""
