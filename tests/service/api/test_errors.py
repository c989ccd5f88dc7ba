"""The edge's one table of errors (service/api/errors.py): every domain error of
service/errors.py has its own status and wire type, and the one JSON shape carries what the
error says (field, error id, Retry-After). Unit tests: no service runs."""

from __future__ import annotations

import inspect
import json

import genaug.service.errors as domain
from genaug.service.api.errors import ANSWERS, answer_of, error_response, status_of
from genaug.service.api.negotiation import NotAcceptableError


def test_every_domain_error_has_its_own_row() -> None:
    kinds = {cls for _, cls in inspect.getmembers(domain, inspect.isclass)
             if issubclass(cls, domain.ServiceError)} | {NotAcceptableError}
    assert kinds == set(ANSWERS)
    # A kind knows no status: that is the edge's.
    assert not any(hasattr(kind, "status") for kind in kinds)
    types = [answer.type for answer in ANSWERS.values()]
    assert len(set(types)) == len(types)


def test_the_statuses_clients_read() -> None:
    assert {kind.__name__: answer.status for kind, answer in ANSWERS.items()} == {
        "ServiceError": 400, "UnauthorizedError": 401, "NotFoundError": 404,
        "NotAcceptableError": 406, "ConflictError": 409, "PoolFullError": 409,
        "BodyTooLargeError": 413, "InvalidRequestError": 422, "QueueFullError": 429,
        "NotReadyError": 503, "GenerationFailedError": 503, "PoolUnavailableError": 503,
        "ShuttingDownError": 503, "DeadlineExceededError": 504}


def test_a_new_kind_is_answered_as_its_base_until_it_has_a_row() -> None:
    class StaleJobError(domain.ConflictError):
        pass

    assert answer_of(StaleJobError("the job ended")).type == "conflict"
    assert status_of(StaleJobError("the job ended")) == 409


def test_the_one_shape_with_its_headers() -> None:
    full = domain.QueueFullError("queue holds 512 images; retry after 3.2 s", retry_after_s=3.2)
    response = error_response(full)
    assert response.status_code == 429 and response.headers["Retry-After"] == "4"
    assert json.loads(response.body) == {"error": {
        "type": "queue_full", "message": "queue holds 512 images; retry after 3.2 s"}}
    failed = error_response(domain.GenerationFailedError("boom", error_id="0123456789ab"))
    assert json.loads(failed.body)["error"]["id"] == "0123456789ab"
    assert "retry-after" not in failed.headers
    refused = error_response(NotAcceptableError("Accept 'text/csv' admits none", field="Accept"))
    assert refused.status_code == 406 and refused.headers["Vary"] == "Accept"
    assert json.loads(refused.body)["error"]["field"] == "Accept"
