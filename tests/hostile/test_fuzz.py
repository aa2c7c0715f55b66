"""Property-based fuzzing of shard bytes and metadata, in-process through the Tree that FUSE serves.

Base datasets are written once by the real peers (tensorstore, cloud-volume, zarr-python 3). What each
chunk depends on (index entries, minishard index, data range; zarr index and (offset, nbytes) range) is
worked out here from the specs, independently of shardfs, and its expected bytes come from the peers.
Hypothesis then damages shard files and metadata thousands of times. Every operation must end, within a
time bound, in one of the answers FUSE can give for it: the right bytes (whenever the damage cannot have
reached what the chunk depends on), ENOENT or EIO. Any other exception is a bug, and memory stays bounded.
"""

from __future__ import annotations

import gzip
import json
import math
import posixpath
import resource
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mmh3
import numpy as np
import pytest
import tensorstore as ts
import zarr
from google_crc32c import value as crc32c
from hypothesis import event, given, settings
from hypothesis import strategies as st
from zarr.codecs import BytesCodec, GzipCodec, ShardingCodec

from shardfs.errors import SourceError
from shardfs.source import open_source
from tests.support.fuzzing import (
    CACHE_BYTES,
    EIO,
    ENOENT,
    FUZZ,
    IS_DIR,
    Failed,
    attempt,
    open_or_refuse,
    read_file,
    walk,
)
from tests.support.peers import (
    compressed_morton_code,
    kv_dataset,
    sharding_spec,
    write_cloudvolume_multires_meshes,
    write_cloudvolume_skeletons,
    write_tensorstore_annotations,
    write_tensorstore_kv,
)

RSS_GROWTH_BYTES = 300 << 20  # bound on the growth of this process's peak RSS over the module


_BASELINE_RSS: list[int] = []


