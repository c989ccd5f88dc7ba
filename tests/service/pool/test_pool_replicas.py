"""Several replicas on one pool: real service processes on a real PostgreSQL server.

Each replica is ``python -m genaug.service`` (the tiny model, one torch thread) in a child
process; the pool is read back with a store opened here. What is checked: replicas together
stop exactly at the target and never repeat a plan index or a seed, a killed replica's work is
planned again by the other, each replica samples what the other made, a database outage
leaves generation working and loses nothing, start-up refuses bad configuration with one
line and exit 2, and SQLite replicas with a plan partition never repeat a seed.

The three runs of replica processes on PostgreSQL (two replicas filling one pool, a killed
replica, a database outage) take 15-20 s each on a 2-core machine, most of it start-ups:
they are marked ``slow`` (``make test-slow``, which CI runs after ``make test``); the start-up
refusals and the SQLite partition stay in ``make test``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from _postgres import PgCluster, shared_cluster

from genaug.local_service import free_port, running_service
from genaug.service.pool.open import open_pool
from genaug.service.pool.types import SCHEMA_VERSION
from genaug.service.testing import read_metric, wait_ready
from genaug.wire import decode_batch

LABELS = ["circle", "square", "triangle"]  # of the shapes_recipe fixture


@contextlib.contextmanager
def replicas(recipes: Path, names: list[str], *args: str,
             env: dict[str, str] | None = None) -> Iterator[list[Any]]:
    """Service processes started together (their start-ups overlap), yielded once all are
    ready as objects with ``url``, ``proc`` and ``log``; all stopped on exit. ``recipes``
    is the ``shapes_recipes_file`` fixture; the logs go beside it."""
    tmp_path = recipes.parent
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    child_env.pop("GENAUG_POOL_PATH", None)
    ports: list[int] = []
    while len(ports) < len(names):  # distinct, though none is bound until its child starts
        port = free_port()
        if port not in ports:
            ports.append(port)
    with contextlib.ExitStack() as stack:
        started = []
        for name, port in zip(names, ports, strict=True):
            log = tmp_path / f"{name}.log"
            proc = stack.enter_context(running_service(
                port, extra_args=["--recipes", str(recipes), "--max-batch-images", "4",
                                  "--pool-lease-s", "3", *args],
                env=child_env, log_path=log))
            started.append(type("Replica", (), {"url": f"http://127.0.0.1:{port}",
                                                "proc": proc, "log": log})())
        for name, live in zip(names, started, strict=True):
            try:
                wait_ready(live.url, timeout=180, alive=lambda p=live.proc: p.poll() is None)
            except RuntimeError:
                pytest.fail(f"{name} did not start: {live.log.read_text()[-3000:]}")
        yield started


@contextlib.contextmanager
def replica(recipes: Path, name: str, *args: str,
            env: dict[str, str] | None = None) -> Iterator[Any]:
    """One service process; yields an object with ``url``, ``proc`` and ``log``."""
    with replicas(recipes, [name], *args, env=env) as (live,):
        yield live


def detail(live: Any) -> dict[str, Any]:
    r = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def wait_until(check: Any, timeout: float = 180, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def pool_contents(url: str, pid: str) -> tuple[dict[str, list[int]], list[int]]:
    """Plan indices per label and every seed, read straight from the database."""
    with open_pool(url, capacity_per_label=10**6) as store:
        return store.reads.plan_indices(pid), [seed for _, seed, _ in store.reads.iter_images(pid)]


def pool_generated(live: Any) -> float:
    return read_metric(live.url, "genaug_images_generated_total", 'source="pool"')


@pytest.mark.slow  # replica processes on PostgreSQL: see the module docstring
def test_two_replicas_fill_exactly_to_target_and_sample_each_others_images(
    shapes_recipes_file: Path,
) -> None:
    url = shared_cluster().new_database()
    args = ["--pool-url", url, "--pool-capacity-per-label", "100", "--pregenerate", "false"]
    with replicas(shapes_recipes_file, ["a", "b"], *args) as (a, b):
        for live in (a, b):  # a fill asked of either replica is every replica's target
            r = httpx.post(f"{live.url}/v1/recipes/shapes/fill", json={"per_label": 12})
            assert r.status_code == 200, r.text
        wait_until(lambda: sum(detail(a)["fill"].values()) == 36, what="the fill")
        time.sleep(1.0)  # a replica that overshot would still be storing now
        made = {name: pool_generated(r) for name, r in (("a", a), ("b", b))}
        assert made["a"] + made["b"] == 36, made  # together, exactly the target
        final = detail(b)
        assert final["fill"] == dict.fromkeys(LABELS, 12)
        assert final["totals"]["generated"] == 36
        pid = final["pool_id"]
        assert detail(a)["pool_id"] == pid
        indices, seeds = pool_contents(url, pid)
        assert indices == {label: list(range(12)) for label in LABELS}  # no index twice
        assert len(set(seeds)) == 36
        for live in (a, b):  # each replica serves everything, the other's images included
            r = httpx.post(f"{live.url}/v1/recipes/shapes/sample", json={"n": 36}, timeout=60)
            assert r.status_code == 200, r.text
            assert set(decode_batch(r.content).seeds.tolist()) == set(seeds)
        assert min(made.values()) > 0, f"one replica did all the work: {made}"


@pytest.mark.slow  # replica processes on PostgreSQL: see the module docstring
def test_a_killed_replicas_work_is_finished_by_the_other(shapes_recipes_file: Path) -> None:
    """Also the fill jobs' goal: a job started on one replica is followed on the other, and
    a replica stopped mid-job loses no image and repeats no seed."""
    url = shared_cluster().new_database()
    args = ["--pool-url", url, "--pool-capacity-per-label", "100", "--pregenerate", "false"]
    with replicas(shapes_recipes_file, ["a", "b"], *args) as (a, b):
        jobs = []
        for live in (a, b):
            r = httpx.post(f"{live.url}/v1/recipes/shapes/fill", json={"per_label": 24})
            assert r.status_code == 200, r.text
            jobs.append(r.json()["job"]["id"])

        def job_on_a(job_id: str) -> dict[str, Any]:
            got = httpx.get(f"{a.url}/v1/jobs/{job_id}", timeout=30)
            assert got.status_code == 200, got.text
            return dict(got.json())

        assert job_on_a(jobs[1])["recipe"] == "shapes"  # b's job, read on a
        wait_until(lambda: sum(detail(a)["fill"].values()) >= 12, what="some images")
        wait_until(lambda: pool_generated(b) > 0, what="b to generate")
        b.proc.send_signal(signal.SIGKILL)  # mid-fill: it holds a reservation
        b.proc.wait(timeout=30)
        pid = detail(a)["pool_id"]
        _, acknowledged = pool_contents(url, pid)  # committed before the kill
        wait_until(lambda: sum(detail(a)["fill"].values()) == 72, what="a to finish")
        time.sleep(1.0)
        final = detail(a)
        assert final["fill"] == dict.fromkeys(LABELS, 24)
        assert final["totals"]["generated"] == 72  # nothing stored twice, no overshoot
        indices, seeds = pool_contents(url, pid)
        assert len(set(seeds)) == len(seeds) == 72
        assert set(acknowledged) <= set(seeds)  # no acknowledged image lost
        for label in LABELS:
            assert len(set(indices[label])) == 24
        log = a.log.read_text()
        # b's lost batch leaves a gap in the plan (planned again with new indices) unless b
        # happened to be between batches when it died
        gaps = sum(max(v) + 1 - len(v) for v in indices.values())
        assert gaps == 0 or "expired" in log, (gaps, log[-2000:])
        for job_id in jobs:  # b's job too, ended by a (b is gone)
            wait_until(lambda j=job_id: job_on_a(j)["state"] == "done", what=f"job {job_id}")
            assert job_on_a(job_id)["missing"] == 0


@pytest.mark.slow  # replica processes on PostgreSQL: see the module docstring
def test_database_outage_while_serving(shapes_recipes_file: Path) -> None:
    cluster = PgCluster()
    try:
        cluster.start()
        url = cluster.new_database()
        with replica(shapes_recipes_file, "a", "--pool-url", url,
                     "--pool-capacity-per-label", "30") as a:
            wait_until(lambda: sum(detail(a)["fill"].values()) >= 6, what="some images")
            pid = detail(a)["pool_id"]
            _, before = pool_contents(url, pid)
            cluster.stop()
            try:
                for i in range(3):  # generation requests keep being answered
                    r = httpx.post(f"{a.url}/v1/generate", json={"prompt": f"outage {i}"},
                                   timeout=60)
                    assert r.status_code == 200, r.text
                r = httpx.post(f"{a.url}/v1/recipes/shapes/sample", json={"n": 4}, timeout=60)
                assert r.status_code == 503, r.text
                assert r.json()["error"]["type"] == "pool_unavailable"
                assert int(r.headers["Retry-After"]) >= 1
                assert httpx.get(f"{a.url}/readyz", timeout=10).status_code == 200
                assert httpx.get(f"{a.url}/v1/status", timeout=30).status_code == 200
            finally:
                cluster.start()
            # 503 until the replica's next look at the database finds it back
            wait_until(lambda: sum(_fill(a).values()) == 90, what="the pool to resume")
            time.sleep(1.0)
            indices, seeds = pool_contents(url, pid)
            assert set(before) <= set(seeds) and len(set(seeds)) == 90
            # every image this replica made is in the pool: none lost in the outage
            assert pool_generated(a) == detail(a)["totals"]["generated"] == 90
            log = a.log.read_text()
            assert "pre-generation paused" in log and "resumes" in log, log[-3000:]
    finally:
        cluster.destroy()


def _serve_exit(recipes: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    run = subprocess.run(
        [sys.executable, "-m", "genaug.service", "--port", "1", "--recipes", str(recipes),
         *args], capture_output=True, text=True, timeout=180, env=child_env,
    )
    return run.returncode, run.stderr


def test_bad_pool_configuration_exits_2_with_one_line(
    tmp_path: Path, shapes_recipes_file: Path
) -> None:
    cluster = shared_cluster()
    old = cluster.new_database()
    with open_pool(old, capacity_per_label=1) as store, store._tx(write=True) as conn:
        store._exec(conn, "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION + 1),))
    cases = [
        (["--pool-url", cluster.url(password="not-it")], {}, "password authentication failed"),
        (["--pool-url", f"postgresql://genaug:x@127.0.0.1:{free_port()}/db"], {},
         "cannot connect"),
        (["--pool-url", "mysql://genaug:x@127.0.0.1/db"], {}, "only postgresql://"),
        (["--pool-url", old, "--pool-path", str(tmp_path / "p.db")], {}, "both GENAUG_POOL_URL"),
        (["--pool-url", old], {"GENAUG_POOL_PATH": str(tmp_path / "p.db")},
         "both GENAUG_POOL_URL"),
        (["--pool-url", old], {},
         f"schema version {SCHEMA_VERSION + 1}, newer than this genaug knows"),
        (["--replica", "2/2", "--pool-path", str(tmp_path / "p.db")], {}, "GENAUG_REPLICA"),
        (["--role", "api", "--pool-path", str(tmp_path / "p.db")], {},
         "--role api splits the service into an api and its workers, which share one pool "
         "in PostgreSQL: set GENAUG_POOL_URL"),
    ]
    for args, env, words in cases:
        code, err = _serve_exit(shapes_recipes_file, *args, env=env)
        # one line says what is wrong (log records, timestamped, may precede it)
        lines = [line for line in err.splitlines()
                 if line.strip() and not re.match(r"\d{4}-\d\d-\d\d ", line)]
        assert code == 2 and len(lines) == 1 and words in lines[0], (args, code, err[-2000:])
        assert lines[0].startswith("genaug serve: "), lines
        assert "not-it" not in err and ":x@" not in err  # passwords never printed


def test_sqlite_replicas_with_a_plan_partition_never_repeat_a_seed(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    recipes = shapes_recipes_file
    # One pool filled without a partition first: turned on later, each replica continues
    # after the file's highest index, in its own residue class.
    seed_pool = tmp_path / "seed.db"
    first = make_service(recipes=recipes, pool_path=seed_pool, pool_capacity_per_label=3,
                         max_batch_images=4)
    wait_until(lambda: sum(_fill(first).values()) == 9, what="the first fill")
    first.stop()
    paths = [tmp_path / "r0.db", tmp_path / "r1.db"]
    for path in paths:
        path.write_bytes(seed_pool.read_bytes())
    seeds: list[set[int]] = []
    new: list[dict[str, list[int]]] = []
    for i, path in enumerate(paths):  # one at a time: in-process services share one pipeline
        live = make_service(recipes=recipes, pool_path=path, pool_capacity_per_label=10,
                            max_batch_images=4, replica=f"{i}/2")
        wait_until(lambda live=live: sum(_fill(live).values()) == 30, what="a replica's fill")
        live.stop()
        with open_pool(path, capacity_per_label=100) as store:
            (pid,) = store.reads.pools()
            everything = store.reads.plan_indices(pid)
            new.append({k: [x for x in v if x >= 3] for k, v in everything.items()})
            seeds.append({seed for _, seed, _ in store.reads.iter_images(pid)})
    for label in LABELS:
        assert all(x % 2 == 0 for x in new[0][label])
        assert all(x % 2 == 1 for x in new[1][label])
        assert len(new[0][label]) == len(new[1][label]) == 7
    shared = seeds[0] & seeds[1]
    assert len(shared) == 9  # only the images both files started with
    assert np.unique(np.array(sorted(seeds[0] | seeds[1]))).size == 51


def _fill(live: Any) -> dict[str, int]:
    r = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30)
    return dict(r.json()["fill"]) if r.status_code == 200 else {}
