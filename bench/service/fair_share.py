"""Fair share of generator time: cost-weighted, and per API key rather than per client id.

One child-process service with two API keys. Two experiments run side by side in one run:

- **Cost.** Two saturating clients (each keeps ``DEPTH`` requests in flight): ``heavy`` asks
  64x64 at 4 steps, ``light`` 32x32 at 1 step (16x the cost per image). Their share of
  generator time is read from ``GET /v1/clients`` (``generation_s`` deltas).
- **Identities.** Key A sends its requests under ten client ids, key B under one, same load,
  same size; the share of each key is summed over its ids.

    python -m bench fair_share [--quick]

Goals: each cost client gets 0.4-0.6 of generator time; key A's share over key
B's within 0.8-1.25 (the same total share).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from bench.harness import finish, goal_text, main, parse_args, table
from bench.services import service

DEPTH = 12
KEY_A, KEY_B = "bench-key-a", "bench-key-b"


def _saturate(
    url: str, api_key: str, client_ids: Sequence[str], shape: dict[str, int], stop: threading.Event
) -> None:
    from genaug.client import Client

    def loop(client_id: str) -> None:
        with Client(url, api_key=api_key, client_id=client_id, timeout=120) as client:
            while not stop.is_set():
                client.generate("a bench image", n=2, **shape)

    threads = [threading.Thread(target=loop, args=(cid,), daemon=True)
               for cid in client_ids for _ in range(max(1, DEPTH // len(client_ids)))]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=120)


def _generation_s(url: str) -> dict[str, float]:
    import httpx

    body = httpx.get(url + "/v1/clients", headers={"Authorization": f"Bearer {KEY_A}"}).json()
    return {c["client"]: c["generation_s"] for c in body["clients"]}


def _measure(url: str, loads: dict[str, tuple[str, list[str], dict[str, int]]],
             seconds: float) -> dict[str, float]:
    """Run ``loads`` (name -> key, client ids, shape) together; share of time per name."""
    stop = threading.Event()
    workers = [threading.Thread(target=_saturate, args=(url, key, ids, shape, stop), daemon=True)
               for key, ids, shape in loads.values()]
    for w in workers:
        w.start()
    time.sleep(seconds / 4)  # let the queue fill before measuring
    before = _generation_s(url)
    time.sleep(seconds)
    after = _generation_s(url)
    stop.set()
    for w in workers:
        w.join(timeout=180)
    used: dict[str, float] = {}
    from genaug.service.api.guard import key_id

    for name, (key, _, _) in loads.items():
        prefix = key_id(key)
        used[name] = sum(after[c] - before.get(c, 0.0) for c in after
                         if c == prefix or c.startswith(prefix + "/"))
    total = sum(used.values()) or 1.0
    return {name: s / total for name, s in used.items()}


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    seconds = 8.0 if args.quick else 30.0
    small = {"height": 32, "width": 32, "steps": 1}
    big = {"height": 64, "width": 64, "steps": 4}
    with service(threads=args.threads, api_keys=f"{KEY_A},{KEY_B}", max_batch_images=8) as url:
        cost = _measure(url, {"heavy": (KEY_A, ["heavy"], big),
                              "light": (KEY_B, ["light"], small)}, seconds)
        ids = _measure(url, {"ten ids": (KEY_A, [f"id{i}" for i in range(10)], small),
                             "one id": (KEY_B, ["one"], small)}, seconds)
    cost_met = all(0.4 <= s <= 0.6 for s in cost.values())
    ratio = ids["ten ids"] / max(ids["one id"], 1e-9)
    ids_met = 0.8 <= ratio <= 1.25
    table(
        "Fair share of generator time (two saturating loads at once)",
        ["experiment", "load", "share", "goal"],
        [["cost 16x apart", "heavy 64x64x4", f"{cost['heavy']:.2f}",
          "0.4-0.6 " + goal_text(cost_met)],
         ["", "light 32x32x1", f"{cost['light']:.2f}", ""],
         ["ten ids vs one", "key A, 10 ids", f"{ids['ten ids']:.2f}",
          f"ratio {ratio:.2f}, 0.8-1.25 " + goal_text(ids_met)],
         ["", "key B, 1 id", f"{ids['one id']:.2f}", ""]],
    )
    return finish({"cost_shares": cost, "id_shares": ids, "id_ratio": ratio,
                   "cost_goal_met": cost_met, "id_goal_met": ids_met}, args.json)


if __name__ == "__main__":
    main(run)
