"""Zarr v3 codec chains: the sharding levels of an array and the codecs of its innermost chunks, the codec
names no writer uses, and what the views need to know of a chunk's bytes."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from shardfs.codecs import UNDO
from shardfs.errors import Unsupported
from shardfs.formats.plan import LARGEST, Compressor
from shardfs.request import Request
from shardfs.shards.zarr import IndexLayout, Level, decode_blob

MAX_NESTING = 8  # sharding levels; writers use one or two, and each level is work for every lookup
# Codecs of the zarr v3 spec and its registered extensions; zarr-python also writes numcodecs' as `numcodecs.*`.
KNOWN_CODECS = (
    *("bytes", "transpose", "sharding_indexed", "gzip", "zstd", "blosc", "crc32c"),
    *("vlen-utf8", "vlen-bytes", "packbits"),
)


def _name(codec: Any) -> str:
    return codec.get("name") if isinstance(codec, dict) else codec


def unshard(codecs: list, chunk_shape: tuple[int, ...]) -> tuple[list[Level], list] | None:
    """The sharding levels and the innermost codecs, or None if the array is not sharded. Inner codecs
    are passed on as they are, so any array→bytes codec may sit inside (`bytes`, `vlen-utf8`, ...)."""
    levels: list[Level] = []
    shape = chunk_shape
    while True:
        if not isinstance(codecs, list):
            raise Unsupported(f"codecs {codecs!r} is not a list")
        names = [_name(c) for c in codecs]
        if "sharding_indexed" not in names:
            return (levels, codecs) if levels else None
        at = names.index("sharding_indexed")
        if at:
            raise Unsupported(f"array→array codecs {names[:at]} before sharding change the chunk layout")
        post = tuple(names[at + 1 :])
        if unknown := [n for n in post if n not in UNDO]:
            raise Unsupported(f"bytes→bytes codecs {unknown} after sharding are not supported")
        config = codecs[at].get("configuration") if isinstance(codecs[at], dict) else None
        inner = tuple(config.get("chunk_shape") or ()) if isinstance(config, dict) else ()
        if not positive_ints(inner, len(shape)) or any(s % i for s, i in zip(shape, inner, strict=True)):
            raise Unsupported(f"inner chunk shape {list(inner)} does not divide the shard shape {list(shape)}")
        if len(levels) == MAX_NESTING:
            raise Unsupported(f"sharding is nested more than {MAX_NESTING} levels deep")
        cps = tuple(s // i for s, i in zip(shape, inner, strict=True))
        levels.append(Level(shape, inner, _index_layout(config, cps), post))
        codecs, shape = config.get("codecs", []), inner


def unknown_codecs(codecs: Any) -> list[str]:
    """Codec names in a chain (sharding's inner and index chains too) that no zarr v3 writer uses: most
    likely a typo (`sharding_index`), which would otherwise pass through in silence, shards as chunks."""
    found, pending = [], [codecs]
    while pending and len(found) < 8:
        chain = pending.pop()
        for codec in chain if isinstance(chain, list) else []:
            name = _name(codec)
            if not isinstance(name, str) or not (name in KNOWN_CODECS or name.startswith("numcodecs.")):
                found.append(str(name))
            config = codec.get("configuration") if isinstance(codec, dict) else None
            if name == "sharding_indexed" and isinstance(config, dict) and len(pending) < MAX_NESTING:
                pending += [config.get("codecs"), config.get("index_codecs")]
    return found


def positive_ints(values: Any, ndim: int) -> bool:
    return (
        isinstance(values, (list, tuple))
        and len(values) == ndim
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < LARGEST for v in values)
    )


def _index_layout(config: dict, chunks_per_shard: tuple[int, ...]) -> IndexLayout:
    index_codecs = config.get("index_codecs", [{"name": "bytes"}, {"name": "crc32c"}])
    names = [_name(c) for c in index_codecs] if isinstance(index_codecs, list) else None
    if names not in (["bytes"], ["bytes", "crc32c"]):
        raise Unsupported(f"index_codecs {names} are not supported (bytes, optionally crc32c)")
    first = index_codecs[0]
    endian = ((first.get("configuration") if isinstance(first, dict) else None) or {}).get("endian", "little")
    location = config.get("index_location", "end")
    if location not in ("start", "end"):
        raise Unsupported(f"index_location {location!r} is neither 'start' nor 'end'")
    return IndexLayout(chunks_per_shard, location == "start", names[-1] == "crc32c", endian == "big")


def chunk_codecs(
    data_type: Any, codecs: list, chunks: tuple[int, ...]
) -> tuple[np.dtype, Compressor | None, bool, Callable[[bytes, tuple[int, ...], Request], np.ndarray]]:
    """What a chunk's stored bytes are, for the views: (dtype in stored byte order, the one compressor over
    the raw bytes or None, whether they are neither (opaque), and how to decode them). Unsupported if they
    cannot be decoded here: array→array codecs, or an array→bytes codec other than `bytes`."""
    if itemsize(data_type) is None or np.dtype(data_type).kind not in "biuf":
        raise Unsupported(f"data type {data_type!r} has no equivalent in the other views")
    names = [_name(c) for c in codecs]
    if not names or names[0] != "bytes" or any(n not in UNDO for n in names[1:]):
        raise Unsupported(f"codecs {names} are not `bytes` followed by gzip, zstd, blosc or crc32c")
    config = codecs[0].get("configuration") if isinstance(codecs[0], dict) else None
    endian = (config or {}).get("endian", "little")
    dtype = np.dtype(data_type).newbyteorder("<" if endian == "little" else ">")
    post = tuple(names[1:])
    compressor = None
    if len(post) == 1 and post[0] != "crc32c":
        config = codecs[1].get("configuration") if isinstance(codecs[1], dict) else None
        compressor = Compressor(post[0], config or {})
    limit = 2 * math.prod(chunks) * dtype.itemsize + (1 << 20)

    def decode(data: bytes, shape: tuple[int, ...], request: Request) -> np.ndarray:
        raw = decode_blob(data, post, limit, request)
        if len(raw) != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"decodes to {len(raw)} bytes, not the {math.prod(shape)} elements of {list(shape)}")
        return np.frombuffer(raw, dtype).reshape(shape)

    return dtype, compressor, bool(post) and compressor is None, decode


def fill_value(value: Any, dtype: np.dtype) -> Any:
    """A zarr v3 fill value as a Python number or bool; NaN and the infinities are spelled as strings there."""
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity") and dtype.kind == "f":
        return float(value.replace("Infinity", "inf"))
    if isinstance(value, bool | int | float) and not (isinstance(value, float) and dtype.kind in "biu"):
        try:
            return dtype.type(value).item()
        except OverflowError:  # numpy refuses an integer its type cannot hold
            raise Unsupported(f"fill_value {value!r} is out of range for {dtype.name}") from None
    raise Unsupported(f"fill_value {value!r} is not a plain number for {dtype.name}")


def itemsize(data_type: Any) -> int | None:
    """Bytes per element of a fixed-size data type (zarr v3 names and the draft's '<i4' style), else None."""
    try:
        return np.dtype(data_type).itemsize or None if isinstance(data_type, str) else None
    except TypeError:
        return None
