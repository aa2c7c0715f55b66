"""Chunk decoders for the Neuroglancer precomputed encodings, each a thin wrapper on a well-kept library.

Stored bytes are untrusted, and two of the libraries trust them: compressed_segmentation follows every offset
it reads without a bounds check, and compresso writes its run-length-decoded windows and indexes its tables
unchecked. Both crash the process on corrupt input, so the structure they walk is checked here first, with
numpy, against the chunk's known shape. Sizes claimed inside the data never size an allocation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import compressed_segmentation
import compresso
import numpy as np
import pyspng
import simplejpeg

from shardfs.shards.grid import grid_shape

_DTYPES = frozenset(("u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "f4", "f8"))


def decode_precomputed(
    data: bytes, encoding: str, shape: tuple[int, int, int, int], dtype: np.dtype, params: dict
) -> np.ndarray:
    """The chunk as a C-contiguous (c, z, y, x) array of little-endian dtype: the memory of precomputed's
    Fortran-order (x, y, z, c) chunk. shape is the chunk's clipped (x, y, z, channels); params is the scale's
    info. Any malformed data raises ValueError. A raw chunk is viewed, not copied, so may be read-only."""
    if len(shape) != 4 or not all(isinstance(n, (int, np.integer)) and n > 0 for n in shape):
        raise ValueError(f"chunk shape {shape!r} is not four positive integers")
    try:
        dt = np.dtype(dtype).newbyteorder("<")
    except TypeError:
        raise ValueError(f"{dtype!r} is not a dtype") from None
    if f"{dt.kind}{dt.itemsize}" not in _DTYPES:
        raise ValueError(f"{dt} is not a precomputed data type")
    decoder = _DECODERS.get(encoding)
    if decoder is None:
        raise ValueError(f"unknown encoding {encoding!r}")
    x, y, z, c = (int(n) for n in shape)
    out = decoder(bytes(data), (x, y, z, c), dt, params)
    if out.shape != (c, z, y, x) or out.dtype != dt:
        raise ValueError(f"{encoding} data decoded to {out.dtype}{out.shape}, not {dt}{(c, z, y, x)}")
    return np.ascontiguousarray(out)


def _library(codec: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """call(*args, **kwargs), with whatever the library raises on bad bytes turned into ValueError."""
    try:
        return call(*args, **kwargs)
    except Exception as e:  # RuntimeError, DecodeError, TypeError, ... depending on the library
        raise ValueError(f"bad {codec} data: {e}") from None


def _raw(data: bytes, shape: tuple[int, int, int, int], dtype: np.dtype, params: dict) -> np.ndarray:
    """Little-endian values in Fortran order: the bytes are already the (c, z, y, x) array."""
    x, y, z, c = shape
    if len(data) != x * y * z * c * dtype.itemsize:
        raise ValueError(f"raw data is {len(data)} bytes, not {x * y * z * c * dtype.itemsize}")
    return np.frombuffer(data, dtype).reshape(c, z, y, x)


def _image(pixels: np.ndarray, shape: tuple[int, int, int, int]) -> np.ndarray:
    """A jpeg or png image's pixels, rows concatenated, are the x, y, z voxels with channels interleaved."""
    x, y, z, c = shape
    return np.ascontiguousarray(pixels.reshape(z, y, x, c).transpose(3, 0, 1, 2))


def _jpeg(data: bytes, shape: tuple[int, int, int, int], dtype: np.dtype, params: dict) -> np.ndarray:
    """A grey image for one channel, a colour one for three; the header is checked before any decoding."""
    x, y, z, c = shape
    if dtype != np.uint8 or c not in (1, 3):
        raise ValueError(f"jpeg holds 1 or 3 channels of uint8, not {c} of {dtype}")
    height, width, colorspace, _ = _library("jpeg", simplejpeg.decode_jpeg_header, data)
    if height * width != x * y * z:
        raise ValueError(f"jpeg image is {width}x{height}, not {x * y * z} pixels")
    if colorspace not in (("Gray",) if c == 1 else ("YCbCr", "RGB")):
        raise ValueError(f"jpeg image is {colorspace}, for {c} channel(s)")
    pixels = _library("jpeg", simplejpeg.decode_jpeg, data, colorspace="GRAY" if c == 1 else "RGB")
    if pixels.shape[:2] != (height, width) or pixels.size != x * y * z * c:
        raise ValueError(f"jpeg image decoded to {pixels.shape}")
    return _image(pixels, shape)


