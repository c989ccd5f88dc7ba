"""Hostile input: property-based fuzzing from the service's own OpenAPI schema, oversized and
malformed bodies, numbers that are not numbers.

The fuzzed service has tight operator limits (``max_n`` 2, ``max_side`` 64, ``max_steps`` 2,
``max_timeout_s`` 2), so valid examples cost milliseconds and nothing can wait long. The
served schema carries those limits, so schemathesis generates bodies on both sides of every
bound and checks that the service agrees with its schema on each.
"""

from __future__ import annotations

import json
import re
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from genaug.service.testing import start_service

from .faults import RECIPE
from .result import CheckResult

FUZZ_LIMITS: dict[str, Any] = dict(max_n=2, max_side=64, max_steps=2, max_timeout_s=2.0,
                                   request_timeout_s=5.0, max_sample_n=8,
                                   pool_capacity_per_label=4, max_batch_images=8,
                                   max_wait_ms=5)


# -- schemathesis --------------------------------------------------------------------------

CONFIG = Path(__file__).with_name("schemathesis.toml")
FUZZ_KEY = "fuzz-key-0123456789"


def _schemathesis(url: str, examples: int, seed: int, report_dir: Path,
                  headers: dict[str, str]) -> tuple[int, str]:
    """``schemathesis run --checks all`` against ``url``; (exit code, output)."""
    import shutil
    import subprocess
    import sys

    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
    cmd = [exe, "--config-file", str(CONFIG), "run", url + "/openapi.json", "--checks", "all",
           "--max-examples", str(examples), "--seed", str(seed), "--workers", "1",
           "--report", "junit", "--report-dir", str(report_dir),
           # The JSON routes: /v1/variants takes images as binary multipart parts, whose
           # pixels no schema describes (its 422s are listed in docs/reliability.md and
           # tested in tests/service/api/test_variants_api.py).
           "--exclude-path", "/v1/variants"]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    # In the report folder: schemathesis keeps a crash cache under ./.schemathesis and replays
    # it on the next run, which would make a run depend on the checkout's earlier runs.
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=report_dir)
    return done.returncode, done.stdout + done.stderr


def _junit(report_dir: Path) -> tuple[dict[str, int], list[str]]:
    """Test cases per operation and the failures, from schemathesis's JUnit report."""
    import xml.etree.ElementTree as ET

    per_op: dict[str, int] = {}
    failures: list[str] = []
    for path in report_dir.glob("*.xml"):
        for case in ET.parse(path).iter("testcase"):
            name = case.get("name", "?")
            per_op[name] = per_op.get(name, 0) + 1
            for failure in (*case.iter("failure"), *case.iter("error")):
                text = " ".join((failure.get("message") or failure.text or "").split())
                failures.append(f"{name}: {text[:300]}")
    return per_op, failures


def check_fuzz(model: Any, *, examples: int = 25, workdir: Path | None = None,
               seed: int = 20261123) -> CheckResult:
    """``schemathesis run --checks all`` over the served ``/openapi.json`` with a recipe loaded:
    every operation, every phase (examples, coverage of the bounds, fuzzing), positive and
    negative data, ``examples`` cases each; once without and once with API keys (then
    ``ignored_auth`` checks that a missing key is refused). What the schema admits the
    service must accept, what it rejects the service must reject, and every answer must be
    one the schema documents. The one tolerated 5xx is /v1/generate's documented 504
    (reliability/schemathesis.toml)."""
    result = CheckResult("Hostile input", "fuzz")
    started = time.monotonic()
    per_op: dict[str, int] = {}
    generated = 0
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        root = Path(tmp)
        (root / "recipes.yaml").write_text(RECIPE)
        for mode, keys in (("open", []), ("with API keys", [FUZZ_KEY])):
            report = root / f"report-{len(keys)}"
            report.mkdir()
            with start_service(model, record=False, recipes=root / "recipes.yaml",
                               pool_path=root / f"pool-{len(keys)}.db", api_keys=keys,
                               **FUZZ_LIMITS) as live:
                code, output = _schemathesis(live.url, examples, seed, report, live.headers())
            ops, failures = _junit(report)
            for name, count in ops.items():
                per_op[name] = per_op.get(name, 0) + count
            found = re.search(r"(\d+) generated", output)
            cases = int(found.group(1)) if found else 0
            generated += cases
            result.add(
                f"schemathesis --checks all ({mode}): {len(ops)} operations, up to {examples} "
                "examples each, all phases", cases,
                f"{len(failures)} failures" if code == 0 or failures else
                f"exit {code}: {output.strip().splitlines()[-1][:200] if output else ''}",
                ok=code == 0 and not failures and cases > 0,
                failures=failures[:10],
                output_tail=output[-2000:] if code else "",
            )
    result.seconds = time.monotonic() - started
    result.figures.update(per_operation=per_op, generated=generated)
    return result


# -- bodies --------------------------------------------------------------------------------


