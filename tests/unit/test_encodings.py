"""decode_precomputed against a real peer: every chunk here is encoded by cloud-volume's own
`cloudvolume.chunks.encode`, never by shardfs. Shapes are clipped and odd (not multiples of any block),
and corrupt bytes of every encoding must be refused with ValueError, never a crash."""

from __future__ import annotations

import compresso
import numpy as np
import pytest
from cloudvolume import chunks

from shardfs.formats.encodings import decode_precomputed

CSEG = {"compressed_segmentation_block_size": [4, 3, 2]}  # not the default 8x8x8, and 13x7x5 is ragged in it


def image(shape: tuple[int, ...], dtype: type, seed: int = 0) -> np.ndarray:
    """A smooth (x, y, z, c) image with a little noise: something JPEG can keep close to."""
    rng = np.random.default_rng(seed)
    top = np.iinfo(dtype).max if np.dtype(dtype).kind in "ui" else 1.0
    ramp = sum(np.indices(shape)[:3]) / sum(shape[:3]) + rng.random(shape) * 0.05
    return (ramp / ramp.max() * top * 0.9).astype(dtype)


def labels(shape: tuple[int, ...], dtype: type, seed: int = 0) -> np.ndarray:
    """A (x, y, z, 1) segmentation of a few blocky regions, with labels near the dtype's top too."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 5, tuple(-(-n // 3) for n in shape[:3]))
    top = int(np.iinfo(dtype).max)
    ids = np.array([0, 7, 12345 % top, top - 3, top], dtype)
    blocky = ids[coarse.repeat(3, 0).repeat(3, 1).repeat(3, 2)[: shape[0], : shape[1], : shape[2]]]
    return np.asfortranarray(blocky[..., np.newaxis])


def encode(chunk: np.ndarray, encoding: str, params: dict | None = None) -> bytes:
    """cloud-volume's chunk encoder, with the scale's block size where it takes one."""
    block = (params or {}).get("compressed_segmentation_block_size")
    return chunks.encode(chunk, encoding, block_size=block)


LOSSLESS = [
    *[("raw", image((13, 7, 5, 1), t), {}) for t in (np.uint8, np.int16, np.uint32, np.int64, np.float32)],
    ("raw", image((3, 5, 2, 2), np.uint16), {}),
    ("raw", image((2, 3, 4, 3), np.float64), {}),
    *[("png", image((13, 7, 5, c), np.uint8), {}) for c in (1, 2, 3, 4)],
    *[("png", image((13, 7, 5, c), np.uint16), {}) for c in (2, 4)],  # cloud-volume cannot write 16-bit 1 or 3
    ("compressed_segmentation", labels((13, 7, 5, 1), np.uint32), CSEG),
    ("compressed_segmentation", labels((13, 7, 5, 1), np.uint64), CSEG),
    ("compressed_segmentation", labels((16, 9, 4, 1), np.uint64), CSEG),  # whole blocks
    ("compressed_segmentation", labels((13, 7, 5, 1), np.uint64), {"compressed_segmentation_block_size": [8, 8, 8]}),
    ("compresso", labels((13, 7, 5, 1), np.uint32), {}),
    ("compresso", labels((13, 7, 5, 1), np.uint64), {}),
    ("compresso", labels((70, 40, 6, 1), np.uint64, seed=1), {}),  # a 2-byte z index
    ("compresso", labels((13, 7, 5, 1), np.uint8), {}),  # labels past 248 take a literal location
]


@pytest.mark.parametrize(("encoding", "chunk", "params"), LOSSLESS, ids=lambda v: getattr(v, "shape", v))
def test_lossless_round_trip(encoding: str, chunk: np.ndarray, params: dict) -> None:
    out = decode_precomputed(encode(chunk, encoding, params), encoding, chunk.shape, chunk.dtype, params)
    assert out.flags.c_contiguous and out.dtype == chunk.dtype.newbyteorder("<")
    np.testing.assert_array_equal(out, chunk.T)  # (x, y, z, c) Fortran is (c, z, y, x) C


@pytest.mark.parametrize("shape", [(13, 7, 5, 1), (13, 7, 5, 3), (64, 64, 3, 1), (31, 9, 2, 3)])
def test_jpeg_is_close_and_laid_out_as_cloud_volume_writes(shape: tuple[int, ...]) -> None:
    chunk = image(shape, np.uint8)
    data = encode(chunk, "jpeg")
    out = decode_precomputed(data, "jpeg", shape, np.dtype("uint8"), {})
    assert out.shape == chunk.T.shape and out.dtype == np.uint8 and out.flags.c_contiguous
    assert np.abs(out.astype(int) - chunk.T).mean() < 4
    if shape[3] == 1:  # cloud-volume's own decode reads 3-channel images as planar, so compare only grey
        np.testing.assert_array_equal(out, chunks.decode(data, "jpeg", shape, np.uint8).T)


def test_cseg_and_compresso_match_cloud_volume_decode() -> None:
    chunk = labels((13, 7, 5, 1), np.uint64, seed=2)
    for encoding, params in (("compressed_segmentation", CSEG), ("compresso", {})):
        data = encode(chunk, encoding, params)
        theirs = chunks.decode(data, encoding, chunk.shape, chunk.dtype, CSEG["compressed_segmentation_block_size"])
        np.testing.assert_array_equal(decode_precomputed(data, encoding, chunk.shape, chunk.dtype, params), theirs.T)


CORRUPTIBLE = [
    ("raw", image((13, 7, 5, 1), np.uint16), {}),
    ("jpeg", image((64, 48, 4, 3), np.uint8), {}),
    ("png", image((13, 7, 5, 1), np.uint8), {}),
    ("png", image((13, 7, 5, 4), np.uint16), {}),
    ("compressed_segmentation", labels((13, 7, 5, 1), np.uint64), CSEG),
    ("compresso", labels((13, 7, 5, 1), np.uint64), {}),
]


def truncated(data: bytes, shape: tuple[int, ...], encoding: str) -> tuple[bytes, tuple[int, ...]]:
    return data[: len(data) * 2 // 3], shape


def garbage(data: bytes, shape: tuple[int, ...], encoding: str) -> tuple[bytes, tuple[int, ...]]:
    size = len(data) + (encoding == "raw")  # raw takes any bytes of the right size
    return np.random.default_rng(size).bytes(size), shape


def wrong_shape(data: bytes, shape: tuple[int, ...], encoding: str) -> tuple[bytes, tuple[int, ...]]:
    return data, (shape[0], shape[1], shape[2] * 2, shape[3])


@pytest.mark.parametrize("corrupt", [truncated, garbage, wrong_shape])
@pytest.mark.parametrize(("encoding", "chunk", "params"), CORRUPTIBLE, ids=lambda v: getattr(v, "shape", v))
def test_corrupt_data_is_value_error(corrupt, encoding: str, chunk: np.ndarray, params: dict) -> None:
    data, shape = corrupt(encode(chunk, encoding, params), chunk.shape, encoding)
    with pytest.raises(ValueError):
        decode_precomputed(data, encoding, shape, chunk.dtype, params)


def test_wrong_dtype_or_channels_or_encoding_is_value_error() -> None:
    seg, img = labels((13, 7, 5, 1), np.uint64), image((13, 7, 5, 3), np.uint8)
    cases = [
        (encode(seg, "compresso"), "compresso", seg.shape, np.uint32, {}),
        (encode(seg, "compressed_segmentation", CSEG), "compressed_segmentation", seg.shape, np.uint16, CSEG),
        (encode(seg, "compressed_segmentation", CSEG), "compressed_segmentation", seg.shape, np.uint64, {}),
        (encode(img, "png"), "png", img.shape, np.uint16, {}),
        (encode(img, "png"), "png", (13, 7, 5, 4), np.uint8, {}),
        (encode(img, "jpeg"), "jpeg", (13, 7, 5, 1), np.uint8, {}),
        (encode(img, "raw"), "raw", img.shape, np.int32, {}),
        (encode(img, "raw"), "zfpc", img.shape, np.uint8, {}),
        (encode(img, "raw"), "raw", (13, 7, 5), np.uint8, {}),
    ]
    for data, encoding, shape, dtype, params in cases:
        with pytest.raises(ValueError):
            decode_precomputed(data, encoding, shape, np.dtype(dtype), params)


def test_reads_the_libraries_would_make_past_their_tables_are_value_error() -> None:
    """Bytes that keep every declared size but point the unchecked C++ decoders outside their tables."""
    seg = labels((64, 48, 16, 1), np.uint64, seed=3)
    cseg = encode(seg, "compressed_segmentation", CSEG)
    words = np.frombuffer(cseg, "<u4").copy()
    block = 1 + 2 * int(np.flatnonzero(words[1::2] >> 24)[0])  # the first block with indexes of 1 or more bits
    words[block] = (words[block] & 0xFF000000) | (words.size - 3)  # its table: the last entry, then nothing
    cpso = encode(seg, "compresso")
    head = compresso.header(cpso)
    no_ids = cpso[:15] + bytes(8) + cpso[23:36] + cpso[36 + 8 * head["id_size"] :]  # components without ids
    at = 36 + 8 * head["id_size"] + 2 * head["value_size"]  # cloud-volume's 4x4x1 steps have 2-byte windows
    locations = np.frombuffer(cpso, "<u8", head["location_size"], at).copy()
    locations[locations > 6] = 5  # take the label from the next slice, even in the last one
    bad = [
        (words.tobytes(), "compressed_segmentation", CSEG),
        (cseg[:4] + bytes([255]) * 4 + cseg[8:], "compressed_segmentation", CSEG),  # a block of 255 bits
        (no_ids, "compresso", {}),
        (cpso[:at] + locations.tobytes() + cpso[at + locations.nbytes :], "compresso", {}),
    ]
    for data, encoding, params in bad:
        with pytest.raises(ValueError):
            decode_precomputed(data, encoding, seg.shape, seg.dtype, params)
