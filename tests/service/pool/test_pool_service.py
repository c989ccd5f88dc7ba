"""Recipe pools in the real service: background filling, sampling, restarts, hard kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.client import Client
from genaug.service.jobs.queries import JobQueries
from genaug.service.pool.open import open_pool
from genaug.wire import decode_batch


def write_recipe(tmp_path: Path, text: str, name: str = "recipes.yaml") -> Path:
    """Write a variant of the ``shapes_recipe`` fixture's text."""
    path = tmp_path / name
    path.write_text(text)
    return path


def wait_fill(live: Any, per_label: int, timeout: float = 60) -> dict[str, Any]:
    return dict(live.wait_recipe(lambda d: all(v >= per_label for v in d["fill"].values()),
                                 timeout=timeout))


def sample(live: Any, body: dict[str, Any], name: str = "shapes") -> httpx.Response:
    return httpx.post(f"{live.url}/v1/recipes/{name}/sample", json=body, timeout=60)


def test_pools_fill_in_the_background_and_stop_when_full(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=6, max_batch_images=4)
    detail = wait_fill(live, 6)
    assert detail["fill"] == {"circle": 6, "square": 6, "triangle": 6}
    assert detail["totals"]["generated"] == 18 and detail["generation_rate"] > 0
    calls = len(live.worker.calls)
    time.sleep(0.5)
    assert len(live.worker.calls) == calls, "the worker kept generating with full pools"
    listing = httpx.get(live.url + "/v1/recipes").json()["recipes"]
    assert [r["name"] for r in listing] == ["shapes"] and listing[0]["fill"]["square"] == 6
    # every idle batch held one label, of the recipe's size, steps, guidance, negative prompt
    assert sum(len(items) for _, items in live.worker.calls) == 18  # exactly the target
    for key, items in live.worker.calls:
        assert (key.height, key.width, key.steps, key.mode) == (32, 32, 2, "text")
        assert {it.guidance for it in items} == {3.0}
        assert len({it.prompt.split()[-1] for it in items}) == 1
        assert {it.negative_prompt for it in items} <= {None, "blurry"}



def test_small_samples_are_read_on_the_event_loop_large_ones_in_a_thread(
    make_service: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shapes_recipes_file: Path
) -> None:
    """Up to 786 KB of pixels (here 256 images of 32x32 RGB) a sample is read on the event
    loop, without the hop to a thread; one image more and it goes to a thread. (With full
    pools and an hour's lease nothing else writes, so ``sample_now`` never meets the lock.)"""
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=6, max_batch_images=4, pool_lease_s=3600)
    wait_fill(live, 6)
    store = live.state.pools.store
    seen: list[tuple[str, str]] = []
    sample_now, sample_ = store.sample_now, store.sample

    def spy_now(*args: Any) -> Any:
        seen.append(("sample_now", threading.current_thread().name))
        return sample_now(*args)

    def spy(*args: Any) -> Any:
        seen.append(("sample", threading.current_thread().name))
        return sample_(*args)

    monkeypatch.setattr(store, "sample_now", spy_now)
    monkeypatch.setattr(store, "sample", spy)
    loop_thread = live.thread.name
    assert len(decode_batch(sample(live, {"n": 256}).content)) == 18
    assert [name for _, name in seen] == [loop_thread] * 2  # sample_now, then its sample
    seen.clear()
    assert len(decode_batch(sample(live, {"n": 257}).content)) == 18
    assert [call for call, _ in seen] == ["sample"] and seen[0][1] != loop_thread

