"""The header of a LoRA file ``genaug adapt`` writes: what training writes and serving checks.

:mod:`genaug.service.adapt.train` writes the record under :data:`RECORD_KEY` and the base
model's ``weights_hash`` under :data:`BASE_HASH_KEY`;
:class:`~genaug.service.pipeline.adapters.Adapters` reads it back with :func:`read_record` to
refuse a file made for another base. It is one small piece here, below both, because serving
sits below adaptation in the import order and cannot import from it, and it imports no torch, so the
command's flags (:data:`DEFAULT_RANK`) cost nothing at ``genaug --help``.

Example::

    read_record(Path("threes.safetensors"))["base_hash"]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["BASE_HASH_KEY", "DEFAULT_RANK", "RECORD_KEY", "read_record"]

#: safetensors header key of the base model's ``weights_hash`` the LoRA was trained on.
BASE_HASH_KEY = "genaug_base_hash"
#: safetensors header key of the whole record, JSON.
RECORD_KEY = "genaug_adapt"
#: ``genaug adapt``'s LoRA rank unless ``--rank`` says otherwise.
DEFAULT_RANK = 32


def read_record(path: Path) -> dict[str, Any]:
    """The ``genaug adapt`` record in a LoRA file's header; ``{}`` when it has none."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata() or {}
    try:
        record: dict[str, Any] = json.loads(meta.get(RECORD_KEY, "{}"))
    except ValueError:
        record = {}
    if BASE_HASH_KEY in meta:
        record["base_hash"] = meta[BASE_HASH_KEY]
    return record
