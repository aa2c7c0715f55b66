"""The compressed Morton code that precomputed uses as the key of a grid cell.

Bit i of every dimension is interleaved, x first and least-significant first, and a dimension drops
out once its `bit_length(grid - 1)` bits are used up. Encoding and decoding go through per-byte
lookup tables, because the code is computed on every lookup and every listed chunk.
"""

from __future__ import annotations

from collections.abc import Sequence


def grid_bits(grid_shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(max(int(g) - 1, 0).bit_length() for g in grid_shape)


class MortonCode:
    """Encode grid positions to compressed Morton keys and back, for one grid shape."""

    def __init__(self, grid_shape: Sequence[int]) -> None:
        self.grid_shape = tuple(int(g) for g in grid_shape)
        bits = grid_bits(self.grid_shape)
        ndim = len(bits)
        # dest[d][i]: which bit of the key holds bit i of dimension d.
        dest: list[list[int]] = [[] for _ in range(ndim)]
        out = 0
        for i in range(max(bits, default=0)):
            for d in range(ndim):
                if i < bits[d]:
                    dest[d].append(out)
                    out += 1
        self.key_bits = out
        # (dimension, shift, table): key |= table[(pos[dimension] >> shift) & 0xFF]
        self._encode = [(d, k, _byte_table(dest[d][k : k + 8])) for d in range(ndim) for k in range(0, bits[d], 8)]
        # Decoding packs dimension d into bits [64 d, 64 d + 64) of one int, so table entries just add.
        source = [(d, i) for d in range(ndim) for i in range(bits[d])]
        by_key_bit = sorted(source, key=lambda di: dest[di[0]][di[1]])
        self._decode = [_byte_table([64 * d + i for d, i in by_key_bit[k : k + 8]]) for k in range(0, out, 8)]
        self._ndim = ndim

    def encode(self, pos: Sequence[int]) -> int:
        key = 0
        for d, shift, table in self._encode:
            key |= table[(pos[d] >> shift) & 0xFF]
        return key

    def contains(self, pos: Sequence[int]) -> bool:
        return len(pos) == self._ndim and min(pos) >= 0 and all(map(int.__lt__, pos, self.grid_shape))

    def decode(self, key: int) -> tuple[int, ...] | None:
        """The grid position of a key, or None if the key names no cell of the grid."""
        if key >> self.key_bits:
            return None
        packed = 0
        for k, table in enumerate(self._decode):
            packed += table[(key >> (8 * k)) & 0xFF]
        pos = tuple((packed >> (64 * d)) & 0xFFFFFFFFFFFFFFFF for d in range(self._ndim))
        return pos if self.contains(pos) else None


def _byte_table(targets: Sequence[int]) -> list[int]:
    """For each byte value v: bit targets[j] set for every bit j set in v."""
    return [sum(1 << t for j, t in enumerate(targets) if v >> j & 1) for v in range(256)]