_PNG_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # grey, grey+alpha, RGB, RGBA


def _png(data: bytes, shape: tuple[int, int, int, int], dtype: np.dtype, params: dict) -> np.ndarray:
    """One PNG channel per channel, 8 or 16 bits as dtype is; the header is checked before any decoding."""
    x, y, z, c = shape
    if dtype not in (np.uint8, np.uint16) or c not in _PNG_COLOR_TYPE:
        raise ValueError(f"png holds 1 to 4 channels of uint8 or uint16, not {c} of {dtype}")
    head = _library("png", pyspng.header, data)
    n = x * y * z
    if head["width"] * head["height"] != n:
        raise ValueError(f"png image is {head['width']}x{head['height']}, not {n} pixels")
    if (head["color_type"], head["bit_depth"]) != (_PNG_COLOR_TYPE[c], 8 * dtype.itemsize):
        raise ValueError(f"png color type {head['color_type']} at {head['bit_depth']} bits is not {c} x {dtype}")
    pixels = _library("png", pyspng.load, data)
    if pixels.dtype != dtype:
        raise ValueError(f"png image decoded to {pixels.dtype}")
    if pixels.size != n * c and c == 1 and dtype == np.uint16 and pixels.size == 2 * n:
        # pyspng shapes 16-bit grey as grey+alpha over a buffer that holds only the grey samples: the
        # first half of the flat view is the image and the second half is not its memory; never touch it.
        pixels = pixels.reshape(-1)[:n]
    elif pixels.size != n * c and c == 3 and pixels.ndim == 3 and pixels.shape[2] == 4:
        pixels = pixels[..., :3]  # pyspng renders 16-bit RGB as RGBA
    if pixels.size != n * c:
        raise ValueError(f"png image decoded to {pixels.shape}")
    return _image(pixels, shape)


def _block_size(params: dict) -> tuple[int, int, int]:
    """The scale's compressed_segmentation_block_size: three positive ints whose product is sane."""
    block = params.get("compressed_segmentation_block_size")
    if (
        not isinstance(block, (list, tuple))
        or len(block) != 3
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
        or block[0] * block[1] * block[2] > 1 << 30
    ):
        raise ValueError(f"compressed_segmentation_block_size {block!r} is not three positive integers")
    return block[0], block[1], block[2]


