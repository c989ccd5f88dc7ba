"""Authentication, secrets, secure defaults and where file paths may come from.

Checks the keys' every door (each operation of the OpenAPI schema plus the docs and unknown
paths), a timing comparison of wrong keys, that keys never reach logs or bodies, the
defaults an operator gets without configuring anything, CORS only when configured, weights
never unpickled, and that requests cannot name files.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import pickle
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from genaug.local_service import free_port
from genaug.service.testing import start_service

from .faults import RECIPE
from .harness import LogCapture, child_env, listen_addresses
from .result import CheckResult

OPEN = {"/healthz", "/readyz"}
# "/" is open on purpose: the status page's HTML shell holds no data; its script asks for the
# key and fetches the data with it (service/api/guard.py OPEN_PATHS).
OPEN_BY_DESIGN = {"/"}


def _concrete(path: str) -> str:
    return path.replace("{name}", "shapes")


def check_auth(model: Any, *, timing_requests: int = 200, workdir: Path | None = None
               ) -> CheckResult:
    result = CheckResult("Security", "auth")
    started = time.monotonic()
    key = secrets.token_hex(32)  # 64 characters
    other = "second-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        (Path(tmp) / "recipes.yaml").write_text(RECIPE)
        with LogCapture(["genaug", "uvicorn", "uvicorn.error", "fastapi"]) as logs, \
                start_service(model, record=False, api_keys=[key, other], log_level="debug",
                              recipes=Path(tmp) / "recipes.yaml", pool_path=Path(tmp) / "pool.db",
                              pool_capacity_per_label=2) as live:
            good = {"Authorization": f"Bearer {key}"}
            spec = httpx.get(live.url + "/openapi.json", headers=good, timeout=10).json()
            operations = [(m.upper(), p) for p, item in spec["paths"].items() for m in item]
            extra = [("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/redoc"),
                     ("GET", "/static-offline-docs/swagger-ui.css"), ("GET", "/v1/nope"),
                     ("POST", "/v1/nope"), ("GET", "/")]
            bodies = {"/v1/generate": {"prompt": "x", "height": 32, "width": 32, "steps": 1},
                      "/v1/recipes/shapes/sample": {"n": 1},
                      "/v1/recipes/shapes/fill": {"per_label": 1}}
            wrong_headers = [{}, {"Authorization": f"Bearer {key[:-1]}x"},
                             {"X-API-Key": key.upper()}, {"Authorization": "Basic " + key},
                             {"Authorization": f"Bearer {key}0"},
                             {"X-API-Key": ""}]
            doors = 0
            leaks: list[str] = []
            wrongly_open: list[str] = []
            wrongly_closed: list[str] = []
            observed: dict[tuple[str, str], set[int]] = {}
            with httpx.Client(base_url=live.url, timeout=30) as client:
                for method, path in operations + extra:
                    url = _concrete(path)
                    for headers in wrong_headers:
                        doors += 1
                        r = client.request(method, url, headers=headers, json=bodies.get(url))
                        observed.setdefault((method, path), set()).add(r.status_code)
                        if key in r.text or other in r.text or key in str(r.headers):
                            leaks.append(f"{method} {url}")
                        closed = r.status_code == 401
                        if path in OPEN or path in OPEN_BY_DESIGN:
                            if closed:
                                wrongly_closed.append(f"{method} {url}")
                        elif not closed:
                            wrongly_open.append(f"{method} {url} -> {r.status_code}")
                        elif r.json()["error"]["type"] != "unauthorized":
                            wrongly_open.append(f"{method} {url}: 401 without the error shape")
                    r = client.request(method, url, headers=good, json=bodies.get(url))
                    if r.status_code == 401:
                        wrongly_closed.append(f"{method} {url} with the right key")
                    r2 = client.request(method, url, headers={"X-API-Key": other},
                                        json=bodies.get(url))
                    if r2.status_code == 401:
                        wrongly_closed.append(f"{method} {url} with the second key")
                # Bodies where keys would show up if anything echoed them.
                for path in ("/metrics", "/v1/clients", "/v1/status", "/v1/info"):
                    text = client.get(path, headers=good).text
                    if key in text or other in text:
                        leaks.append(f"GET {path} (authorized)")
                # A validation error and an auth error with the key inside the request body.
                r = client.post("/v1/generate", headers=good, json={"prompt": key, "n": -1})
                if key in r.text:
                    leaks.append("422 echoes a key sent as the prompt? (the client's own "
                                 "input; not a service secret)")
                timing = _timing(client, key, timing_requests)
            log_text = logs.text
            if key in log_text or other in log_text:
                leaks.append("service log")
            # Documented statuses: every status seen here must be in the operation's responses.
            undocumented = []
            for (method, path), statuses in observed.items():
                op = spec["paths"].get(path, {}).get(method.lower())
                if op is None:
                    continue
                documented = set(op.get("responses", {}))
                missing = {s for s in statuses if str(s) not in documented}
                if missing:
                    undocumented.append(f"{method} {path}: {sorted(missing)}")
            # Recipe routes are served per recipe (/v1/recipes/shapes/sample, ...).
            body_paths = [p for p in spec["paths"] if p == "/v1/generate"
                          or re.fullmatch(r"/v1/recipes/[^/]+/(sample|fill)", p)]
            for post_path in body_paths:
                responses = spec["paths"][post_path]["post"]["responses"]
                for status in ("413", "400"):
                    if status not in responses:
                        undocumented.append(f"POST {post_path}: [{status}]")
    result.seconds = time.monotonic() - started
    closed_ops = [op for op in operations + extra if op[1] not in OPEN | OPEN_BY_DESIGN]
    result.add(f"every operation of the schema + docs, static and unknown paths, with no key "
               f"and {len(wrong_headers) - 1} kinds of wrong key", doors,
               f"{len(closed_ops)} doors closed (401 unauthorized), open: /healthz, /readyz "
               "(and / — the status page's data-free HTML shell)",
               lost="nothing" if not wrongly_open else f"{len(wrongly_open)} open doors",
               ok=not wrongly_open and not wrongly_closed,
               wrongly_open=wrongly_open[:10], wrongly_closed=wrongly_closed[:10])
    result.add("keys never in response bodies, headers, /metrics, /v1/clients, /v1/status or "
               "the service log (captured at DEBUG)", doors + 5,
               "no key found" if not leaks else f"found in {leaks}",
               lost="nothing" if not leaks else "a key", ok=not leaks)
    source = inspect.getsource(_authenticate())
    uses_digest = "hmac.compare_digest(" in source
    naive = re.findall(r"(given\w*\s*==|==\s*secret|secret\w*\s*==)", source)
    result.add("timing-safe comparison: hmac.compare_digest in authenticate(), no == on keys "
               "(source inspection)", 1, f"compare_digest used: {uses_digest}; == on keys: "
               f"{naive or 'none'}", ok=uses_digest and not naive)
    result.add(f"wrong key sharing 63 of 64 characters vs sharing none: median 401 time, "
               f"{timing['n']} interleaved requests each", 2 * int(timing["n"]),
               f"medians {timing['near_ms']:.3f} ms vs {timing['far_ms']:.3f} ms "
               f"(difference {timing['diff_ms']:+.3f} ms; tolerance {timing['tol_ms']:.3f} ms)",
               ok=abs(timing["diff_ms"]) <= timing["tol_ms"])
    result.add("statuses the service answered are documented in /openapi.json", len(observed),
               "all documented" if not undocumented else "undocumented: "
               + "; ".join(undocumented[:8]),
               lost="nothing (schema only)", ok=not undocumented,
               undocumented=undocumented)
    result.figures["timing"] = timing
    return result


def _authenticate() -> Any:
    from genaug.service.api import guard

    return guard.authenticate


def _timing(client: httpx.Client, key: str, n: int) -> dict[str, float]:
    near = key[:-1] + ("0" if key[-1] != "0" else "1")
    far = "".join("0" if c != "0" else "1" for c in key)
    assert len(near) == len(far) == len(key)
    times: dict[str, list[float]] = {"near": [], "far": []}
    for _ in range(10):  # warm the connection
        client.get("/v1/info", headers={"X-API-Key": far})
    for i in range(n):
        order = ("near", "far") if i % 2 == 0 else ("far", "near")
        for which in order:
            value = near if which == "near" else far
            t0 = time.perf_counter()
            client.get("/v1/info", headers={"X-API-Key": value})
            times[which].append(time.perf_counter() - t0)
    near_ms = statistics.median(times["near"]) * 1000
    far_ms = statistics.median(times["far"]) * 1000
    # Over HTTP the difference a naive == makes on 64 bytes is nanoseconds: this only catches
    # gross, key-dependent work; the source check above is the real guard.
    tol = max(0.3, 0.25 * min(near_ms, far_ms))
    return {"n": n, "near_ms": near_ms, "far_ms": far_ms, "diff_ms": near_ms - far_ms,
            "tol_ms": tol}


# -- secure defaults ------------------------------------------------------------------------


class _Payload:
    """Unpickling this writes a marker file (the proof that a pickle ran)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "pwned"))