def test_sample_shapes_labels_counts_and_served(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=6)
    wait_fill(live, 6)
    r = sample(live, {"n": 9})
    assert r.status_code == 200, r.text
    batch = decode_batch(r.content)
    assert batch.images.shape == (9, 32, 32, 3) and batch.images.dtype == np.uint8
    assert batch.labels is not None and batch.labels.dtype == np.int32
    assert sorted(batch.labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert batch.metadata["label_names"] == ["circle", "square", "triangle"]
    assert batch.metadata["returned"] == 9 and len(set(batch.seeds.tolist())) == 9
    one = decode_batch(sample(live, {"labels": "square", "n": 4}).content)
    assert one.labels.tolist() == [1, 1, 1, 1]
    many = decode_batch(sample(live, {"labels": ["triangle"], "n": 50}).content)
    assert len(many) == 6  # all there is, never repeated within one sample
    empty = decode_batch(sample(live, {"n": 0}).content)
    assert empty.images.shape == (0, 32, 32, 3)
    assert live.recipe()["totals"]["served"] == 9 + 4 + 6
    # a pool image is exactly what the generator makes for its seed and prompt
    seed = int(one.seeds[0])
    direct = httpx.post(live.url + "/v1/generate", json={
        "prompt": "a square", "seed": seed, "height": 32, "width": 32, "steps": 2,
        "guidance": 3.0}, timeout=60)
    np.testing.assert_array_equal(decode_batch(direct.content).images[0], one.images[0])


def test_sample_errors(make_service: Any, tmp_path: Path, shapes_recipes_file: Path) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=2)
    r = sample(live, {"n": 1}, name="nope")
    assert r.status_code == 404 and "shapes" in r.json()["error"]["message"]
    r = sample(live, {"labels": ["hexagon"]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "labels"
    assert "circle" in r.json()["error"]["message"]
    for body in ({"n": -1}, {"n": 10**7}, {"wait_s": -1}, {"wait_s": 10**9}, {"x": 1},
                 {"labels": 3}):
        r = sample(live, body)
        assert r.status_code == 422, (body, r.text)
        assert "error" in r.json()


def test_wait_s_generates_on_demand_and_never_waits_longer(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    assert sum(live.recipe()["fill"].values()) == 0
    r = sample(live, {"labels": "circle", "n": 0, "wait_s": 0})
    assert decode_batch(r.content).images.shape[0] == 0
    t0 = time.monotonic()
    r = sample(live, {"labels": "circle", "n": 3, "wait_s": 30})
    assert len(decode_batch(r.content)) == 3
    assert time.monotonic() - t0 < 30
    assert live.recipe()["fill"]["square"] == 0  # only what was asked for
    live.worker.gate.clear()  # nothing can be generated now: the wait must end on time
    t0 = time.monotonic()
    r = sample(live, {"labels": "square", "n": 2, "wait_s": 0.5})
    elapsed = time.monotonic() - t0
    live.worker.gate.set()
    assert r.status_code == 200 and len(decode_batch(r.content)) == 0
    assert 0.4 < elapsed < 5


def test_restart_keeps_images_and_a_changed_prompt_starts_a_new_pool(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path, shapes_recipe: str
) -> None:
    recipes, db = shapes_recipes_file, tmp_path / "pool.db"
    first = make_service(recipes=recipes, pool_path=db, pool_capacity_per_label=4)
    before = wait_fill(first, 4)
    seeds_before = set(decode_batch(sample(first, {"n": 12}).content).seeds.tolist())
    first.stop()
    again = make_service(recipes=recipes, pool_path=db, pool_capacity_per_label=4)
    after = again.recipe()
    assert after["pool_id"] == before["pool_id"] and after["fill"] == before["fill"]
    seeds_after = set(decode_batch(sample(again, {"n": 12}).content).seeds.tolist())
    assert seeds_after == seeds_before
    again.stop()
    changed = write_recipe(tmp_path, shapes_recipe.replace("a square", "a blue square"), "v2.yaml")
    third = make_service(recipes=changed, pool_path=db, pool_capacity_per_label=4,
                         pregenerate=False)
    detail = third.recipe()
    assert detail["pool_id"] != before["pool_id"]
    assert sum(detail["fill"].values()) == 0
    assert not set(decode_batch(sample(third, {"n": 12}).content).seeds.tolist())


def test_direct_request_waits_at_most_one_prefill_batch(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=1000, max_batch_images=4)
    deadline = time.monotonic() + 30
    while len(live.worker.calls) < 2:  # pre-generation is running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for i in range(3):
        started = len(live.worker.calls)
        r = httpx.post(live.url + "/v1/generate", json={"prompt": f"direct {i}"}, timeout=60)
        assert r.status_code == 200
        position = next(k for k, (_, items) in enumerate(live.worker.calls)
                        if any(it.prompt == f"direct {i}" for it in items))
        # at most one pre-generation batch may start after the request arrived
        assert position <= started + 1, (position, started)


def test_concurrent_samples_during_filling_all_succeed(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=40, max_batch_images=4)

    def one(i: int) -> tuple[int, int]:
        with Client(live.url, client_id=f"trainer-{i % 4}") as client:
            result = client.sample("shapes", n=6, wait_s=2.0)
            return len(result), int(result.labels.max(initial=0))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    assert all(0 <= count <= 6 and top <= 2 for count, top in results)
    assert sum(count for count, _ in results) > 0


def test_pregenerate_and_export_cli(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    env = {**os.environ, "GENAUG_POOL_PATH": str(tmp_path / "pool.db")}
    run = subprocess.run(
        [sys.executable, "-m", "genaug.cli", "pregenerate", "--url", live.url, "--recipe",
         "shapes", "--per-label", "5"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert run.returncode == 0, run.stderr
    assert all(v >= 5 for v in live.recipe()["fill"].values())
    # --images: 6 more, split over the three labels (no need reported: evenly), watched
    # until each label holds its new target
    before = live.recipe()["fill"]
    run = subprocess.run(
        [sys.executable, "-m", "genaug.cli", "pregenerate", "--url", live.url, "--recipe",
         "shapes", "--images", "6"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert run.returncode == 0, run.stderr
    after = live.recipe()
    assert sum(after["fill"].values()) >= sum(before.values()) + 6
    assert all(after["fill"][label] >= after["target_per_label"][label] for label in before)
    # --images splits by need, which only a service holds: refused in process, with the fix
    run = subprocess.run(
        [sys.executable, "-m", "genaug.cli", "pregenerate", "--recipe", "shapes", "--images",
         "6"], capture_output=True, text=True, timeout=120, env=env,
    )
    assert run.returncode == 2 and "add --url URL" in run.stderr, run.stderr
    out = tmp_path / "export"
    run = subprocess.run(
        [sys.executable, "-m", "genaug.cli", "export", "--recipe", "shapes", "--out", str(out)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert run.returncode == 0, run.stderr
    from PIL import Image

    files = sorted(out.glob("*/*.png"))
    assert {f.parent.name for f in files} == {"circle", "square", "triangle"}
    assert len(files) == sum(live.recipe()["fill"].values())
    assert Image.open(files[0]).size == (32, 32)


def test_bad_recipe_file_fails_startup_clearly(tmp_path: Path, shapes_recipe: str) -> None:
    bad = write_recipe(tmp_path, shapes_recipe.replace("steps: 2", "steps: 0"), "bad.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    run = subprocess.run(
        [sys.executable, "-m", "genaug.service", "--recipes", str(bad), "--port", "1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert run.returncode == 2
    assert "bad.yaml" in run.stderr and "steps" in run.stderr and "recipes[0]" in run.stderr
    # the pool check ran first, at the default path (in cwd): the failed start removed it
    assert not list(tmp_path.glob("genaug-pool.db*")), run.stderr


@pytest.mark.parametrize("path", ["/v1/recipes/shapes/sample", "/v1/recipes/shapes/fill"])
def test_recipe_routes_without_recipes_are_404(service: Any, path: str) -> None:
    body = {"n": 1} if path.endswith("sample") else {"per_label": 1}
    r = httpx.post(service.url + path, json=body)
    assert r.status_code == 404 and "GENAUG_RECIPES" in r.json()["error"]["message"]
    assert httpx.get(service.url + "/v1/recipes").json() == {"recipes": []}


def test_pregenerate_in_process_resumes_and_stops_cleanly_on_ctrl_c(
    tmp_path: Path, shapes_recipes_file: Path
) -> None:
    recipes, db = shapes_recipes_file, tmp_path / "pool.db"
    env = {**os.environ, "GENAUG_RECIPES": str(recipes), "GENAUG_POOL_PATH": str(db),
           "GENAUG_MAX_BATCH_IMAGES": "2", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "genaug.cli", "pregenerate", "--recipe", "shapes",
           "--per-label", "400"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while not db.exists() or sum(_fill(db).values()) < 6:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # Ctrl-C, wherever it lands (pipeline, bookkeeping)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "every finished batch is kept" in err, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    kept = _fill(db)
    assert all(v % 2 == 0 for v in kept.values())  # whole batches of 2
    with open_pool(db, capacity_per_label=1000) as store:
        assert store.integrity_check() == "ok"
    # resumable: a second run counts what exists and adds only the rest
    target = max(kept.values()) + 2
    run = subprocess.run([*cmd[:-1], str(target)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert _fill(db) == {"circle": target, "square": target, "triangle": target}


def _fill(db: Path) -> dict[str, int]:
    with open_pool(db, capacity_per_label=1000) as store:
        pools = store.reads.pools()
        return store.fill(pools[0]) if pools else {}


def test_pool_list_and_drop_commands(tmp_path: Path) -> None:

    db = tmp_path / "pool.db"
    with open_pool(db, capacity_per_label=10) as store:
        store.add("shapes-aaaaaaaaaaaa", "circle", np.zeros((2, 4, 4, 3), np.uint8), [1, 2],
                  model_hash="m")
        store.add("shapes-bbbbbbbbbbbb", "circle", np.zeros((1, 4, 4, 3), np.uint8), [3],
                  model_hash="m")
        live = JobQueries(store).create("shapes-aaaaaaaaaaaa", "shapes", "per_label",
                                        {"circle": 5})
    base = [sys.executable, "-m", "genaug.cli", "pool"]
    listing = subprocess.run([*base, "list", "--pool-path", str(db)], capture_output=True,
                             text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert "shapes-aaaaaaaaaaaa  2 images" in listing.stdout
    assert "shapes-bbbbbbbbbbbb  1 images" in listing.stdout
    missing = subprocess.run([*base, "drop", "shapes-", "--pool-path", str(db)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "exact ids" in missing.stderr
    drop = subprocess.run([*base, "drop", "shapes-aaaaaaaaaaaa", "--pool-path", str(db)],
                          capture_output=True, text=True, timeout=120)
    assert drop.returncode == 0 and "2 images deleted" in drop.stdout, drop.stderr
    with open_pool(db, capacity_per_label=10) as store:
        assert store.reads.pools() == ["shapes-bbbbbbbbbbbb"]
        failed = JobQueries(store).get(live.id)  # the pool's live job failed with it
        assert failed is not None and (failed.state, failed.reason) == (
            "failed", "its pool was dropped (genaug pool drop)")
    nowhere = subprocess.run([*base, "list", "--pool-path", str(tmp_path / "none.db")],
                             capture_output=True, text=True, timeout=120)
    assert nowhere.returncode == 2 and "no pool database" in nowhere.stderr


def test_variant_pool_from_real_images_with_the_real_pipeline(
    make_service: Any, tmp_path: Path, shapes_recipe: str
) -> None:
    """A label with `images:` is filled with img2img variants by the real pipeline, and the
    pool remembers each variant's source."""
    from PIL import Image

    from genaug.service.recipes.sources import source_hash

    folder = tmp_path / "real" / "circles"
    folder.mkdir(parents=True)
    sources = []
    for k, colour in enumerate([(200, 30, 30), (30, 30, 200)]):
        pixels = np.zeros((32, 32, 3), np.uint8)
        pixels[8:24, 8:24] = colour
        Image.fromarray(pixels).save(folder / f"{k}.png")
        sources.append(source_hash(pixels))
    text = shapes_recipe.replace(
        'circle: {prompts: ["a circle", "a round circle"]}',
        'circle: {prompts: ["a circle"], images: circles, strength: 0.5, variants_per_image: 2}',
    )
    live = make_service(recipes=write_recipe(tmp_path, text), pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=3, max_batch_images=4,
                        data_root=tmp_path / "real")
    detail = wait_fill(live, 2)
    assert detail["fill"] == {"circle": 3, "square": 3, "triangle": 3}  # 2 x 2 capped at 3
    modes = {(key.mode, key.strength) for key, items in live.worker.calls
             if items and items[0].prompt == "a circle"}
    assert modes == {("img2img", 0.5)}
    store = live.state.store
    sample = store.sample(live.state.pools.pool_ids["shapes"], ["circle"], 10)
    assert sample.sources is not None and set(sample.sources) <= set(sources)
    assert len(set(sample.sources)) == 2 and len(set(sample.seeds.tolist())) == 3
    # over HTTP, each sampled image says where it came from (None for text-to-image labels)
    with Client(live.url) as client:
        served = client.sample("shapes", n=9)
    hashes = served.source_hashes
    assert hashes is not None and hashes == served.metadata["source_hashes"]
    names = [served.label_names[i] for i in served.labels.tolist()]
    assert len(hashes) == len(names) == 9
    assert {h for h, name in zip(hashes, names, strict=True) if name == "circle"} <= set(sources)
    assert all(h is None for h, name in zip(hashes, names, strict=True) if name != "circle")
    assert "circle" in names


def test_a_sample_says_which_labels_it_has_none_of_and_answers_png_when_asked(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    assert sample(live, {"labels": ["circle"], "n": 2, "wait_s": 30}).status_code == 200
    # only circle holds images: the answer says the other two have none (metadata and
    # header), and the client exposes it
    r = sample(live, {"n": 6})
    batch = decode_batch(r.content)
    assert r.headers["X-Genaug-Count"] == "2" and len(batch) == 2
    assert r.headers["X-Genaug-Empty-Labels"] == "square,triangle"
    assert batch.metadata["empty_labels"] == ["square", "triangle"]
    with Client(live.url) as client:
        result = client.sample("shapes", n=6)
        assert result.empty_labels == ["square", "triangle"] and len(result) == 2
        assert client.sample("shapes", labels=["circle"], n=2).empty_labels == []
    # Accept: image/png: one PNG grid, as /v1/generate answers (the fast path serves it)
    r = httpx.post(f"{live.url}/v1/recipes/shapes/sample", json={"n": 6},
                   headers={"Accept": "image/png"}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "image/png", r.headers
    assert r.content.startswith(b"\x89PNG\r\n\x1a\n")
    assert r.headers["X-Genaug-Labels"] == "circle,circle"
    assert r.headers["X-Genaug-Empty-Labels"] == "square,triangle"
    import io

    from PIL import Image

    assert Image.open(io.BytesIO(r.content)).size[0] >= 32
    none = httpx.post(f"{live.url}/v1/recipes/shapes/sample", json={"labels": ["square"]},
                      headers={"Accept": "image/png"}, timeout=60)
    assert none.status_code == 204 and none.headers["X-Genaug-Count"] == "0"
    # an unknown label: one sentence with the field, the value, the labels and the fix
    for labels, bad in ((["circle", "hexagon"], "'hexagon'"), ("hexagon", "'hexagon'")):
        error = sample(live, {"labels": labels}).json()["error"]
        message = error["message"]
        assert error["field"] == "labels" and bad in message, message
        assert "'circle', 'square' or 'triangle'" in message, message
        assert "GET /v1/recipes/shapes" in message and "leave labels out" in message, message
        assert "literal[" not in message and "list[" not in message, message
        assert message.count("Input should be") == 1, message


@pytest.mark.parametrize("failure", [
    ["--model", "/no/such/model"],  # refused before listening
    ["--model", "tiny-random", "--lora", "x=/no/such/lora.safetensors"],  # while loading
])
def test_a_failed_start_leaves_no_pool_file(
    tmp_path: Path, shapes_recipes_file: Path, failure: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    run = subprocess.run(
        [sys.executable, "-m", "genaug.cli", "serve", "--recipes", str(shapes_recipes_file),
         "--port", "0", *failure], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=180,
    )
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert not list(tmp_path.glob("genaug-pool.db*")), run.stderr  # the default path, here