def _cseg(data: bytes, shape: tuple[int, int, int, int], dtype: np.dtype, params: dict) -> np.ndarray:
    """Neuroglancer's compressed segmentation, decoded by seung-lab's library once its reads are bounded.

    The library follows every header offset without a check. Channel offsets, block headers and each
    block's encoded values are checked here exactly. A lookup table's length is not recorded, only implied by
    the largest index its block's values hold; rather than unpack those, the buffer is padded so that no index
    the block's bit width allows can reach past it. If padding was needed, the chunk is decoded twice with
    different padding: any voxel whose label came from the padding differs, and means a table ran short."""
    x, y, z, c = shape
    if dtype not in (np.uint32, np.uint64):
        raise ValueError(f"compressed_segmentation holds uint32 or uint64, not {dtype}")
    bx, by, bz = _block_size(params)
    if len(data) % 4:
        raise ValueError("compressed_segmentation data is not whole 32-bit words")
    words = np.frombuffer(data, "<u4")
    n, entry = words.size, dtype.itemsize // 4
    # The last value bit each block's decoding reads, from its extent clipped to the chunk, in block order.
    dx, dy, dz = (np.minimum(b, s - np.arange(0, s, b)) for s, b in ((x, bx), (y, by), (z, bz)))
    last_bit = (bx * ((dz[:, None, None] - 1) * by + dy[None, :, None] - 1) + dx[None, None, :]).ravel()
    blocks = last_bit.size
    if n < c or words[0] != c:
        raise ValueError("compressed_segmentation channel offsets are missing")
    reach = n
    for start in words[:c].tolist():
        if start < c or start + 2 * blocks > n:
            raise ValueError(f"compressed_segmentation channel offset {start} is out of range")
        head = words[start : start + 2 * blocks].reshape(blocks, 2).astype(np.int64)
        table, bits, values = start + (head[:, 0] & 0xFFFFFF), head[:, 0] >> 24, start + head[:, 1]
        if not np.isin(bits, (0, 1, 2, 4, 8, 16)).all():  # 32 is legal, but the library mis-decodes it
            raise ValueError("compressed_segmentation block has an unsupported bit width")
        if ((bits > 0) & (values + (last_bit * bits + 31) // 32 > n)).any():
            raise ValueError("compressed_segmentation encoded values run past the end")
        if (table + entry > n).any():
            raise ValueError("compressed_segmentation lookup table starts past the end")
        reach = max(reach, int((table + (np.int64(1) << bits) * entry).max()))

    def decoded(fill: int) -> np.ndarray:
        padded = data + fill.to_bytes(4, "little") * (reach - n)
        return _library(
            "compressed_segmentation",
            compressed_segmentation.decompress,
            padded,
            (x, y, z, c),
            dtype,
            (bx, by, bz),
            order="F",
        )

    out = decoded(0)
    if reach > n and not np.array_equal(out, decoded(0xFFFFFFFF)):
        raise ValueError("compressed_segmentation lookup table index runs past the end")
    return out.T


_COMPRESSO_HEADER = 36  # magic, version, width, sx sy sz (u16), steps (u8 x3), id/value/location sizes, connectivity


def _compresso(data: bytes, shape: tuple[int, int, int, int], dtype: np.dtype, params: dict) -> np.ndarray:
    """seung-lab's compresso, after checking every table index its decoding will follow.

    The library run-length decodes the boundary windows into a fixed grid, looks up window values, labels
    connected components through the id table and walks the location list, none of it bounds-checked. So the
    boundaries are rebuilt here (cheap bit work) to check the grid, the window values and the location list
    exactly. The component count needs a labelling the library does itself; it is bounded here instead by the
    voxels that start a component in raster order, and when that bound passes the id table, the table is
    padded and the chunk decoded twice with different padding: a difference means the table ran short."""
    x, y, z, c = shape
    if c != 1 or dtype.kind != "u":
        raise ValueError(f"compresso holds one channel of unsigned integers, not {c} of {dtype}")
    if len(data) < _COMPRESSO_HEADER:
        raise ValueError("compresso data is shorter than its header")
    head = _library("compresso", compresso.header, data)
    xs, ys, zs = head["xstep"], head["ystep"], head["zstep"]
    if head["magic"] != b"cpso" or head["format_version"] not in (0, 1) or head["connectivity"] not in (4, 6):
        raise ValueError("compresso header is not valid")
    if not 0 < xs * ys * zs <= 64:
        raise ValueError(f"compresso steps {xs}x{ys}x{zs} are not 1 to 64 voxels")
    if (head["sx"], head["sy"], head["sz"], head["data_width"]) != (x, y, z, dtype.itemsize):
        raise ValueError(
            f"compresso header declares {head['sx']}x{head['sy']}x{head['sz']} of {head['data_width']}-byte"
            f" labels, not {x}x{y}x{z} of {dtype}"
        )
    label, window = dtype.itemsize, next(w for w in (1, 2, 4, 8) if xs * ys * zs <= 8 * w)
    index_width = compresso.zindex_byte_width(x, y) if head["format_version"] == 1 else 0
    values_at = _COMPRESSO_HEADER + head["id_size"] * label
    locations_at = values_at + head["value_size"] * window
    windows_at = locations_at + head["location_size"] * label
    index_at = len(data) - 2 * z * index_width
    if index_at < windows_at or (index_at - windows_at) % window:
        raise ValueError("compresso sections do not fit the data")
    if int.from_bytes(data[index_at + z * index_width : index_at + (z + 1) * index_width], "little"):
        raise ValueError("compresso location index does not start at zero")  # the library starts there
    values = np.frombuffer(data, f"<u{window}", head["value_size"], values_at)
    runs = np.frombuffer(data, f"<u{window}", (index_at - windows_at) // window, windows_at)
    boundary = _compresso_boundaries(runs, values, (x, y, z), (xs, ys, zs))
    locations = np.frombuffer(data, f"<u{label}", head["location_size"], locations_at)
    _check_compresso_locations(boundary, locations, head["connectivity"])
    # A component's first voxel in raster order has no earlier free neighbour: there are at most that many.
    free = ~boundary
    first = free.copy()
    first[:, :, 1:] &= boundary[:, :, :-1]
    first[:, 1:, :] &= boundary[:, :-1, :]
    if head["connectivity"] == 6:
        first[1:] &= boundary[:-1]
    ids = max(head["id_size"], int(np.count_nonzero(first)))

    def decoded(fill: int) -> np.ndarray:
        padding = bytes([fill]) * ((ids - head["id_size"]) * label)
        stream = data[:15] + ids.to_bytes(8, "little") + data[23:values_at] + padding + data[values_at:]
        out = _library("compresso", compresso.decompress, stream)
        if out.shape != (x, y, z) or out.dtype != dtype:
            raise ValueError(f"compresso data decoded to {out.dtype}{out.shape}")
        return out

    out = decoded(0)
    if ids > head["id_size"] and not np.array_equal(out, decoded(0xFF)):
        raise ValueError("compresso has more components than ids")
    return out.T[np.newaxis]


def _compresso_boundaries(
    runs: np.ndarray, values: np.ndarray, size: tuple[int, int, int], steps: tuple[int, int, int]
) -> np.ndarray:
    """The (z, y, x) boundary voxels the library will derive, checking the run-length-coded windows first:
    each must land inside the block grid and name a stored window value."""
    (x, y, z), (xs, ys, zs) = size, steps
    nx, ny, nz = grid_shape(size, steps)
    grid = nx * ny * nz
    skip = (runs & 1).astype(bool)
    advance = np.where(skip, runs >> 1, 1).astype(np.uint64)
    if (advance > grid).any():
        raise ValueError("compresso window run is longer than the grid")
    at, kept = (np.cumsum(advance) - advance)[~skip], runs[~skip] >> 1
    if (at >= grid).any():
        raise ValueError("compresso windows run past the block grid")
    if values.size == 0:  # the library then has no boundaries, whatever the windows say
        return np.zeros((z, y, x), bool)
    if (kept >= values.size).any():
        raise ValueError("compresso window names a value past the table")
    windows = np.zeros(grid, np.int64)  # a block no run writes is window 0, like any other
    windows[at] = kept
    pattern = values[windows].astype(np.uint64)
    xi, yi = np.arange(x), np.arange(y)[:, None]
    block = xi // xs + nx * (yi // ys)
    bit = (xi % xs + xs * (yi % ys)).astype(np.uint64)
    out = np.empty((z, y, x), bool)
    for k in range(z):
        out[k] = (pattern[block + nx * ny * (k // zs)] >> (bit + np.uint64(xs * ys * (k % zs)))) & np.uint64(1)
    return out


def _check_compresso_locations(boundary: np.ndarray, locations: np.ndarray, connectivity: int) -> None:
    """Each boundary voxel with no free earlier neighbour takes the next location: a neighbour's direction
    (0-5), 6 then a literal label, or a label plus 7. There must be enough, and each direction must stay
    inside the chunk (the library misses the last slice for direction 5)."""
    z, y, x = boundary.shape
    settled = np.zeros_like(boundary)
    settled[:, :, 1:] |= ~boundary[:, :, :-1]
    settled[:, 1:, :] |= ~boundary[:, :-1, :]
    if connectivity == 6:
        settled[1:] |= ~boundary[:-1]
    zz, yy, xx = np.nonzero(boundary & ~settled)
    # Opcodes are the entries not following an opcode 6; within a run of 6s every other one is an opcode.
    six = locations == 6
    index = np.arange(six.size)
    starts = six.copy()
    starts[1:] &= ~six[:-1]
    opcode_six = six & ((index - np.maximum.accumulate(np.where(starts, index, 0))) % 2 == 0)
    literal = np.zeros_like(six)
    literal[1:] = opcode_six[:-1]
    at = np.flatnonzero(~literal)[: zz.size]
    if at.size < zz.size or (at.size and opcode_six[at[-1]] and at[-1] + 1 >= locations.size):
        raise ValueError("compresso has fewer locations than its boundaries need")
    ops = locations[at]
    outside = (
        ((ops == 0) & (xx == 0))
        | ((ops == 1) & (xx == x - 1))
        | ((ops == 2) & (yy == 0))
        | ((ops == 3) & (yy == y - 1))
        | ((ops == 4) & (zz == 0))
        | ((ops == 5) & (zz == z - 1))
    )
    if outside.any():
        raise ValueError("compresso location points outside the chunk")


_DECODERS: dict[str, Callable[[bytes, tuple[int, int, int, int], np.dtype, dict], np.ndarray]] = {
    "raw": _raw,
    "jpeg": _jpeg,
    "png": _png,
    "compressed_segmentation": _cseg,
    "compresso": _compresso,
}
# Every chunk encoding a precomputed writer is known to use (neuroglancer, cloud-volume, igneous), whether or
# not the views decode it: a name outside this is most likely a typo, worth a word at mount time.
KNOWN = (*_DECODERS, "jxl", "fpzip", "kempressed", "zfpc", "crackle")
