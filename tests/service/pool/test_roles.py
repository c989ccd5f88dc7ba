"""The api and worker roles (``GENAUG_ROLE``): real service processes on a real PostgreSQL
pool. A worker makes a pool and stops; an api that loads no model (no torch in the process)
then keeps the pool answering at zero workers: samples from the existing pool, the recipe and
the pool page, ``genaug jobs list``, a fill accepted as a queued job that says no worker
runs, ``/v1/generate`` refused with 503, ``Retry-After`` and one line (a request that can
never work still gets its 422 here). A worker started then finishes the fill, its webhook
is sent once, and the api sends generation to it. A worker killed (SIGKILL) mid-fill leaves
its job to the next worker: no image lost or made twice. Worker start-ups make these a
minute each on a 2-core machine: ``slow``. The role refusal on SQLite is in ``make test``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from _postgres import shared_cluster
from test_pool_replicas import detail, pool_contents, replica, wait_until

from genaug.service.testing import read_metric
from genaug.wire import decode_batch

FILL = {"per_label": 8}
SECRET = "s3cret-for-the-tests-0123456789"
WEBHOOKS = ["--webhook-hosts", "127.0.0.1", "--webhook-secret", SECRET]


class Receiver:
    """Webhooks on 127.0.0.1: every POST's body, in order."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/genaug"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(row for row in status.splitlines() if row.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.slow  # three service processes on PostgreSQL: see the module docstring
def test_an_api_at_zero_workers_keeps_the_pool_answering_and_a_worker_finishes_its_fill(
        shapes_recipes_file: Path) -> None:
    url = shared_cluster().new_database()
    pool = ["--pool-url", url, "--pool-capacity-per-label", "100", "--pregenerate", "false",
            *WEBHOOKS]
    hooks = Receiver()
    with replica(shapes_recipes_file, "first-worker", *pool, "--role", "worker") as first:
        r = httpx.post(f"{first.url}/v1/recipes/shapes/fill", json={"per_label": 4}, timeout=30)
        assert r.status_code == 200, r.text
        wait_until(lambda: sum(detail(first)["fill"].values()) == 12, what="the first fill")
        made_by_first = detail(first)["pool_id"]

    with replica(shapes_recipes_file, "api", *pool, "--role", "api") as api:
        # No model, no torch: the process never mapped libtorch.
        assert "libtorch" not in Path(f"/proc/{api.proc.pid}/maps").read_text()
        info = httpx.get(f"{api.url}/v1/info", timeout=30).json()
        assert info["model"] is None and info["replica"]["role"] == "api", info
        wait_until(lambda: httpx.get(f"{api.url}/v1/recipes/shapes", timeout=30).status_code
                   == 200, timeout=60, what="the api to open the worker's pools")
        assert detail(api)["pool_id"] == made_by_first  # the worker's pool, named by it
        wait_until(lambda: read_metric(api.url, "genaug_workers_alive") == 0, timeout=30,
                   what="the stopped worker to count as gone")

        # Samples come from the existing pool at zero workers.
        r = httpx.post(f"{api.url}/v1/recipes/shapes/sample", json={"n": 6}, timeout=30)
        assert r.status_code == 200, r.text
        assert len(decode_batch(r.content)) == 6
        assert httpx.get(f"{api.url}/pool/shapes", timeout=30).status_code == 200

        # Generation: checked here, refused with one line while no worker runs.
        bad = httpx.post(f"{api.url}/v1/generate", json={"prompt": "a circle", "n": 10**6},
                         timeout=30)
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "n", bad.text
        refused = httpx.post(f"{api.url}/v1/generate", json={"prompt": "a circle", "n": 1},
                             timeout=30)
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        message = refused.json()["error"]["message"]
        assert "\n" not in message and message.startswith("no worker is running"), message
        assert "--role worker" in message

        # A fill is a job that waits, saying why.
        r = httpx.post(f"{api.url}/v1/recipes/shapes/fill",
                       json={**FILL, "notify_url": hooks.url}, timeout=30)
        assert r.status_code == 200, r.text
        job_id = r.json()["job"]["id"]
        job = httpx.get(f"{api.url}/v1/jobs/{job_id}", timeout=30).json()
        assert job["state"] == "queued" and "no worker is running" in job["waiting"], job
        listed = subprocess.run(
            [sys.executable, "-m", "genaug.cli", "jobs", "list", "--url", api.url],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "GENAUG_API_KEY": ""})
        assert listed.returncode == 0 and job_id in listed.stdout, listed

        with replica(shapes_recipes_file, "second-worker", *pool, "--role", "worker"):
            wait_until(lambda: httpx.get(f"{api.url}/v1/jobs/{job_id}", timeout=30).json()[
                "state"] == "done", timeout=180, what="the fill to finish on the new worker")
            job = httpx.get(f"{api.url}/v1/jobs/{job_id}", timeout=30).json()
            assert job["missing"] == 0 and job["waiting"] is None, job
            wait_until(lambda: hooks.bodies, timeout=60, what="the job's webhook")
            wait_until(lambda: read_metric(api.url, "genaug_workers_alive") == 1, timeout=30,
                       what="the api to see the worker")
            made = httpx.post(f"{api.url}/v1/generate", json={"prompt": "a circle", "n": 2},
                              timeout=120)
            assert made.status_code == 200, made.text
            assert len(decode_batch(made.content)) == 2
        time.sleep(3.0)  # a second delivery, from any replica, would have come by now
        assert len(hooks.bodies) == 1 and job_id.encode() in hooks.bodies[0], hooks.bodies
        print(f"api RSS {_rss_mib(api.proc.pid):.0f} MiB")  # the figure docs/benchmarks.md keeps
    hooks.close()


