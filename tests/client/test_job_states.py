"""A job's states cross the wire: :mod:`genaug.job_states` defines them once, and both sides
read them from there. Pinned here on both: the enum the service serves for ``GET /v1/jobs``'
``state`` filter (in ``/openapi.json``, from a running service with recipes), the choices of
``genaug jobs list --state``, and the states the clients wait for."""

from __future__ import annotations

import argparse
from typing import Any

import httpx

from genaug import job_states
from genaug.client import _jobs


def test_the_states_are_the_enum_the_service_serves_for_the_jobs_state_filter(
        fill_service: Any) -> None:
    spec = httpx.get(fill_service.url + "/openapi.json", timeout=30).json()
    parameters = spec["paths"]["/v1/jobs"]["get"]["parameters"]
    state = next(p for p in parameters if p["name"] == "state" and p["in"] == "query")
    enums = [s["enum"] for s in state["schema"].get("anyOf", [state["schema"]]) if "enum" in s]
    assert enums == [list(job_states.STATES)], state


def test_genaug_jobs_list_takes_the_same_states() -> None:
    from genaug.jobs import add_arguments

    parser = argparse.ArgumentParser(prog="genaug jobs")
    add_arguments(parser)
    actions = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listing = actions.choices["list"]
    state = next(a for a in listing._actions if a.dest == "state")
    assert state.choices is job_states.STATES


def test_the_clients_wait_for_the_ended_states() -> None:
    """A watch ends at every ended state and at no live one (the states, not a copy)."""
    assert set(job_states.LIVE) | set(job_states.ENDED) == set(job_states.STATES)
    for state in job_states.STATES:
        watch = _jobs.JobWatch("j_0123456789abcdef", timeout=None, poll_s=1.0)
        assert watch.seen({"id": watch.job_id, "state": state}) is (
            state in job_states.ENDED), state