def _put_env(values: dict[str, str | None]) -> None:
    """Set each variable of ``values``; None unsets it."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def _env(**values: str | None) -> Any:
    """``values`` in this process's environment for the block; what was there before after it."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _put_env(values)
        yield
    finally:
        _put_env(saved)


def check_secure_defaults(model: Any, *, workdir: Path | None = None) -> CheckResult:
    from genaug.service.settings import Settings

    result = CheckResult("Security", "secure_defaults")
    started = time.monotonic()
    genaug_env = {k: None for k in os.environ if k.startswith("GENAUG_")}
    with _env(**genaug_env):
        defaults = Settings()
    result.add("Settings() with no GENAUG_* variables", 1,
               f"host {defaults.host}, CORS origins {defaults.cors_origins or 'none'}, "
               f"max_body_bytes {defaults.max_body_bytes}, API keys "
               f"{len(defaults.api_keys)} (auth off by default: loopback only)",
               ok=defaults.host == "127.0.0.1" and not defaults.cors_origins)

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmpdir = Path(tmp)
        # A planted malicious .pt: the child must refuse it, exit non-zero, never run it.
        import torch

        marker = tmpdir / "marker"
        evil = tmpdir / "evil.pt"
        torch.save({"conv_in.weight": torch.zeros(1), "evil": _Payload(marker)}, str(evil))
        probe = tmpdir / "probe"
        pickle.loads(pickle.dumps(_Payload(probe)))  # the payload is live
        live_payload = probe.exists()
        port = free_port()
        log_path = tmpdir / "evil.log"
        cmd = [sys.executable, "-m", "genaug.service", "--port", str(port),
               "--unet-weights", str(evil)]
        binds: list[str] = []
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                                    cwd=tmpdir)
            try:
                deadline = time.monotonic() + 120
                while proc.poll() is None and time.monotonic() < deadline:
                    with contextlib.suppress(OSError):
                        binds = binds or listen_addresses(proc.pid, port)
                    time.sleep(0.02)
            finally:
                if proc.poll() is None:
                    proc.kill()
                code = proc.wait(timeout=30)
        log = log_path.read_text(errors="replace")
        clear = "refused to load UNet weights" in log and "weights_only" in log
        result.add("python -m genaug.service --unet-weights evil.pt (a pickle that writes a "
                   "file when loaded)", 1,
                   f"exit code {code}; clear message: {clear}; payload ran: {marker.exists()} "
                   f"(the same payload does run under plain pickle: {live_payload})",
                   lost="nothing",
                   ok=code not in (0, None) and clear and not marker.exists() and live_payload,
                   log_tail=log[-400:])
        result.add("child started without --host listens on", 1,
                   f"{binds or 'not observed before exit'}",
                   ok=binds == ["127.0.0.1"])

        # CORS: none unless configured; present for the configured origin only.
        preflight = {"Origin": "http://evil.test", "Access-Control-Request-Method": "POST"}
        with start_service(model, record=False) as live:
            r1 = httpx.options(live.url + "/v1/generate", headers=preflight)
            r2 = httpx.get(live.url + "/healthz", headers={"Origin": "http://evil.test"})
            none = not any(h.lower().startswith("access-control-") for h in
                           [*r1.headers, *r2.headers])
        with _env(**genaug_env, GENAUG_CORS_ORIGINS="http://app.test"):
            configured = Settings(port=free_port())
        with start_service(model, record=False, settings=configured) as live:
            ok_pre = httpx.options(live.url + "/v1/generate", headers={
                **preflight, "Origin": "http://app.test"})
            bad_pre = httpx.options(live.url + "/v1/generate", headers=preflight)
            allowed = ok_pre.headers.get("access-control-allow-origin")
            refused = "access-control-allow-origin" not in bad_pre.headers
        result.add("CORS without configuration: preflight and GET from another origin", 2,
                   f"no Access-Control-* headers: {none}", ok=none)
        result.add("GENAUG_CORS_ORIGINS=http://app.test: preflight from it and from another", 2,
                   f"allow-origin for app.test: {allowed}; for evil.test: "
                   f"{'none' if refused else bad_pre.headers.get('access-control-allow-origin')}",
                   ok=allowed == "http://app.test" and refused)

        # File paths only from settings.
        (tmpdir / "recipes.yaml").write_text(RECIPE)
        (tmpdir / "secret.txt").write_text("TOP-SECRET-CONTENT")
        with start_service(model, record=False, recipes=tmpdir / "recipes.yaml",
                           pool_path=tmpdir / "pool.db", pool_capacity_per_label=2) as live:
            attempts = [
                ("GET", "/v1/recipes/..%2Fsecret.txt"),
                ("GET", "/v1/recipes/..%2F..%2F..%2F..%2Fetc%2Fpasswd"),
                ("GET", "/v1/recipes/%2e%2e"),
                ("GET", "/v1/recipes/recipes.yaml"),
                ("POST", "/v1/recipes/..%2Fpool.db/sample"),
                ("POST", "/v1/recipes/%2Fetc%2Fpasswd/fill"),
                ("GET", "/v1/recipes/../../../../etc/passwd"),
                ("GET", "/static-offline-docs/../../../../../../etc/passwd"),
                ("GET", "/static-offline-docs/..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd"),
                ("GET", "/static-offline-docs/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd"),
                ("GET", str(tmpdir / "secret.txt")),
            ]
            answers = []
            for method, path in attempts:
                status, body = _raw(live.settings.port, method, path)
                answers.append((path, status))
                if b"root:" in body or b"TOP-SECRET" in body or b"recipes:" in body:
                    answers[-1] = (path, -status)
            spec = httpx.get(live.url + "/openapi.json").json()
        leaked = [a for a in answers if a[1] < 0 or a[1] == 200]
        recipe_404 = all(s == 404 for p, s in answers if p.startswith("/v1/recipes/%") or
                         p.startswith("/v1/recipes/.."))
        result.add("recipe names and static paths with ../, %2e%2e, %2F, absolute paths (raw "
                   "request lines)", len(attempts),
                   f"statuses {sorted({s for _, s in answers})}; recipe lookups 404: "
                   f"{recipe_404}; file contents served: {len(leaked)}",
                   lost="nothing" if not leaked else f"{leaked}", ok=not leaked and recipe_404,
                   answers=answers)
        named = _path_like_fields(spec)
        result.add("no request field or parameter of /openapi.json names a file or path", 1,
                   f"fields that could: {named or 'none'} (recipe names are keys of the "
                   "configured recipes, looked up, never opened)", ok=not named)
    result.seconds = time.monotonic() - started
    return result


def _raw(port: int, method: str, path: str) -> tuple[int, bytes]:
    """One request with the path exactly as given (clients normalise ../ away)."""
    body = b'{"n": 1}' if method == "POST" else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        data = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    try:
        status = int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0
    return status, data


def _path_like_fields(spec: dict[str, Any]) -> list[str]:
    pattern = re.compile(r"(path|file|dir|folder|weights|model|url|uri|db|location)", re.I)
    found = []
    for path, item in spec.get("paths", {}).items():
        for method, op in item.items():
            for param in op.get("parameters", []):
                if pattern.search(param.get("name", "")):
                    found.append(f"{method.upper()} {path} parameter {param['name']}")
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        if not name.endswith("Request"):
            continue
        for field in schema.get("properties", {}):
            if pattern.search(field):
                found.append(f"{name}.{field}")
    return found


logging.getLogger(__name__).addHandler(logging.NullHandler())