def _raw_request(port: int, head: bytes, chunks: list[bytes], *, pause: float = 0.0,
                 timeout: float = 10.0) -> tuple[int, bytes, int]:
    """Send ``head`` then ``chunks`` on a raw socket, stopping if the server answers;
    return (status, body, bytes of body sent)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        answer = b""
        for chunk in chunks:
            try:
                answer += sock.recv(65536)
            except BlockingIOError:
                pass
            except OSError:
                break
            if answer:
                break
            try:
                sock.sendall(chunk)
                sent += len(chunk)
            except (BlockingIOError, OSError):
                break
            if pause:
                time.sleep(pause)
        sock.setblocking(True)
        sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            answer += data
        head_end = answer.find(b"\r\n\r\n")
        if head_end < 0:
            return 0, answer, sent
        status = int(answer.split(b" ", 2)[1])
        body = answer[head_end + 4 :]
        # the JSON error is short; read what is left of it
        while len(body) < 2 and time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                break
            body += data
        return status, body, sent


def check_size_limits(model: Any) -> CheckResult:
    """413 before parsing: a declared length over the limit is refused before a byte of body
    is read; a chunked body with no Content-Length is cut off at the limit; a JSON nest of
    100000 levels is refused by size by default."""
    result = CheckResult("Hostile input", "size_limits")
    started = time.monotonic()
    with start_service(model, record=False) as live:
        port = live.settings.port
        limit = live.settings.max_body_bytes
        # 1. Content-Length: 1 GB, no body sent at all: the answer must not wait for it.
        t0 = time.monotonic()
        status, body, _ = _raw_request(
            port, b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000000000\r\n\r\n", [], timeout=10)
        waited = time.monotonic() - t0
        error = _error_of(body)
        result.add("Content-Length 1 GB declared, no body sent", 1,
                   f"{status} {error.get('type')} after {waited * 1000:.0f} ms, before any "
                   "body byte", ok=status == 413 and waited < 5
                   and "GENAUG_MAX_BODY_BYTES" in error.get("message", ""))
        # 2. chunked, no Content-Length, 1 MiB of non-JSON in 16 KiB chunks.
        piece = b"x" * 16384
        chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
        chunks = [chunk] * 64 + [b"0\r\n\r\n"]
        outcomes = []
        for path in ("/v1/generate", "/v1/recipes/none/sample"):
            head = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n" % path.encode())
            status, body, sent = _raw_request(port, head, chunks, pause=0.002)
            outcomes.append((path, status, _error_of(body).get("type"), sent))
        result.add("chunked body without Content-Length, 1 MiB of non-JSON (limit "
                   f"{limit // 1024} KiB)", len(outcomes),
                   "; ".join(f"{p}: {s} {t}, stopped after {sent // 1024} KiB sent"
                             for p, s, t, sent in outcomes),
                   lost="nothing",
                   ok=all(s == 413 and t == "body_too_large" for _, s, t, _ in outcomes))
        refused = all(400 <= s < 500 and sent < 4 * limit for _, s, _, sent in outcomes)
        result.add("chunked body over the limit: refused and the upload cut short", len(outcomes),
                   f"4xx after at most {max(o[3] for o in outcomes) // 1024} KiB of 1024 KiB",
                   ok=refused)
        # 3. 100000 levels of [[[...]]] (200 kB) at the default limit: 413, not parsed.
        deep = b"[" * 100_000 + b"]" * 100_000
        r = httpx.post(live.url + "/v1/generate", content=deep,
                       headers={"Content-Type": "application/json"}, timeout=30)
        result.add("100000 nested JSON arrays (200 kB) at the default body limit", 1,
                   f"{r.status_code} {_error_of(r.content).get('type')}",
                   ok=r.status_code == 413)
        result.figures["max_body_bytes"] = limit
    result.seconds = time.monotonic() - started
    return result


MALFORMED: list[tuple[str, bytes, str]] = [
    # (case, body, what a clear message must mention)
    ("invalid UTF-8 inside a string", b'{"prompt": "\xff\xfe"}', "UTF-8"),
    ("invalid UTF-8 before the JSON", b'\xff{"prompt": "x"}', "UTF-8"),
    ("100000 nested arrays (limit raised to 1 MiB)", b"[" * 100_000 + b"]" * 100_000, "nest"),
    ("30000 nested objects", b'{"a":' * 30_000 + b"1" + b"}" * 30_000, "nest"),
    ("an integer of 5000 digits", b'{"prompt": "x", "n": ' + b"9" * 5000 + b"}", "digits"),
    ("truncated JSON", b'{"prompt": "x", "n": ', "JSON"),
    ("NaN", b'{"prompt": "x", "guidance": NaN}', "guidance"),
    ("Infinity", b'{"prompt": "x", "guidance": Infinity}', "guidance"),
    ("-Infinity timeout", b'{"prompt": "x", "timeout_s": -Infinity}', "timeout_s"),
    ("1e400 (overflows to inf)", b'{"prompt": "x", "guidance": 1e400}', "guidance"),
    ("negative n", b'{"prompt": "x", "n": -5}', "n"),
    ("n = -10**30", b'{"prompt": "x", "n": -' + b"1" + b"0" * 30 + b"}", "n"),
    ("height = 10**35", b'{"prompt": "x", "height": 1' + b"0" * 35 + b"}", "height"),
    ("seed = 2**64", b'{"prompt": "x", "seed": 18446744073709551616}', "seed"),
    ("seed + n over 2**63-1", b'{"prompt": "x", "seed": 9223372036854775807, "n": 2}', "seed"),
    ("steps = 10**20", b'{"prompt": "x", "steps": 100000000000000000000}', "steps"),
    ("output_width = -1", b'{"prompt": "x", "output_height": 8, "output_width": -1}',
     "output_width"),
    ("timeout_s = 1e308", b'{"prompt": "x", "timeout_s": 1e308}', "timeout_s"),
    ("lone surrogate in prompt", b'{"prompt": "\\ud800"}', "prompt"),
    ("50000 unknown keys (limit raised to 1 MiB)",
     json.dumps({f"k{i}": i for i in range(50_000)}).encode(), "unknown field"),
    ("a 900 kB prompt (limit raised to 1 MiB)", json.dumps({"prompt": "x" * 900_000}).encode(),
     "max_prompt_chars"),
    ("sample: n = -1", b'{"n": -1}', "n"),
    ("sample: wait_s = NaN", b'{"wait_s": NaN}', "wait_s"),
    ("sample: n = 10**30", b'{"n": 1' + b"0" * 30 + b"}", "n"),
    ("fill: per_label = 10**30", b'{"per_label": 1' + b"0" * 30 + b"}", "per_label"),
    ("fill: per_label = -1", b'{"per_label": -1}', "per_label"),
]
PARSE_CASES = {"invalid UTF-8 inside a string", "invalid UTF-8 before the JSON",
               "100000 nested arrays (limit raised to 1 MiB)", "30000 nested objects",
               "an integer of 5000 digits"}


def check_malformed(model: Any, *, workdir: Path | None = None) -> CheckResult:
    """Every malformed or out-of-range body gets a 4xx in the service's error shape whose
    message names the field (or the parse problem); never a 5xx."""
    result = CheckResult("Hostile input", "malformed")
    started = time.monotonic()
    answers: dict[str, tuple[int, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        (Path(tmp) / "recipes.yaml").write_text(RECIPE)
        with start_service(model, record=False, max_body_bytes=1 << 20,
                           recipes=Path(tmp) / "recipes.yaml", pool_path=Path(tmp) / "pool.db",
                           pool_capacity_per_label=4) as live:
            for case, body, _ in MALFORMED:
                path = "/v1/generate"
                if case.startswith("sample:"):
                    path = "/v1/recipes/shapes/sample"
                elif case.startswith("fill:"):
                    path = "/v1/recipes/shapes/fill"
                r = httpx.post(live.url + path, content=body, timeout=60,
                               headers={"Content-Type": "application/json"})
                answers[case] = (r.status_code, _error_of(r.content))
    result.seconds = time.monotonic() - started
    value_cases = [c for c, _, _ in MALFORMED if c not in PARSE_CASES]
    parse_cases = [c for c, _, _ in MALFORMED if c in PARSE_CASES]
    expect = {c: m for c, _, m in MALFORMED}

    def four_xx(cases: list[str]) -> list[str]:
        return [c for c in cases if not 400 <= answers[c][0] < 500]

    def unclear(cases: list[str]) -> list[str]:
        bad = []
        for c in cases:
            error = answers[c][1]
            message = error.get("message", "")
            if error.get("type") in (None, "http_error") or expect[c].lower() not in \
                    message.lower() or len(message) < 30:
                bad.append(c)
        return bad

    statuses = Counter(answers[c][0] for c in answers)
    result.add("NaN, infinities, negative and enormous integers, out-of-range fields, "
               "unknown keys, huge strings", len(value_cases),
               f"statuses {dict(statuses)}; all 4xx in the error shape naming the field: "
               f"{not four_xx(value_cases) and not unclear(value_cases)}",
               ok=not four_xx(value_cases) and not unclear(value_cases),
               not_4xx=four_xx(value_cases), unclear=unclear(value_cases),
               messages={c: answers[c][1].get("message", "")[:120] for c in value_cases})
    result.add("unparseable bodies (invalid UTF-8, 100000 / 30000 levels of nesting, a "
               "5000-digit integer): a 4xx, never a 5xx", len(parse_cases),
               f"statuses {[answers[c][0] for c in parse_cases]}",
               ok=not four_xx(parse_cases))
    result.add("unparseable bodies: the message says what is wrong and how to fix it",
               len(parse_cases),
               "messages: " + "; ".join(sorted({answers[c][1].get("message", "")[:80]
                                                for c in parse_cases})),
               lost="nothing",
               ok=not unclear(parse_cases), unclear=unclear(parse_cases))
    result.figures["answers"] = {c: answers[c][0] for c in answers}
    return result


def _error_of(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return {}
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) else {}
