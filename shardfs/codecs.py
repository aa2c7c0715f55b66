"""Bytes→bytes codecs undone with a bound on the output. Sizes claimed by stored data are untrusted: a few
hundred KB of gzip or zstd can claim gigabytes, so output is made piecewise and refused past a limit."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import crc32c
import numcodecs
import zstandard

STEP = 1 << 20


def _bounded(pieces: Iterator[bytes], limit: int, codec: str) -> bytes:
    """Join decoded pieces, refusing as soon as they pass limit bytes."""
    out, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > limit:
            raise ValueError(f"{codec} data decodes to more than the {limit}-byte limit")
        out.append(piece)
    return b"".join(out)


def gunzip(data: bytes, limit: int) -> bytes:
    """Every gzip member of data. ValueError on bad gzip, trailing junk, or output beyond limit bytes; a
    refused bomb costs at most limit bytes, briefly."""
    # Pieces of at most 1 MiB: a small limit is one call, a large one cannot double its buffer past it.
    return _bounded(_gzip_pieces(data, min(limit + 1, STEP)), limit, "gzip")


def _gzip_pieces(data: bytes, step: int) -> Iterator[bytes]:
    rest = data
    while rest:
        member = zlib.decompressobj(wbits=31)
        try:
            while not member.eof and (rest or member.unconsumed_tail):
                yield member.decompress(rest or member.unconsumed_tail, step)
                rest = b""
        except zlib.error as e:
            raise ValueError(f"bad gzip data: {e}") from None
        if not member.eof:
            raise ValueError("gzip data ends before its stream does")
        rest = member.unused_data


def unzstd(data: bytes, limit: int) -> bytes:
    """Every zstd frame of data, read piecewise; ValueError on bad data or output beyond limit bytes."""
    try:
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
            return _bounded(iter(lambda: reader.read(STEP), b""), limit, "zstd")
    except zstandard.ZstdError as e:
        raise ValueError(f"bad zstd data: {e}") from None


def unblosc(data: bytes, limit: int) -> bytes:
    """A blosc buffer, whose header states its decoded size (bytes 4-8): checked before decoding."""
    if len(data) < 16:
        raise ValueError("blosc data is shorter than its header")
    declared = int.from_bytes(data[4:8], "little")
    if declared > limit:
        raise ValueError(f"blosc data claims {declared} bytes, more than the {limit}-byte limit")
    try:
        return bytes(numcodecs.Blosc().decode(data))
    except Exception as e:  # numcodecs raises RuntimeError and others on corrupt input
        raise ValueError(f"bad blosc data: {e}") from None


def strip_crc32c(data: bytes) -> bytes:
    """Data without its trailing crc32c (little-endian), which must match."""
    if len(data) < 4 or crc32c.crc32c(data[:-4]) != int.from_bytes(data[-4:], "little"):
        raise ValueError("crc32c does not match")
    return data[:-4]


UNDO = {"gzip": gunzip, "zstd": unzstd, "blosc": unblosc, "crc32c": lambda data, limit: strip_crc32c(data)}
