"""The calls: every route of the API as one :class:`Call` (method, path, body, answer type,
timeout), built in one place, :class:`Calls`, and sent by both clients alike.

A client method is one line: build the call, send it (``_flows.send_call``: the replica, the
retries; the client takes its steps), decode the answer with the call's own decoder. A
route's path or body changes here only.

Example::

    call = Calls(default_timeout=60.0).sample("digits", labels=["3"], n=8)
    call.method, call.path                   # "POST", "/v1/recipes/digits/sample"
    result = call.decode(response.content)   # a SampleResult
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Unpack

from genaug.wire import PNG_MEDIA_TYPE, SAFETENSORS_MEDIA_TYPE

from ._jobs import JOBS_LIMIT, job_path, jobs_query
from ._options import (
    SAMPLE_N,
    SAMPLE_WAIT_S,
    GenerateOptions,
    Multipart,
    VariantOptions,
    need_body,
    request_body,
    sample_body,
    variants_parts,
)
from ._results import GenerateResult, SampleResult, decode_generate, decode_sample, expect_png
from .errors import DecodeError

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call, fully described: both clients send it and decode the answer with it."""

    method: str
    path: str
    decode: Callable[[bytes], T]
    body: dict[str, Any] | None = None
    accept: str | None = None
    timeout: float | None = None
    files: Multipart | None = None

    def content(self) -> dict[str, Any]:
        """The request body as httpx keyword arguments: JSON, or multipart parts."""
        if self.files is not None:
            return {"files": self.files}
        return {"json": self.body}


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError as exc:
        raise DecodeError(f"expected JSON from the service: {exc}") from exc


def http_timeout(timeout_s: float | None, default: float) -> float:
    """The HTTP timeout for a call whose deadline is ``timeout_s``: the service answers 504
    at the deadline, so leave it a moment to say so."""
    return max(default, timeout_s + 5.0) if timeout_s is not None else default


class Calls:
    """Builders for every call of the API (the one place that knows paths and bodies)."""

    def __init__(self, default_timeout: float) -> None:
        self.default_timeout = default_timeout

    def generate(
        self, prompt: str, *, png: bool = False, **options: Unpack[GenerateOptions]
    ) -> Call[Any]:
        body = request_body("generate", prompt, options)
        return Call(
            "POST", "/v1/generate",
            decode=expect_png if png else decode_generate,
            body=body, accept=PNG_MEDIA_TYPE if png else SAFETENSORS_MEDIA_TYPE,
            timeout=http_timeout(options.get("timeout_s"), self.default_timeout),
        )

    def variants(
        self, images: Any, prompt: str, **options: Unpack[VariantOptions]
    ) -> Call[GenerateResult]:
        params = request_body("variants", prompt, options)
        return Call(
            "POST", "/v1/variants", decode=decode_generate,
            files=variants_parts(images, params), accept=SAFETENSORS_MEDIA_TYPE,
            timeout=http_timeout(options.get("timeout_s"), self.default_timeout),
        )

    def sample(
        self, recipe: str, *, labels: str | Sequence[str] | None = None, n: int = SAMPLE_N,
        wait_s: float = SAMPLE_WAIT_S,
    ) -> Call[SampleResult]:
        return Call(
            "POST", f"/v1/recipes/{recipe}/sample",
            decode=lambda content: decode_sample(content, recipe),
            body=sample_body(labels, n, wait_s), accept=SAFETENSORS_MEDIA_TYPE,
            timeout=self.default_timeout + wait_s,
        )

    def info(self) -> Call[dict[str, Any]]:
        return Call("GET", "/v1/info", decode=_json)

    def recipes(self) -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/recipes", decode=lambda content: _json(content)["recipes"])

    def recipe(self, name: str) -> Call[dict[str, Any]]:
        return Call("GET", f"/v1/recipes/{name}", decode=_json)

    def fill(
        self, name: str, per_label: int | None = None, images: int | None = None,
        notify_url: str | None = None,
    ) -> Call[dict[str, Any]]:
        """``per_label``: fill every label to that many; ``images``: that many more, split
        by need; ``notify_url``: where the service POSTs the job once it ended. Only what is
        given is sent (the service requires exactly one of the first two)."""
        body = {key: value for key, value in (("per_label", per_label), ("images", images),
                                              ("notify_url", notify_url))
                if value is not None}
        return Call("POST", f"/v1/recipes/{name}/fill", decode=_json, body=body)

    def job(self, job_id: str) -> Call[dict[str, Any]]:
        return Call("GET", job_path(job_id), decode=_json)

    def jobs(self, recipe: str | None = None, state: str | None = None,
             limit: int = JOBS_LIMIT) -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/jobs" + jobs_query(recipe, state, limit),
                    decode=lambda content: _json(content)["jobs"])

    def cancel_job(self, job_id: str) -> Call[dict[str, Any]]:
        return Call("POST", job_path(job_id) + "/cancel", decode=_json)

    def forget_job(self, job_id: str) -> Call[dict[str, Any]]:
        return Call("DELETE", job_path(job_id), decode=_json)

    def feedback(self, name: str, need: Mapping[str, float]) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/recipes/{name}/feedback", decode=_json,
                    body={"need": need_body(need)})

    def verdict(self, name: str, label: str, seeds: Iterable[int], keep: bool
                ) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/recipes/{name}/verdicts", decode=_json,
                    body={"label": label, "seeds": [int(s) for s in seeds], "keep": keep})
