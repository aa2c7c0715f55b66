"""Bytes→bytes codecs undone with a bound on the output. Sizes claimed by stored data are untrusted: a few
hundred KB of gzip or zstd can claim gigabytes, so output is made piecewise and refused past a limit."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterable, Iterator

import google_crc32c
import numpy as np
import zstandard

from shardfs.cache import LARGE_VALUE, ByteCache, large_value_turn
from shardfs.errors import OverLimit
from shardfs.request import OWN, Request

STEP = 1 << 20


def _bounded(pieces: Iterator[bytes], limit: int, codec: str, request: Request, cache: ByteCache | None) -> bytearray:
    """Decoded pieces gathered in one growing buffer (no second copy at the end), refused as soon as they
    pass limit bytes, or request's budget. Past LARGE_VALUE, made in cache's turn (its mount's)."""
    out = bytearray()
    with contextlib.ExitStack() as large:
        for piece in pieces:
            request.spend(len(piece))
            if len(out) + len(piece) > limit:
                raise OverLimit(f"{codec} data decodes to more than the {limit}-byte limit", limit)
            if len(out) + len(piece) > LARGE_VALUE >= len(out):
                large.enter_context(large_value_turn(len(out) + len(piece), cache))
            out += piece
    return out


def gunzip(
    data: bytes | bytearray | Iterable[bytes], limit: int, request: Request = OWN, cache: ByteCache | None = None
) -> bytes | bytearray:
    """Every gzip member of data: bytes, or their pieces in order (read from the store as they are needed,
    so a large stored value is never held whole beside its output). ValueError on bad gzip, trailing junk,
    or output beyond limit bytes or request's budget; a refused bomb costs at most limit bytes, briefly.
    cache: the mount's, whose turn a large output takes (None: the process's, outside a mount)."""
    if isinstance(data, bytes | bytearray) and len(data) <= STEP:
        small = _small_gunzip(data, limit, request)
        if small is not None:
            return small
    pieces = _slices(data) if isinstance(data, bytes | bytearray) else iter(data)
    # Pieces of at most 1 MiB: a small limit is one call, a large one cannot double its buffer past it.
    return _bounded(_gzip_pieces(pieces, min(limit + 1, STEP)), limit, "gzip", request, cache)


def _small_gunzip(data: bytes | bytearray, limit: int, request: Request) -> bytes | None:
    """The common case in one call (one member, small output: every chunk of a volume), or None for the
    general path to handle, errors included. Output past LARGE_VALUE goes that way too, to take its turn."""
    member = zlib.decompressobj(wbits=31)
    try:
        out = member.decompress(data, min(limit, LARGE_VALUE) + 1)
    except zlib.error:
        return None
    if not member.eof or member.unused_data or len(out) > min(limit, LARGE_VALUE):
        return None
    request.spend(len(out))
    return out


def _slices(data: bytes | bytearray) -> Iterator[memoryview]:
    view = memoryview(data)
    return (view[at : at + STEP] for at in range(0, len(view), STEP))


def _gzip_pieces(source: Iterator[bytes | memoryview], step: int) -> Iterator[bytes]:
    """Output pieces of at most step bytes, member after member, input pulled a piece at a time."""
    member, started, data = zlib.decompressobj(wbits=31), False, b""
    try:
        while True:
            data = data or next(source, b"")
            if not data and not started:
                return
            out = member.decompress(data, step)  # with no data left: the output still pending, if any
            if not data and not out and not member.eof:
                raise ValueError("gzip data ends before its stream does")
            started = True
            yield out
            if member.eof:  # the next member starts in what this one left over
                data, member, started = member.unused_data, zlib.decompressobj(wbits=31), False
            else:
                data = member.unconsumed_tail
    except zlib.error as e:
        raise ValueError(f"bad gzip data: {e}") from None


def unzstd(data: bytes, limit: int, request: Request = OWN, cache: ByteCache | None = None) -> bytearray:
    """Every zstd frame of data, read piecewise; ValueError on bad data or output beyond limit bytes (as
    gunzip: request's budget, cache's turn)."""
    try:
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
            return _bounded(iter(lambda: reader.read(STEP), b""), limit, "zstd", request, cache)
    except zstandard.ZstdError as e:
        raise ValueError(f"bad zstd data: {e}") from None


def unblosc(data: bytes, limit: int, request: Request = OWN, cache: ByteCache | None = None) -> bytes:
    """A blosc buffer, whose header states its decoded size (bytes 4-8): checked before decoding (as gunzip:
    request's budget, cache's turn)."""
    if len(data) < 16:
        raise ValueError("blosc data is shorter than its header")
    declared = int.from_bytes(data[4:8], "little")
    if declared > limit:
        raise OverLimit(f"blosc data claims {declared} bytes, more than the {limit}-byte limit", limit, declared)
    request.spend(declared)
    with large_value_turn(declared, cache):
        try:
            from numcodecs import Blosc  # on first use: its import costs every CLI command 0.2 s of CPU

            return bytes(Blosc().decode(data))
        except Exception as e:  # numcodecs raises RuntimeError and others on corrupt input
            raise ValueError(f"bad blosc data: {e}") from None


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """The CRC-32C of any buffer. google_crc32c (the implementation numcodecs also takes) reads only bytes and
    arrays: a uint8 array over the buffer is one, uncopied."""
    return google_crc32c.value(np.frombuffer(data, np.uint8))


def strip_crc32c(data: bytes) -> bytes:
    """Data without its trailing crc32c (little-endian), which must match."""
    if len(data) < 4 or crc32c(memoryview(data)[:-4]) != int.from_bytes(data[-4:], "little"):
        raise ValueError("crc32c does not match")
    return data[:-4]


def _crc32c_undone(data: bytes, limit: int, request: Request = OWN, cache: ByteCache | None = None) -> bytes:
    return strip_crc32c(data)


# A codec's name → how it is undone: (data, limit, request, cache) as gunzip takes them.
UNDO = {"gzip": gunzip, "zstd": unzstd, "blosc": unblosc, "crc32c": _crc32c_undone}
