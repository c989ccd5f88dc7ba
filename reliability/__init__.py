"""Reliability and security checks of the genaug service, with figures.

Each module holds the checks of one concern; each check starts a real service (the tiny
SDXL pipeline under uvicorn on 127.0.0.1), is bounded in count and time, and returns a
:class:`~reliability.result.CheckResult` (rows of what was tried, how many times, what held,
what was lost). ``python -m reliability`` runs them all and writes ``docs/reliability.md``;
``tests/reliability/`` runs them at CI size and asserts on the rows.

    load.py      concurrent clients, latency, memory, queue bound
    faults.py    SIGKILL during pool filling, generator exceptions and OOM, disconnects,
                 slow and stalled clients
    hostile.py   schemathesis fuzzing, body size limits, malformed and extreme input
    security.py  API keys, secrets in logs, secure defaults, CORS, pickles, file paths
    harness.py   child-process services, log capture, /proc readers (in-process services:
                 genaug.service.testing)
    run.py       the runner and the document
"""