def assert_memory_bounded() -> None:
    """Peak RSS may not grow by more than the bound since the datasets were written (ru_maxrss is in KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if not _BASELINE_RSS:
        _BASELINE_RSS.append(peak)
    assert peak - _BASELINE_RSS[0] <= RSS_GROWTH_BYTES, f"peak RSS grew by {(peak - _BASELINE_RSS[0]) >> 20} MiB"


# ---------------------------------------------------------------------------------------------------------------------
# What each chunk depends on, from the specs


@dataclass
class Expect:
    """One path of the unsharded tree and what its answer depends on in one shard file."""

    path: str  # in the tree
    shard: str  # the shard file (relative to the source root) that holds it, present or not
    value: bytes | None = field(repr=False)  # None: absent (ENOENT)
    ranges: list[tuple[int, int]]  # byte ranges of the shard its answer is read from
    listing: list[tuple[int, int]]  # byte ranges that decide whether it is listed
    min_len: int = 0  # the shard must be at least this long (precomputed: its shard index)
    exact_len: bool = False  # any change of the shard's length moves what it depends on (zarr index at the end)


@dataclass
class Slot:
    """A uint64 field of an index, with the crc32c to fix up after writing it (zarr), if any."""

    at: int
    crc: tuple[int, int, int] | None = None  # (table start, table stop, crc position)


@dataclass
class Base:
    """A pristine dataset: a working copy that examples damage and restore, and what it must answer."""

    name: str
    root: Path
    expects: list[Expect] = field(repr=False)
    shards: dict[str, bytes] = field(repr=False)  # pristine bytes of every shard file
    slots: dict[str, list[Slot]] = field(repr=False)  # index fields of each shard, for structured mutations
    pairs: dict[str, list[tuple[Slot, Slot]]] = field(repr=False)  # (offset, nbytes) or (start, stop) entries
    metadata: dict[str, bytes] = field(default_factory=dict, repr=False)  # pristine metadata files

    def restore(self) -> None:
        for rel, data in {**self.shards, **self.metadata}.items():
            (self.root / rel).write_bytes(data)


def murmur(key: int, preshift_bits: int) -> int:
    """The spec's hash: murmurhash3_x86_128 of the shifted key's 8 little-endian bytes, low 64 bits."""
    return mmh3.hash64((key >> preshift_bits).to_bytes(8, "little"), 0, False, False)[0]


def precomputed_layout(
    directory: str, root: Path, spec: dict, values: dict[int, bytes], names: Callable[[int], str], absent: list[int]
) -> tuple[list[Expect], dict[str, bytes], dict[str, list[Slot]], dict[str, list[tuple[Slot, Slot]]]]:
    """Parse every shard of a `neuroglancer_uint64_sharded_v1` directory by the spec, check it against the
    peer's values, and say what each key depends on."""
    mb, sb = spec["minishard_bits"], spec["shard_bits"]
    index_size = 16 << mb
    digits = max(1, -(-sb // 4))
    shards, slots, pairs = {}, {}, {}
    where: dict[int, tuple[str, int, list[tuple[int, int]], tuple[int, int]]] = {}
    minishard_of: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for path in sorted((root / directory).glob("*.shard")):
        rel = str(path.relative_to(root))
        data = path.read_bytes()
        shards[rel] = data
        slots[rel] = [Slot(8 * i) for i in range(2 << mb)]
        pairs[rel] = [(Slot(16 * m), Slot(16 * m + 8)) for m in range(1 << mb)]
        for m in range(1 << mb):
            lo, hi = (index_size + v for v in struct.unpack_from("<QQ", data, 16 * m))
            deps = [(16 * m, 16 * m + 16), (lo, hi)]
            minishard_of[(rel, m)] = deps
            if lo == hi:
                continue
            raw = data[lo:hi]
            if spec["minishard_index_encoding"] == "raw":
                slots[rel] += [Slot(at) for at in range(lo, hi, 8)]
            else:
                raw = gzip.decompress(raw)
            rows = np.frombuffer(raw, "<u8").reshape(3, -1).tolist()
            key, end = 0, index_size
            for delta, offset, size in zip(*rows, strict=True):
                key, start = key + delta, end + offset
                end = start + size
                h = murmur(key, spec["preshift_bits"])
                assert (h & ((1 << mb) - 1), (h >> mb) & ((1 << sb) - 1)) == (m, int(path.stem, 16)), key
                where[key] = (rel, m, deps, (start, end))
    assert set(where) == set(values), "the spec parse and the peer disagree on the keys"
    expects = []
    for key, (rel, _, deps, (start, end)) in where.items():
        stored = shards[rel][start:end]
        if spec["data_encoding"] == "gzip":
            stored = gzip.decompress(stored)
        assert stored == values[key], f"the spec parse and the peer disagree on key {key}"
        expects.append(Expect(f"{directory}/{names(key)}", rel, values[key], [*deps, (start, end)], deps, index_size))
    for key in absent:
        h = murmur(key, spec["preshift_bits"])
        rel = posixpath.join(directory, f"{(h >> mb) & ((1 << sb) - 1):0{digits}x}.shard").removeprefix("./")
        deps = minishard_of.get((rel, h & ((1 << mb) - 1)), [])
        expects.append(Expect(f"{directory}/{names(key)}", rel, None, deps, deps, index_size if deps else 0))
    return expects, shards, slots, pairs


def zarr_index(
    data: bytes, lo: int, hi: int, entries: int, at_start: bool
) -> tuple[tuple[int, int], list[tuple[int, int] | None], list[tuple[Slot, Slot]]]:
    """A zarr sharding index (crc32c'd) of the blob data[lo:hi]: its byte range, its entries as absolute
    (start, stop) or None for empty, and its fields as slots."""
    size = 16 * entries + 4
    at = lo if at_start else hi - size
    table = data[at : at + 16 * entries]
    assert crc32c(table) == int.from_bytes(data[at + 16 * entries : at + size], "little")
    crc = (at, at + 16 * entries, at + 16 * entries)
    rows = np.frombuffer(table, "<u8").reshape(-1, 2).tolist()
    empty = (1 << 64) - 1
    found = [None if o == n == empty else (lo + o, lo + o + n) for o, n in rows]
    slots = [(Slot(at + 16 * i, crc), Slot(at + 16 * i + 8, crc)) for i in range(entries)]
    return (at, at + size), found, slots


@dataclass
class ZarrCase:
    """One sharded zarr array, as written by zarr-python 3."""

    name: str
    shape: tuple[int, int]
    shard: tuple[int, int]
    levels: list[tuple[tuple[int, int], bool]]  # per level: (inner chunk shape, index at start)
    gzip: bool  # inner chunks are bytes+gzip (else bytes)


ZARR_CASES = [
    ZarrCase("end", (24, 20), (8, 10), [((4, 5), False)], False),
    ZarrCase("start", (16, 16), (8, 8), [((4, 4), True)], True),
    ZarrCase("nested", (32, 16), (16, 16), [((8, 8), False), ((4, 4), False)], False),
]


def write_zarr_case(group: zarr.Group, case: ZarrCase, rng: np.random.Generator) -> np.ndarray:
    codecs: list = [BytesCodec(), GzipCodec()] if case.gzip else [BytesCodec()]
    for inner, at_start in reversed(case.levels):
        codecs = [ShardingCodec(chunk_shape=inner, codecs=codecs, index_location="start" if at_start else "end")]
    array = group.create_array(
        case.name, shape=case.shape, dtype="uint16", chunks=case.shard, serializer=codecs[0], compressors=None,
        fill_value=0,
    )  # fmt: skip
    data = rng.integers(1, 60000, case.shape, dtype=np.uint16)
    data[case.shape[0] * 3 // 4 :, : case.shape[1] // 2] = 0  # never written: absent chunks, and one absent shard
    array[...] = data
    return np.asarray(array[...])


def zarr_layout(root: Path, case: ZarrCase, contents: np.ndarray) -> tuple[list[Expect], dict, dict, dict]:
    """Parse every shard of a zarr array by the spec, check each inner chunk against zarr-python's values,
    and say what each chunk depends on."""
    inner = case.levels[-1][0]
    grid = tuple(-(-s // c) for s, c in zip(case.shape, inner, strict=True))
    expects, shards, slots, pairs = [], {}, {}, {}
    for sx in range(-(-case.shape[0] // case.shard[0])):
        for sy in range(-(-case.shape[1] // case.shard[1])):
            rel = f"{case.name}/c/{sx}/{sy}"
            path = root / rel
            data = path.read_bytes() if path.exists() else None
            if data is not None:
                shards[rel], slots[rel], pairs[rel] = data, [], []
            first, regions = len(expects), []
            # (origin in innermost chunks, blob range, dependencies so far)
            todo: list[tuple[tuple[int, int], int, tuple[int, int] | None, list]] = [
                ((sx * case.shard[0] // inner[0], sy * case.shard[1] // inner[1]), 0, (0, len(data or b"")), [])
            ]
            while todo:
                origin, depth, blob, deps = todo.pop()
                outer = case.shard if depth == 0 else case.levels[depth - 1][0]
                level_inner, at_start = case.levels[depth]
                cps = (outer[0] // level_inner[0], outer[1] // level_inner[1])
                step = (level_inner[0] // inner[0], level_inner[1] // inner[1])
                if data is None or blob is None:
                    found: list = [None] * math.prod(cps)
                    region = None
                else:
                    region, found, fields = zarr_index(data, *blob, math.prod(cps), at_start)
                    regions.append(region)
                    slots[rel] += [s for pair in fields for s in pair]
                    pairs[rel] += fields
                here = [*deps, region] if region else deps
                for i, entry in enumerate(found):
                    pos = (origin[0] + (i // cps[1]) * step[0], origin[1] + (i % cps[1]) * step[1])
                    if depth + 1 < len(case.levels):
                        todo.append((pos, depth + 1, entry, here))
                        continue
                    if pos[0] >= grid[0] or pos[1] >= grid[1]:
                        continue
                    tree_path = f"{case.name}/c/{pos[0]}/{pos[1]}"
                    lo0, lo1 = pos[0] * inner[0], pos[1] * inner[1]
                    want = contents[lo0 : lo0 + inner[0], lo1 : lo1 + inner[1]]
                    if entry is None:
                        assert not want.any(), f"{tree_path}: zarr-python reads data where the index has none"
                        expects.append(Expect(tree_path, rel, None, here, here, exact_len=not case.levels[0][1]))
                        continue
                    stored = data[entry[0] : entry[1]]
                    raw = gzip.decompress(stored) if case.gzip else stored
                    assert np.array_equal(np.frombuffer(raw, "<u2").reshape(inner), want), tree_path
                    ranges = [*here, entry]
                    expects.append(Expect(tree_path, rel, stored, ranges, here, exact_len=not case.levels[0][1]))
            for e in expects[first:]:  # a shard lists whole or not at all: any index of it decides
                e.listing = list(regions)
    return expects, shards, slots, pairs


# ---------------------------------------------------------------------------------------------------------------------
# The base datasets, written once per module by the peers


def volume_base(root: Path, scratch: Path) -> Base:
    """A tensorstore-sharded volume scale (raw minishard index, gzip data, some chunks never written) and
    cloud-volume-sharded skeletons linked from it (gzip index and data)."""
    size, chunk = (64, 48, 16), (16, 16, 8)
    spec = sharding_spec(minishard_index_encoding="raw", data_encoding="gzip", minishard_bits=2, shard_bits=1)
    vol = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": str(root)},
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": {
                "size": list(size), "chunk_size": list(chunk), "resolution": [4, 4, 40], "encoding": "raw",
                "sharding": spec,
            },
            "create": True,
        }
    ).result()  # fmt: skip
    data = np.random.default_rng(1).integers(0, 256, (*size, 1), dtype=np.uint8)
    vol[:48, :, :].write(data[:48]).result()  # x in [48, 64) never written: absent chunks
    grid = tuple(s // c for s, c in zip(size, chunk, strict=True))
    positions = [(x, y, z) for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
    names = {
        compressed_morton_code(p, grid): "_".join(f"{i * c}-{(i + 1) * c}" for i, c in zip(p, chunk, strict=True))
        for p in positions
    }
    base = {"driver": "file", "path": f"{root}/4_4_40/"}
    kv = ts.KvStore.open({"driver": "neuroglancer_uint64_sharded", "base": base, "metadata": spec}).result()
    # The peer reads the values back: the bytes each unsharded chunk file holds.
    values = {}
    for key in names:
        got = kv.read(key.to_bytes(8, "big")).result()
        if got.state == "value":
            values[key] = bytes(got.value)
    assert 0 < len(values) < len(names)
    expects, shards, slots, pairs = precomputed_layout(
        "4_4_40", root, spec, values, names.__getitem__, [k for k in names if k not in values]
    )
    skeletons = write_cloudvolume_skeletons(scratch)
    shutil.copytree(scratch / "skeletons", root / "skeletons")
    info = json.loads((root / "info").read_text())
    (root / "info").write_text(json.dumps({**info, "skeletons": "skeletons"}))
    skel_spec = json.loads((root / "skeletons" / "info").read_text())["sharding"]
    more = precomputed_layout("skeletons", root, skel_spec, skeletons, str, [0, 4, 5, 2**64 - 1])
    metadata = {rel: (root / rel).read_bytes() for rel in ("info", "skeletons/info")}
    return Base(
        "volume", root, expects + more[0], {**shards, **more[1]}, {**slots, **more[2]}, {**pairs, **more[3]}, metadata
    )


def kv_base(root: Path) -> Base:
    """A bare key-value directory sharded by tensorstore: raw data, gzip minishard index, keys up to 2^64-1."""
    spec = sharding_spec(preshift_bits=0, minishard_bits=2, shard_bits=1, minishard_index_encoding="gzip",
                         data_encoding="raw")  # fmt: skip
    rng = np.random.default_rng(2)
    keys = [0, 1, 2, 3, 17, 255, 1000, 65537, 2**32, 2**40 + 3, 2**63, 2**64 - 2, 2**64 - 1]
    items = {k: rng.bytes(int(rng.integers(0, 300))) for k in keys}
    write_tensorstore_kv(root, items, sharding=spec)
    expects, shards, slots, pairs = precomputed_layout(".", root, spec, items, str, [4, 5, 99, 2**50])
    for e in expects:
        e.path = e.path.removeprefix("./")
    return Base("kv", root, expects, shards, slots, pairs, {"info": (root / "info").read_bytes()})


def zarr_base(root: Path) -> Base:
    """A zarr v3 group of sharded arrays written by zarr-python 3: index at the end and at the start (both
    crc32c'd), and two levels of nesting."""
    group = zarr.open_group(root, mode="w")
    rng = np.random.default_rng(3)
    expects, shards, slots, pairs = [], {}, {}, {}
    for case in ZARR_CASES:
        contents = write_zarr_case(group, case, rng)
        more = zarr_layout(root, case, contents)
        expects += more[0]
        shards |= more[1]
        slots |= more[2]
        pairs |= more[3]
    assert any(e.value is None for e in expects) and any(e.value for e in expects)
    metadata = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("zarr.json")}
    return Base("zarr", root, expects, shards, slots, pairs, metadata)


class Bases:
    """The base datasets by name; its repr is short, since Hypothesis prints it with every failing example."""

    def __init__(self, made: dict[str, Base]) -> None:
        self._made = made

    def __getitem__(self, name: str) -> Base:
        return self._made[name]

    def values(self) -> list[Base]:
        return list(self._made.values())

    def __repr__(self) -> str:
        return f"<bases {', '.join(f'{b.name}={b.root}' for b in self._made.values())}>"


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Bases:
    where = tmp_path_factory.mktemp("fuzz")
    made = Bases(
        {
            "volume": volume_base(where / "volume", where / "scratch"),
            "kv": kv_base(where / "kv"),
            "zarr": zarr_base(where / "zarr"),
        }
    )
    _BASELINE_RSS.clear()
    assert_memory_bounded()  # the baseline: after the peers have done their work
    return made


def test_pristine_sources_read_back_exactly(bases: Bases) -> None:
    """The harness's own check: undamaged, every expectation holds and every stored chunk is listed."""
    for base in bases.values():
        tree = open_source(base.root, CACHE_BYTES).tree
        listed = walk(tree)
        for e in base.expects:
            assert read_file(tree, e.path) == (ENOENT if e.value is None else e.value), e.path
            assert (e.path in listed) == (e.value is not None), e.path
        assert not [p for p, v in listed.items() if isinstance(v, Failed)]


# ---------------------------------------------------------------------------------------------------------------------
# Damage to shard bytes

EMPTY_U64 = (1 << 64) - 1
CRAFTED = [0, 1, 2, 7, 8, 16, 24, 2**31, 2**32 - 1, 2**32, 2**40, 2**53, 2**63 - 1, 2**63, 2**64 - 24, 2**64 - 2,
           EMPTY_U64]  # fmt: skip


def u64s(length: int) -> st.SearchStrategy[int]:
    """uint64 values that hurt: edges, values near the file's size, and anything at all."""
    near = [v for v in (length - 16, length - 1, length, length + 1, length // 2) if v >= 0]
    return st.one_of(st.sampled_from(CRAFTED + near), st.integers(0, EMPTY_U64))


def put(data: bytearray, slot: Slot, value: int, fix: set[tuple[int, int, int]]) -> None:
    if slot.at + 8 <= len(data):
        struct.pack_into("<Q", data, slot.at, value)
        if slot.crc:
            fix.add(slot.crc)


@st.composite
def damaged_shard(draw: st.DrawFn, base: Base) -> tuple[str, bytes]:
    """One shard file with one to three kinds of damage, raw or structured (index fields set to crafted
    values, zarr checksums recomputed so that the damaged index is believed)."""
    rel = draw(st.sampled_from(sorted(base.shards)))
    data = bytearray(base.shards[rel])
    kinds = ["flip", "overwrite", "u64", "truncate", "append", "field", "pair", "alias"]
    for kind in draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=3)):
        n, fix = len(data), set[tuple[int, int, int]]()
        slots, pairs = base.slots[rel], base.pairs[rel]
        if kind == "flip" and n:
            for _ in range(draw(st.integers(1, 8))):
                data[draw(st.integers(0, n - 1))] ^= draw(st.integers(1, 255))
        elif kind == "overwrite" and n:
            at = draw(st.integers(0, n - 1))
            junk = draw(st.binary(min_size=1, max_size=64))[: n - at]
            data[at : at + len(junk)] = junk
        elif kind == "u64" and n >= 8:
            struct.pack_into("<Q", data, draw(st.integers(0, n - 8)), draw(u64s(n)))
        elif kind == "truncate" and n:
            edges = sorted({x for e in base.expects if e.shard == rel for r in e.ranges for x in r if 0 < x < n})
            cut = draw(st.one_of(st.integers(0, n - 1), st.sampled_from(edges or [0])))
            del data[cut - draw(st.integers(0, 1)) if cut else 0 :]
        elif kind == "append":
            data += draw(st.binary(min_size=1, max_size=256))
        elif kind == "field" and slots:
            put(data, draw(st.sampled_from(slots)), draw(u64s(n)), fix)
        elif kind == "pair" and pairs:
            first, second = draw(st.sampled_from(pairs))
            other = draw(st.sampled_from(pairs))
            values = draw(
                st.one_of(
                    st.tuples(u64s(n), u64s(n)),
                    st.just((EMPTY_U64, EMPTY_U64)),
                    st.just(tuple(int.from_bytes(data[s.at : s.at + 8], "little") for s in other)),  # aliasing
                )
            )
            put(data, first, values[0], fix)
            put(data, second, values[1], fix)
        elif kind == "alias" and pairs:  # every entry of one index points where one of them does
            first, second = draw(st.sampled_from(pairs))
            values = [int.from_bytes(data[s.at : s.at + 8], "little") for s in (first, second)]
            for a, b in (p for p in pairs if p[0].crc == first.crc):
                put(data, a, values[0], fix)
                put(data, b, values[1], fix)
        if fix and draw(st.booleans()):  # else the checksum (if any) catches the damage
            for lo, hi, at in fix:
                if at + 4 <= len(data):
                    struct.pack_into("<I", data, at, crc32c(bytes(data[lo:hi])))
    return rel, bytes(data)


def changed_bytes(old: bytes, new: bytes) -> np.ndarray:
    """Which byte positions differ between two versions of a file; past the shorter one, all of them."""
    m = min(len(old), len(new))
    changed = np.ones(max(len(old), len(new)), bool)
    changed[:m] = np.frombuffer(old, np.uint8, m) != np.frombuffer(new, np.uint8, m)
    return changed


def reached(e: Expect, ranges: list[tuple[int, int]], rel: str, changed: np.ndarray, old: int, new: int) -> bool:
    """Whether damage to shard rel can have reached what e depends on."""
    if e.shard != rel:
        return False
    if (e.exact_len and new != old) or new < e.min_len:
        return True
    return any(changed[lo:hi].any() for lo, hi in ranges)


def expected(e: Expect) -> bytes | Failed:
    return ENOENT if e.value is None else e.value


def check_damaged_shard(base: Base, rel: str, new: bytes, walk_first: bool, live: bool) -> None:
    """Damage one shard, then read every expectation and walk the whole tree. Expectations the damage
    cannot have reached must hold exactly; everything else may be any bytes, ENOENT or EIO. live: the
    source was opened and read before the damage, as a mount whose dataset is rewritten in place is."""
    old = base.shards[rel]
    source = None
    try:
        if live:
            source = open_source(base.root, CACHE_BYTES)
            walk(source.tree)
        (base.root / rel).write_bytes(new)
        source = source or open_source(base.root, CACHE_BYTES)
        changed = changed_bytes(old, new)
        listed = walk(source.tree) if walk_first else {}
        for e in base.expects:
            got = read_file(source.tree, e.path)
            if reached(e, e.ranges, rel, changed, len(old), len(new)):
                event(f"reached chunk: {'EIO' if got == EIO else 'ENOENT' if got == ENOENT else 'bytes'}")
            else:
                assert got == expected(e), f"{e.path}: damage elsewhere in {rel} changed its answer to {got!r:.80}"
            assert got != IS_DIR, f"{e.path}: a directory"
        listed = listed or walk(source.tree)
        for e in base.expects:
            if not reached(e, e.listing, rel, changed, len(old), len(new)):
                assert (e.path in listed) == (e.value is not None), f"{e.path}: listing changed by damage elsewhere"
        assert_memory_bounded()
    finally:
        (base.root / rel).write_bytes(old)
        if source is not None:
            source.tree.store.forget()


@pytest.mark.parametrize("name", ["volume", "kv", "zarr"])
@settings(FUZZ, max_examples=700)
@given(data=st.data())
def test_damaged_shards(bases: Bases, name: str, data: st.DataObject) -> None:
    base = bases[name]
    rel, new = data.draw(damaged_shard(base), label="damaged shard")
    walk_first, live = data.draw(st.booleans(), label="walk first"), data.draw(st.booleans(), label="live")
    check_damaged_shard(base, rel, new, walk_first, live)


@pytest.mark.parametrize("view", ["n5", "zarr2"])
@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_damaged_shards_in_other_views(bases: Bases, view: str, data: st.DataObject) -> None:
    """The other views decode chunks to re-encode them: corrupt shards must still give only bytes, ENOENT or
    EIO there. (Their bytes are not the stored ones, so only the outcomes are checked.)"""
    base = bases[data.draw(st.sampled_from(["volume", "zarr"]), label="base")]
    rel, new = data.draw(damaged_shard(base), label="damaged shard")
    (base.root / rel).write_bytes(new)
    source = None
    try:
        source = attempt("open", lambda: open_source(base.root, CACHE_BYTES, view))
        assert not isinstance(source, Failed), f"open gave {source}"
        walk(source.tree)
        assert_memory_bounded()
    finally:
        base.restore()
        if source is not None and not isinstance(source, Failed):
            source.tree.store.forget()


# ---------------------------------------------------------------------------------------------------------------------
# Damage to metadata

NUMBERS = [-(2**64), -(2**63) - 1, -1, 0, 1, 2, 3, 7, 8, 31, 32, 63, 64, 65, 2**31, 2**32, 2**53 + 1, 2**63, 2**64,
           10**30, 1e308, -0.0, 0.5]  # fmt: skip
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.sampled_from(NUMBERS), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.sampled_from(["", "raw", "gzip", "identity", "sharding_indexed", "neuroglancer_uint64_sharded_v1", "..",
                     "/etc", "c", "start", "end", "regular", "array", "group", "uint64", "bytes", "crc32c"]),
)  # fmt: skip
JSON_VALUE = st.recursive(
    JSON_LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)  # fmt: skip
DEEP = "\x00deep\x00"  # stands for a nesting too deep for json.dumps, spliced into the text afterwards


def places(obj: Any, at: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON document, the root included."""
    yield at
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from places(v, (*at, k))


@st.composite
def damaged_json(draw: st.DrawFn, text: bytes) -> bytes:
    """A metadata file with one to three edits: a value replaced (by crafted numbers, other types, a deep
    nesting), a value scaled, a member or element deleted or duplicated; or the text itself cut or flipped."""
    if draw(st.integers(0, 9)) == 0:
        raw = bytearray(text)
        if draw(st.booleans()):
            del raw[draw(st.integers(0, len(raw) - 1)) :]
        else:
            raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
        return bytes(raw)
    doc = json.loads(text)
    depth = 0
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(list(places(doc))))
        old: Any = doc
        for k in at:
            old = old[k]
        action = draw(st.sampled_from(["value", "number", "scale", "deep", "delete", "duplicate"]))
        if action == "value":
            new = draw(JSON_VALUE)
        elif action == "number":
            number = draw(st.sampled_from(NUMBERS))
            new = [number] * len(old) if isinstance(old, list) else number
        elif action == "scale" and isinstance(old, int | float) and not isinstance(old, bool):
            new = old * draw(st.sampled_from([-1, 2, 1 << 10, 1 << 31, 1 << 62])) + draw(st.integers(-1, 1))
        elif action == "deep":
            new, depth = DEEP, draw(st.sampled_from([20, 100_000]))  # deterministic: far from the recursion limit
        elif action == "delete" and at:
            parent: Any = doc
            for k in at[:-1]:
                parent = parent[k]
            del parent[at[-1]]
            continue
        elif action == "duplicate" and isinstance(old, list):
            new = old * draw(st.sampled_from([2, 64]))
        else:
            continue
        if not at:
            doc = new
            continue
        parent = doc
        for k in at[:-1]:
            parent = parent[k]
        parent[at[-1]] = new
    out = json.dumps(doc)
    return out.replace(json.dumps(DEEP), "[" * depth + "1" + "]" * depth).encode()


@pytest.mark.parametrize("name", ["volume", "kv", "zarr"])
@settings(FUZZ, max_examples=500)
@given(data=st.data())
def test_damaged_metadata(bases: Bases, name: str, data: st.DataObject) -> None:
    """A damaged `info` or `zarr.json` is refused in one line naming the file, or served: then every
    lookup, listing and read ends in bytes, ENOENT or EIO, promptly and in bounded memory."""
    base = bases[name]
    rel = data.draw(st.sampled_from(sorted(base.metadata)), label="metadata file")
    text = data.draw(damaged_json(base.metadata[rel]), label="damaged text")
    view = data.draw(st.sampled_from(["native", "native", "n5", "zarr2"]), label="view")
    (base.root / rel).write_bytes(text)
    source = None
    try:
        source = open_or_refuse(base.root, view, base.root / rel)
        if source is None:
            return
        walk(source.tree)
        for e in base.expects:
            read_file(source.tree, e.path)
        assert_memory_bounded()
    finally:
        base.restore()
        if source is not None:
            source.tree.store.forget()


# ---------------------------------------------------------------------------------------------------------------------
# Hostile names

HOSTILE_NAMES = [
    "1" * 30, str(2**64), str(2**64 + 5), "9" * 255, "-1", "-0", "01", "00", "+1", " 1", "1 ", "1e3", "0x10", "1_",
    "\uff11", "\u0663", "x" * 255, "..", "", "0-16_0-16_0-9", "00-16_0-16_0-8", "-16-0_0-16_0-8", "0-16_0-16_0-8_",
    f"{16 * 2**64}-{16 * 2**64 + 16}_0-16_0-8", f"0-16_0-16_{8 * 2**70}-{8 * 2**70 + 8}", "0_0_" + "9" * 200,
    f"{2**64}.index", "1.index.index", "c", "c.0.0", "0.0", "99999999999999999999999999.0",
]  # fmt: skip
HOSTILE_TAILS = [  # below a directory: more components, empty ones, chunk coordinates out of any grid
    "/0", "//0", "/", "/../info", "/..", f"/{2**64}", "/-1", "/01", f"/{2**64}/0", "/0/0/0/0/0/0", "/" + "9" * 255,
]  # fmt: skip


@pytest.mark.parametrize("view", ["native", "n5", "zarr2"])
def test_hostile_names_are_enoent(bases: Bases, other_kinds: list[Path], view: str) -> None:
    """In every directory of every view: names no dataset can hold (over 64 bits, negative, not canonical,
    255 characters, '..', empty components) are ENOENT, never another error."""
    for root in [*(b.root for b in bases.values()), *other_kinds]:
        source = open_or_refuse(root, view)
        if source is None:  # a view with nothing to show for this source (a bare key-value directory)
            continue
        dirs: set[str] = set()
        files = walk(source.tree, dirs)
        assert files, f"{root.name} ({view}) lists nothing"
        for directory in sorted(dirs):
            prefix = f"{directory}/" if directory else ""
            paths = [prefix + name for name in HOSTILE_NAMES if name or directory]
            # (grid coordinates such as 0/0 are no hostile names: the n5 view shows such a directory even empty)
            paths += [prefix + name + tail for name in ("99999", "c", "info") for tail in HOSTILE_TAILS]
            paths += [f"{directory}/" if directory else "/", f"/{directory}"]
            for path in paths:
                if path in files or path.strip("/") in dirs:  # names that exist (`c/` for `c`: asked for oddly)
                    continue
                got = attempt(f"lookup {path!r}", lambda path=path, tree=source.tree: tree.lookup(path))
                assert got == ENOENT, f"{root.name} ({view}): {path!r} gave {got!r:.80}, not ENOENT"


@pytest.fixture(scope="module")
def other_kinds(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Annotations (tensorstore) and multi-resolution meshes (cloud-volume): more namings for hostile names."""
    where = tmp_path_factory.mktemp("kinds")
    write_tensorstore_annotations(where / "annotations")
    write_cloudvolume_multires_meshes(where / "meshes")
    return [where / "annotations", where / "meshes"]


# ---------------------------------------------------------------------------------------------------------------------
# Minimal reproducers of what the fuzzers found: one per distinct failure, each standalone


def copy_of(base: Base, tmp_path: Path) -> Path:
    root = tmp_path / base.name
    shutil.copytree(base.root, root)
    return root


@pytest.mark.parametrize("metadata", ["info", "zarr.json", "child zarr.json"])
def test_deeply_nested_metadata_is_refused_or_skipped(tmp_path: Path, metadata: str) -> None:
    """JSON nested deeper than Python's recursion limit is still just invalid metadata: a root file refuses
    the source in one line, a child array is served as stored. Found by test_damaged_metadata."""
    deep = "[" * 100_000 + "]" * 100_000
    root = tmp_path / "src"
    root.mkdir()
    if metadata == "info":
        (root / "info").write_text(deep)
    else:
        (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
        (root / "child").mkdir()
        (root / ("child/zarr.json" if metadata == "child zarr.json" else "zarr.json")).write_text(deep)
    try:
        source = open_source(root, CACHE_BYTES)
    except SourceError as e:
        assert metadata != "child zarr.json", f"a bad child array refused the whole source: {e}"
        assert "\n" not in str(e) and str(root) in str(e)
        return
    assert metadata == "child zarr.json", "deeply nested root metadata was accepted"
    assert dict(source.tree.listdir("")) == {"zarr.json": False, "child": True}


def test_zarr2_view_of_a_volume_with_a_short_resolution(bases: Bases, tmp_path: Path) -> None:
    """A scale whose `resolution` has two numbers: refused in one line, or served without it; never a
    ValueError from zip(strict=True) in views/zarr2.py. Found by test_damaged_metadata."""
    root = copy_of(bases["volume"], tmp_path)
    info = json.loads((root / "info").read_text())
    info["scales"][0]["resolution"] = [4, 4]
    (root / "info").write_text(json.dumps(info))
    source = open_or_refuse(root, "zarr2")
    if source is not None:
        walk(source.tree)


def test_shard_shrunk_under_a_live_source_never_reads_short(bases: Bases, tmp_path: Path) -> None:
    """A raw chunk looked up, then its shard truncated in place (a dataset rewritten under a mount): the read
    must give the size() bytes it promised, or EIO; it gives b''. Found by test_damaged_shards (live)."""
    base = bases["kv"]
    root = copy_of(base, tmp_path)
    e = next(e for e in base.expects if e.value)
    tree = open_source(root, CACHE_BYTES).tree
    node = tree.lookup(e.path)
    assert node.size() == len(e.value)
    with open(root / e.shard, "r+b") as f:
        f.truncate(e.min_len)  # the shard index alone remains
    got = attempt("read", lambda: node.read(0, node.size()))
    assert got in (e.value, EIO), f"read {len(got) if isinstance(got, bytes) else got} of {len(e.value)} bytes"


def test_listing_a_shard_shrunk_under_a_live_source(bases: Bases, tmp_path: Path) -> None:
    """A shard truncated in place to less than its shard index, after the source was opened and listed:
    listing gives EIO or skips it, never a ValueError from numpy (`buffer size must be a multiple of
    element size`, in ShardedKV.minishards). Found by test_damaged_shards (live)."""
    base = bases["kv"]
    root = copy_of(base, tmp_path)
    tree = open_source(root, CACHE_BYTES).tree
    walk(tree)
    with open(root / "0.shard", "r+b") as f:
        f.truncate(61)  # the index is 64 bytes; 61 is no multiple of 8
    tree.cache.clear()  # even with the caches dropped, the shard's size is the one seen at open
    got = attempt("listdir", lambda: list(tree.listdir("")))
    assert got == EIO or isinstance(got, list)


def nested_alias_array(root: Path, fanout: int, levels: int) -> None:
    """A 1-d uint8 zarr array of `fanout` elements in one shard of `levels` nested sharding levels, each index
    holding `fanout` entries that all point at the same inner blob: a few hundred bytes whose indexes
    describe fanout**levels chunks, all but `fanout` of them past the end of the array."""
    codecs: list = [{"name": "bytes"}]
    for level in range(levels):
        sharding = {"chunk_shape": [fanout**level], "codecs": codecs, "index_location": "end"}
        codecs = [{"name": "sharding_indexed", "configuration": sharding}]
    meta = {
        "zarr_format": 3, "node_type": "array", "shape": [fanout], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [fanout**levels]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0, "codecs": codecs,
    }  # fmt: skip
    blob = b"\x07"
    for _ in range(levels):
        table = struct.pack("<QQ", 0, len(blob)) * fanout
        blob += table + struct.pack("<I", crc32c(table))
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps(meta))
    (root / "c").mkdir()
    (root / "c" / "0").write_bytes(blob)


def test_nested_shards_aliasing_one_blob_list_promptly(tmp_path: Path) -> None:
    """Nested zarr shards whose entries all point at the same inner blob: reading a chunk is prompt, and so
    must listing be, not a walk of all 16**6 index entries: the array's 16 chunks, EIO, or nothing (the
    shard skipped as corrupt, since inner shards may not share bytes). Found by hand from the issue's
    report: the fuzzed datasets nest two levels of four entries, too few to hang."""
    root = tmp_path / "alias"
    nested_alias_array(root, fanout=16, levels=6)
    tree = open_source(root, CACHE_BYTES).tree
    assert read_file(tree, "c/5") == b"\x07"
    listed = attempt("listdir c", lambda: sorted(name for name, _ in tree.listdir("c")))
    assert listed in (EIO, [], sorted(map(str, range(16))))


BOMB_SCRIPT = """
import resource, sys
from shardfs.errors import CorruptChunk
from shardfs.source import Source, open_source
tree = open_source(sys.argv[1], 4 << 20).tree
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    node = tree.lookup("s/0-4096_0-4096_0-4096")
    outcome = f"{node.size()} bytes"
except CorruptChunk:
    outcome = "EIO"
print(outcome, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_gzip_bomb_in_a_scale_of_huge_chunks_stays_small(tmp_path: Path) -> None:
    """A volume scale whose `chunk_sizes` claim 4096^3 voxels lets a gzip chunk decode to 2 x 64 GiB; a
    512 MiB bomb must still cost far less than that in memory (here: < 300 MB of peak RSS, with a 4 MiB
    cache), or be EIO. Run in a child process, so its peak RSS is its own."""

    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    parts = [bomb.compress(bytes(1 << 20)) for _ in range(512)]
    root = kv_dataset(tmp_path / "vol" / "s", {0: b"".join(parts) + bomb.flush()}, encoding="gzip").parent
    (root / "s" / "info").rename(tmp_path / "unused")
    spec = json.loads((tmp_path / "unused").read_text())["sharding"]
    scale = {"key": "s", "size": [4096] * 3, "chunk_sizes": [[4096] * 3], "resolution": [1, 1, 1],
             "encoding": "raw", "sharding": spec}  # fmt: skip
    info = {"@type": "neuroglancer_multiscale_volume", "data_type": "uint8", "num_channels": 1, "scales": [scale]}
    (root / "info").write_text(json.dumps(info))
    done = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, str(root)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2])  # fmt: skip
    assert done.returncode == 0, done.stderr
    outcome, growth = done.stdout.rsplit(" ", 1)
    assert int(growth) < RSS_GROWTH_BYTES, f"{outcome}: peak RSS grew by {int(growth) >> 20} MiB"


@pytest.mark.parametrize(
    "edit",
    [{"encoding": ["raw"]}, {"chunk_sizes": [[2**32, 16, 8]], "size": [2**32, 48, 16]}],
    ids=["encoding is a list", "chunk of 2^32 voxels"],
)
def test_n5_view_of_odd_scale_metadata(bases: Bases, tmp_path: Path, edit: dict[str, object]) -> None:
    """Scale metadata of the wrong type or beyond uint32: the n5 view refuses the source in one line or
    gives EIO for its blocks, never a TypeError (`unhashable type: 'list'` in decode_precomputed) or a
    struct.error (packing the block header in views/n5.py). Found by test_damaged_metadata."""
    root = copy_of(bases["volume"], tmp_path)
    info = json.loads((root / "info").read_text())
    info["scales"][0].update(edit)
    (root / "info").write_text(json.dumps(info))
    source = open_or_refuse(root, "n5", root / "info")
    if source is not None:
        walk(source.tree)


@pytest.mark.parametrize("view", ["n5", "zarr2"])
@pytest.mark.parametrize("metadata", ["zarr.json", "end/zarr.json"], ids=["group", "array"])
def test_views_of_zarr_attributes_that_are_no_object(bases: Bases, tmp_path: Path, view: str, metadata: str) -> None:
    """`attributes` that are a number, not an object: refused in one line or served, never what the views do
    now: TypeError in views/n5.py (`'int' object is not a mapping` for an array, `... is not iterable` for a
    group), AttributeError in views/zarr2.py (`'int' object has no attribute 'get'`). Found by
    test_damaged_metadata."""
    root = copy_of(bases["zarr"], tmp_path)
    meta = json.loads((root / metadata).read_text())
    meta["attributes"] = 5
    (root / metadata).write_text(json.dumps(meta))
    source = open_or_refuse(root, view)
    if source is not None:
        walk(source.tree)


@pytest.mark.parametrize("edit", [{"@type": ["neuroglancer_multiscale_volume"]}, {"data_type": ["uint8"]}],
                         ids=["@type is a list", "data_type is a list"])  # fmt: skip
def test_info_fields_of_the_wrong_type_refuse_in_one_line(bases: Bases, tmp_path: Path, edit: dict) -> None:
    """A list where `info` has a string: a SourceError naming the file, never TypeError (`unhashable type:
    'list'`, from dict and set lookups in formats/precomputed.py add_info and _volume). Found by
    test_damaged_metadata."""
    root = copy_of(bases["volume"], tmp_path)
    info = json.loads((root / "info").read_text())
    (root / "info").write_text(json.dumps({**info, **edit}))
    assert open_or_refuse(root, "native", root / "info") is None


def test_zarr_shard_shape_past_int64_lists_or_refuses(bases: Bases, tmp_path: Path) -> None:
    """A shard (chunk_grid) shape of 2^64 along one axis, which the inner chunks still divide: refused,
    served as stored, or listed; never numpy's UFuncTypeError (`Cannot cast ufunc 'multiply' input 1 from
    dtype('O')`, in formats/zarr.py ZarrArray.stored). Found by test_damaged_metadata."""
    root = copy_of(bases["zarr"], tmp_path)
    meta = json.loads((root / "end" / "zarr.json").read_text())
    meta["chunk_grid"]["configuration"]["chunk_shape"][0] = 2**64
    (root / "end" / "zarr.json").write_text(json.dumps(meta))
    source = open_or_refuse(root, "native")
    if source is not None:
        walk(source.tree)


def test_memory_stayed_bounded_over_the_module(bases: Bases) -> None:
    """Last in the file: the peak RSS of everything above (in this process) stayed within the bound."""
    assert _BASELINE_RSS, "the bases fixture sets the baseline"
    assert_memory_bounded()
