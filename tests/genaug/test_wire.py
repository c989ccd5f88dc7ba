"""The wire codecs shared by service and clients: safetensors batches and PNG grids."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import save

from genaug.wire import WireError, decode_batch, encode_batch, encode_png_grid

METADATA: dict[str, Any] = {
    "model_hash": "ab12cd34ef56ab78",
    "request": {"prompt": "a wound", "n": 3, "seed": None, "guidance": 5.5},
    "label_names": ["healthy", "infected"],
    "requested": 3,
    "ratio": 0.25,
    "flag": True,
    "nothing": None,
    "unicode": "Wundbett ü ✓",
    "config_json": "a string under a key that ends in _json",
    "number_like": "1",
}


def batch(n: int = 3, h: int = 5, w: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)
    seeds = np.array([0, 2**63 - 1, 12345, *range(3, n)][:n], dtype=np.int64)
    labels = np.arange(n, dtype=np.int32) % 2
    return images, seeds, labels


def header_length(payload: bytes) -> int:
    return int.from_bytes(payload[:8], "little")


def test_round_trip_with_labels_and_metadata() -> None:
    images, seeds, labels = batch()
    decoded = decode_batch(encode_batch(images, seeds, labels=labels, metadata=METADATA))
    assert len(decoded) == 3
    assert decoded.images.dtype == np.uint8 and decoded.seeds.dtype == np.int64
    np.testing.assert_array_equal(decoded.images, images)
    np.testing.assert_array_equal(decoded.seeds, seeds)
    assert decoded.labels is not None and decoded.labels.dtype == np.int32
    np.testing.assert_array_equal(decoded.labels, labels)
    assert decoded.metadata == METADATA
    assert type(decoded.metadata["requested"]) is int
    assert type(decoded.metadata["number_like"]) is str


def test_round_trip_without_labels_or_metadata() -> None:
    images, seeds, _ = batch(n=1)
    decoded = decode_batch(encode_batch(images, seeds))
    assert decoded.labels is None and decoded.metadata == {}
    np.testing.assert_array_equal(decoded.images, images)


def test_seeds_and_labels_are_cast_to_their_wire_dtypes() -> None:
    images, _, _ = batch(n=2)
    decoded = decode_batch(encode_batch(images, [4, 5], labels=np.array([1, 0], np.int64)))
    assert decoded.seeds.dtype == np.int64 and decoded.seeds.tolist() == [4, 5]
    assert decoded.labels is not None and decoded.labels.dtype == np.int32


def test_an_empty_batch_round_trips() -> None:
    images = np.zeros((0, 8, 8, 3), np.uint8)
    decoded = decode_batch(encode_batch(images, np.zeros(0, np.int64),
                                        labels=np.zeros(0, np.int32)))
    assert decoded.images.shape == (0, 8, 8, 3) and len(decoded) == 0


def test_wire_bytes_are_raw_tensors_plus_a_small_header() -> None:
    images, seeds, labels = batch(n=3, h=16, w=24)
    metadata = {"model_hash": "ab12cd34ef56ab78", "request": {"prompt": "x", "n": 3}}
    payload = encode_batch(images, seeds, labels=labels, metadata=metadata)
    n = header_length(payload)
    assert n < 1024
    assert len(payload) == 8 + n + images.nbytes + seeds.nbytes + labels.nbytes
    # No base64, no compression: each tensor's bytes sit verbatim at its header offsets.
    header = json.loads(payload[8 : 8 + n])
    for name, array in (("images", images), ("seeds", seeds), ("labels", labels)):
        start, end = header[name]["data_offsets"]
        assert payload[8 + n + start : 8 + n + end] == array.astype(array.dtype.newbyteorder(
            "<")).tobytes()


def test_decoded_images_are_usable_arrays() -> None:
    images, seeds, _ = batch()
    decoded = decode_batch(encode_batch(images, seeds))
    assert decoded.images.flags.c_contiguous
    assert float(decoded.images.astype(np.float32).mean()) == pytest.approx(
        float(images.astype(np.float32).mean()))


def _good_payload() -> bytes:
    images, seeds, labels = batch()
    return encode_batch(images, seeds, labels=labels, metadata={"k": "v"})


def _with_header(header: dict[str, Any], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def _saved(metadata: dict[str, str] | None = None, **tensors: np.ndarray) -> bytes:
    """A file the safetensors library writes: one 2x2 RGB image and its seed, with
    ``tensors`` added or replacing those."""
    base = {"images": np.zeros((1, 2, 2, 3), np.uint8), "seeds": np.zeros(1, np.int64)}
    return save(base | tensors, metadata=metadata)


def _one_image(images_at: list[int] | None, seeds_at: list[int], size: int,
               shape: list[float] | None = None) -> bytes:
    """A hand-written header of one 1x1 RGB image and its seed (``images_at`` and
    ``seeds_at`` their data offsets, None for none), then ``size`` zero bytes."""
    images: dict[str, Any] = {"dtype": "U8", "shape": shape or [1, 1, 1, 3]}
    if images_at is not None:
        images["data_offsets"] = images_at
    seeds = {"dtype": "I64", "shape": [1], "data_offsets": seeds_at}
    return _with_header({"images": images, "seeds": seeds}, b"\0" * size)


GARBAGE: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("short", b"abc"),
    ("zero header", b"\x00" * 8),
    ("huge header length", b"\xff" * 20),
    ("html", b"<html><body>502 Bad Gateway</body></html>"),
    ("json", b'{"images": [1, 2, 3]}'),
    ("truncated by one byte", _good_payload()[:-1]),
    ("truncated in the header", _good_payload()[:20]),
    ("header only", _good_payload()[: 8 + header_length(_good_payload())]),
    ("no images tensor", save({"seeds": np.zeros(2, np.int64)})),
    ("float images", _saved(images=np.zeros((1, 2, 2, 3), np.float32))),
    ("rgba images", _saved(images=np.zeros((1, 2, 2, 4), np.uint8))),
    ("two-channel images", _saved(images=np.zeros((1, 2, 2, 2), np.uint8))),
    ("int64 sources", _saved(sources=np.zeros(1, np.int64))),
    ("sources of another length", _saved(sources=np.zeros(2, np.int32))),
    ("seeds of another length", _saved(images=np.zeros((2, 2, 2, 3), np.uint8),
                                       seeds=np.zeros(3, np.int64))),
    ("int32 seeds", _saved(seeds=np.zeros(1, np.int32))),
    ("bad json metadata", _saved(metadata={"request_json": "{not json"})),
    ("metadata not an object", _with_header({"__metadata__": ["x"]}, b"")),
    ("header not an object", _with_header([1, 2], b"")),  # type: ignore[arg-type]
    ("header nested too deeply", (20000).to_bytes(8, "little")
     + b"[" * 10000 + b"]" * 10000),
    # offsets, checked as the safetensors library checks them (decode views, never copies)
    ("gap between tensors", _one_image([0, 3], [4, 12], 12)),
    ("overlapping tensors", _one_image([0, 3], [2, 10], 10)),
    ("size does not match the shape", _one_image([0, 3], [3, 11], 11, shape=[1, 1, 2, 3])),
    ("data past the last tensor", _one_image([0, 3], [3, 11], 12)),
    ("negative offset", _one_image([-3, 0], [0, 8], 8)),
    ("float dimension", _one_image([0, 3], [3, 11], 11, shape=[1, 1, 1.0, 3])),
    ("no offsets", _one_image(None, [3, 11], 11)),
]


@pytest.mark.parametrize("payload", [p for _, p in GARBAGE], ids=[name for name, _ in GARBAGE])
def test_decode_rejects_what_is_not_a_genaug_batch(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(payload)


@pytest.mark.parametrize(
    "images",
    [
        np.zeros((1, 4, 4, 3), np.float32),
        np.zeros((1, 4, 4, 3), np.int16),
        np.zeros((1, 4, 4, 3), np.int8),
        np.zeros((4, 4, 3), np.uint8),
        np.zeros((1, 4, 4, 4), np.uint8),
        np.zeros((1, 4, 4, 2), np.uint8),
        np.zeros((1, 4, 4), np.uint8),
    ],
    ids=["float32", "int16", "int8", "no batch axis", "rgba", "two channels", "gray no axis"],
)
def test_encode_rejects_images_that_are_not_uint8_nhwc_rgb(images: np.ndarray) -> None:
    with pytest.raises(WireError, match=r"uint8 \[N,H,W,C\] with C in \{1, 3\}"):
        encode_batch(images, np.zeros(len(images), np.int64))


def test_one_channel_images_and_sources_round_trip() -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(4, 5, 7, 1), dtype=np.uint8)
    sources = np.array([0, 0, 1, 1])
    decoded = decode_batch(encode_batch(images, np.arange(4), sources=sources))
    assert decoded.images.shape == (4, 5, 7, 1) and decoded.labels is None
    np.testing.assert_array_equal(decoded.images, images)
    assert decoded.sources is not None and decoded.sources.dtype == np.int32
    np.testing.assert_array_equal(decoded.sources, sources)
    assert decode_batch(encode_batch(images, np.arange(4))).sources is None
    with pytest.raises(WireError, match="sources"):
        encode_batch(images, np.arange(4), sources=np.zeros(3, np.int32))


def test_one_channel_png_grid_is_greyscale() -> None:
    images = np.stack([np.full((6, 10, 1), 40 * (i + 1), np.uint8) for i in range(2)])
    image = Image.open(io.BytesIO(encode_png_grid(images)))
    assert image.mode == "L" and image.size == (20, 6)
    assert np.asarray(image)[0, 0] == 40 and np.asarray(image)[0, 10] == 80


def test_encode_rejects_seeds_or_labels_of_another_length() -> None:
    images, _, _ = batch(n=3)
    with pytest.raises(WireError, match="seeds"):
        encode_batch(images, np.zeros(2, np.int64))
    with pytest.raises(WireError, match="labels"):
        encode_batch(images, np.zeros(3, np.int64), labels=np.zeros(4, np.int32))


@pytest.mark.parametrize(("n", "size"), [(1, (10, 6)), (3, (20, 12)), (4, (20, 12))])
def test_png_grid_dimensions_and_cells(n: int, size: tuple[int, int]) -> None:
    h, w = 6, 10  # not square, so a transposed grid would show
    images = np.stack([np.full((h, w, 3), 40 * (i + 1), np.uint8) for i in range(n)])
    png = encode_png_grid(images)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(png))
    assert image.size == size and image.mode == "RGB"
    grid = np.asarray(image)
    cols = size[0] // w
    for i in range(n):
        r, c = divmod(i, cols)
        assert (grid[r * h : (r + 1) * h, c * w : (c + 1) * w] == 40 * (i + 1)).all(), i
    if n == 3:
        assert (grid[h:, w:] == 0).all()  # the unused cell stays black


def test_png_grid_with_explicit_columns() -> None:
    images = np.zeros((3, 6, 10, 3), np.uint8)
    assert Image.open(io.BytesIO(encode_png_grid(images, columns=3))).size == (30, 6)
    assert Image.open(io.BytesIO(encode_png_grid(images, columns=1))).size == (10, 18)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_the_safetensors_library_reads_what_genaug_writes(n: int) -> None:
    """genaug writes safetensors itself (one copy instead of the library's several); the
    library, which validates every offset, must read it back exactly, with each tensor at an
    offset that is a multiple of its item size."""
    import json as _json
    import struct

    from safetensors.numpy import load

    rng = np.random.default_rng(n)
    images = rng.integers(0, 256, (n, 16, 24, 1), dtype=np.uint8)
    seeds = rng.integers(0, 2**62, n, dtype=np.int64)
    labels = rng.integers(0, 9, n, dtype=np.int32)
    payload = encode_batch(images, seeds, labels=labels, sources=labels[::-1].copy(),
                           metadata={"recipe": "r", "n": n})
    tensors = load(payload)
    np.testing.assert_array_equal(tensors["images"], images)
    np.testing.assert_array_equal(tensors["seeds"], seeds)
    np.testing.assert_array_equal(tensors["labels"], labels)
    np.testing.assert_array_equal(tensors["sources"], labels[::-1])
    (size,) = struct.unpack("<Q", payload[:8])
    assert (8 + size) % 8 == 0  # the data section starts 8-byte aligned
    header = _json.loads(payload[8 : 8 + size])
    assert header["__metadata__"] == {"recipe": "r", "n_json": str(n)}
    for name, item in (("seeds", 8), ("labels", 4), ("sources", 4)):
        assert header[name]["data_offsets"][0] % item == 0, header
    assert len(payload) == 8 + size + images.nbytes + seeds.nbytes + 2 * labels.nbytes


@pytest.mark.parametrize("n", [0, 1, 5])
def test_decode_agrees_with_the_safetensors_library_and_is_writable(n: int) -> None:
    """decode_batch checks the offsets itself and views the tensors in one copy of the
    payload; it must read what the library reads, as arrays a caller may change in place."""
    from safetensors.numpy import load

    rng = np.random.default_rng(n)
    images = rng.integers(0, 256, (n, 8, 6, 3), dtype=np.uint8)
    seeds = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
    labels = rng.integers(0, 9, n, dtype=np.int32)
    for payload in (
        encode_batch(images, seeds, labels=labels, metadata={"recipe": "r"}),
        save({"images": images, "seeds": seeds, "labels": labels}),  # the library's layout
    ):
        decoded, reference = decode_batch(payload), load(payload)
        for name in ("images", "seeds", "labels"):
            got = getattr(decoded, name)
            np.testing.assert_array_equal(got, reference[name])
            assert got.dtype == reference[name].dtype and got.flags.writeable
        if n:
            assert not np.shares_memory(decoded.images, np.frombuffer(payload, np.uint8))
            decoded.images[0] //= 2  # a notebook scaling its images in place


def test_this_folder_does_not_stand_in_for_the_genaug_package() -> None:
    """tests/genaug/ has no ``__init__.py``, and pytest puts tests/ on ``sys.path``; were the
    package found through the editable install's finder alone (``pytest`` started without the
    checkout on the path), this folder would import as a namespace package ``genaug``, whose
    modules still resolve but whose ``__init__`` never runs. tests/conftest.py puts the root on
    the path before the first ``import genaug``."""
    import genaug

    assert genaug.__file__ is not None, f"genaug imported as a namespace: {genaug.__path__}"
    assert genaug.__version__