@pytest.mark.slow  # three service processes on PostgreSQL: see the module docstring
def test_a_worker_killed_mid_fill_leaves_its_job_to_the_next_one_losing_and_repeating_nothing(
        shapes_recipes_file: Path) -> None:
    url = shared_cluster().new_database()
    pool = ["--pool-url", url, "--pool-capacity-per-label", "200", "--pregenerate", "false"]
    with replica(shapes_recipes_file, "api", *pool, "--role", "api") as api, \
            replica(shapes_recipes_file, "doomed", *pool, "--role", "worker") as doomed:
        wait_until(lambda: httpx.get(f"{api.url}/v1/recipes/shapes", timeout=30).status_code
                   == 200, timeout=60, what="the api to open the pools")
        r = httpx.post(f"{api.url}/v1/recipes/shapes/fill", json={"per_label": 60}, timeout=30)
        assert r.status_code == 200, r.text
        job_id = r.json()["job"]["id"]
        wait_until(lambda: httpx.get(f"{api.url}/v1/jobs/{job_id}", timeout=30).json()[
            "accepted"] >= 12, timeout=180, what="the fill to be under way")
        os.kill(doomed.proc.pid, signal.SIGKILL)  # mid-fill: no goodbye, leases held
        doomed.proc.wait()
        assert httpx.get(f"{api.url}/v1/jobs/{job_id}", timeout=30).json()["state"] != "done"
        with replica(shapes_recipes_file, "next", *pool, "--role", "worker"):
            wait_until(lambda: httpx.get(f"{api.url}/v1/jobs/{job_id}", timeout=30).json()[
                "state"] == "done", timeout=240, what="the next worker to finish the fill")
        pid = detail(api)["pool_id"]
    indices, seeds = pool_contents(url, pid)
    assert {label: len(found) for label, found in indices.items()} == dict.fromkeys(
        ("circle", "square", "triangle"), 60)
    for found in indices.values():
        assert len(set(found)) == len(found)  # no plan index stored twice
    assert len(set(seeds)) == len(seeds) == 180  # no image made twice, none lost
