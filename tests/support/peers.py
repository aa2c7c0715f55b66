"""Small real sharded datasets written by the peer libraries (tensorstore, cloud-volume).

shardfs must show exactly what the unsharded form of a dataset holds. These writers make the
sharded bytes with the peers' own code paths (never with shardfs code) and return the expected
unsharded content, so tests compare shardfs against an independent implementation.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import pathlib
import struct
from pathlib import Path
from typing import Any

import mmh3
import numpy as np
import tensorstore as ts
import zarr
from cloudvolume.datasource.precomputed.sharding import ShardingSpecification, synthesize_shard_files
from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ShardingCodec, ZstdCodec

SHARD_TYPE = "neuroglancer_uint64_sharded_v1"


def sharding_spec(**overrides: Any) -> dict[str, Any]:
    """A valid `neuroglancer_uint64_sharded_v1` spec; defaults give 4 shards of 4 minishards."""
    spec = {
        "@type": SHARD_TYPE,
        "preshift_bits": 1,
        "hash": "murmurhash3_x86_128",
        "minishard_bits": 2,
        "shard_bits": 2,
        "minishard_index_encoding": "gzip",
        "data_encoding": "gzip",
    }
    spec.update(overrides)
    return spec


def compressed_morton_code(pos: tuple[int, ...], grid: tuple[int, ...]) -> int:
    """Neuroglancer's compressed Morton code: bit i of each dim, LSB first, skipping spent dims."""
    bits = [max(g - 1, 0).bit_length() for g in grid]
    code, j = 0, 0
    for i in range(max(bits, default=0)):
        for d, nbits in enumerate(bits):
            if i < nbits:
                code |= ((pos[d] >> i) & 1) << j
                j += 1
    return code


def _write_json(path: pathlib.Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))


def _ts_sharded_put(directory: pathlib.Path, spec: dict, items: dict[int, bytes]) -> None:
    """Write uint64 keys through tensorstore's sharded kvstore (keys: 8-byte big-endian)."""
    directory.mkdir(parents=True, exist_ok=True)
    kv = ts.KvStore.open(
        {
            "driver": "neuroglancer_uint64_sharded",
            "base": {"driver": "file", "path": f"{directory}/"},
            "metadata": spec,
        }
    ).result()
    txn = ts.Transaction()  # one commit: each shard is written once
    for key, value in items.items():
        kv.with_transaction(txn).write(key.to_bytes(8, "big"), value)
    txn.commit_async().result()


def _random_volume(shape: tuple[int, ...], dtype: str, encoding: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if encoding == "compressed_segmentation":
        labels = rng.integers(0, 12, size=shape).astype(dt)
        return np.where(labels > 0, labels + dt.type(2**40 if dt.itemsize == 8 else 1000), labels)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if encoding == "jpeg":  # smooth, so the lossy round trip stays close to the input
        x, y, z, c = np.meshgrid(*map(np.arange, shape), indexing="ij")
        wave = 128 + 60 * np.sin(x / 7 + c) + 40 * np.cos(y / 5) + 2 * z
        return (wave + rng.integers(-3, 4, size=shape)).clip(0, 255).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)


def write_tensorstore_volume(
    root: pathlib.Path,
    *,
    dtype: str = "uint8",
    encoding: str = "raw",
    data_encoding: str = "gzip",
    voxel_offset: tuple[int, int, int] = (-5, 3, 7),
    size: tuple[int, int, int] = (70, 50, 33),
    chunk: tuple[int, int, int] = (16, 16, 8),
    num_channels: int = 1,
    extra_unsharded_scale: bool = True,
    sparse: bool = False,
    unsharded_twin: pathlib.Path | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Multiscale volume, scale 0 (key `4_4_40`) sharded, optional scale 1 (`8_8_40`, 2x in x/y)
    unsharded. `sparse` writes only the chunks in the lower half of x (the rest are absent).

    `unsharded_twin`, if given, receives the same data written by tensorstore WITHOUT sharding:
    byte-for-byte the tree shardfs should present (apart from `info` formatting and `sharding`).
    Returns scale 0 as tensorstore reads it back from `root`, shape (x, y, z, c).
    """
    scale: dict[str, Any] = {
        "size": list(size),
        "voxel_offset": list(voxel_offset),
        "chunk_size": list(chunk),
        "resolution": [4, 4, 40],
        "encoding": encoding,
    }
    if encoding == "compressed_segmentation":
        scale["compressed_segmentation_block_size"] = [8, 8, 4]
    multiscale = {
        "type": "segmentation" if encoding == "compressed_segmentation" else "image",
        "data_type": dtype,
        "num_channels": num_channels,
    }
    data = _random_volume((*size, num_channels), dtype, encoding, seed)
    nx = max(1, math.ceil(size[0] / chunk[0]) // 2) * chunk[0] if sparse else size[0]
    nx = min(nx, size[0])
    method = "mode" if multiscale["type"] == "segmentation" else "mean"

    targets = [(root, sharding_spec(data_encoding=data_encoding))]
    if unsharded_twin is not None:
        targets.append((unsharded_twin, None))
    for path, sharding in targets:
        kv = {"driver": "file", "path": str(path)}
        s0 = dict(scale, sharding=sharding) if sharding else scale
        base = ts.open(
            {
                "driver": "neuroglancer_precomputed",
                "kvstore": kv,
                "multiscale_metadata": multiscale,
                "scale_metadata": s0,
                "create": True,
            }
        ).result()
        x0 = voxel_offset[0]
        base[ts.d["x"][x0 : x0 + nx]].write(data[:nx]).result()
        if extra_unsharded_scale:
            # Downsample what tensorstore reads back, so the twin sees identical input.
            down = ts.downsample(base, [2, 2, 1, 1], method=method)
            low = ts.open(
                {
                    "driver": "neuroglancer_precomputed",
                    "kvstore": kv,
                    "scale_metadata": dict(
                        scale,
                        resolution=[8, 8, 40],
                        size=list(down.shape[:3]),
                        voxel_offset=list(down.origin[:3]),
                    ),
                    "open": True,
                    "create": True,
                }
            ).result()
            low.write(down).result()
    src = {"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(root)}}
    return ts.open(dict(src, scale_index=0)).result().read().result()


def write_tensorstore_chunk_grid(root: pathlib.Path, grid: tuple[int, int, int]) -> list[str]:
    """A volume of one-voxel uint8 chunks, every position of a power-of-two grid stored (scale `s0`): the
    most chunk names for the fewest bytes. tensorstore writes the info and, through its sharded kvstore in
    one transaction, the chunks (its volume driver takes minutes for as many); each chunk's voxel is the
    low byte of its key, the compressed Morton code. Returns the unsharded chunk names."""
    spec = sharding_spec(preshift_bits=0, minishard_bits=6, shard_bits=2, data_encoding="raw")
    scale = {"key": "s0", "size": list(grid), "chunk_size": [1, 1, 1], "resolution": [1, 1, 1], "sharding": spec}
    ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": str(root)},
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": dict(scale, encoding="raw"),
            "create": True,
        }
    ).result()
    _ts_sharded_put(root / "s0", spec, {key: bytes([key & 0xFF]) for key in range(math.prod(grid))})
    return [f"{x}-{x + 1}_{y}-{y + 1}_{z}-{z + 1}" for x, y, z in itertools.product(*map(range, grid))]


def write_tensorstore_scale(
    root: pathlib.Path, side: int, chunk: int, sharding: dict, *, seed: int = 0, dtype: str = "uint8"
) -> np.ndarray:
    """A volume side³ in chunk³ chunks (scale `s0`, `encoding: raw`, voxels 0-15 so that gzip has
    something to do), written by tensorstore's precomputed driver in one transaction (each shard written
    once). Returns the voxels, (x, y, z, c)."""
    scale = {"key": "s0", "size": [side] * 3, "chunk_size": [chunk] * 3, "resolution": [1, 1, 1]}
    volume = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": str(root)},
            "multiscale_metadata": {"type": "image", "data_type": dtype, "num_channels": 1},
            "scale_metadata": dict(scale, encoding="raw", sharding=sharding),
            "create": True,
        }
    ).result()
    data = np.random.default_rng(seed).integers(0, 16, size=(side, side, side, 1), dtype=dtype)
    with ts.Transaction() as txn:
        volume.with_transaction(txn)[...].write(data).result()
    return data


def write_tensorstore_kv(
    root: pathlib.Path, items: dict[int, bytes], *, sharding: dict | None = None
) -> dict[int, bytes]:
    """Shards written by tensorstore's `neuroglancer_uint64_sharded` kvstore, plus an `info` of
    just `{"sharding": spec}`; unsharded names are the decimal keys."""
    spec = sharding if sharding is not None else sharding_spec()
    _ts_sharded_put(root, spec, items)
    _write_json(root / "info", {"sharding": spec})
    return dict(items)


def create_tensorstore_zarr3(
    root: pathlib.Path, shape: list[int], data_type: str, shard: list[int], inner: list[int], **sharding: Any
) -> ts.TensorStore:
    """A new zarr v3 array in root, sharded by tensorstore's `sharding_indexed` codec (shards of `shard`,
    inner chunks of `inner`; `sharding`: the codec's other configuration, e.g. inner `codecs`)."""
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(root)},
        "metadata": {
            "shape": shape,
            "data_type": data_type,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
            "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": inner, **sharding}}],
        },
        "create": True,
    }
    return ts.open(spec).result()


# ---------------------------------------------------------------------------------------------
# 3. Annotations (encoded here per the neuroglancer spec, sharded by tensorstore)

ANNOTATION_LOWER = (0.0, 0.0, 0.0)
ANNOTATION_UPPER = (100.0, 60.0, 40.0)
ANNOTATION_GRID = (4, 3, 2)


def _encode_point(point: np.ndarray, score: float, kind: int) -> bytes:
    """POINT geometry (3 x float32) + properties in info order (float32, uint8) + pad to 4."""
    return struct.pack("<3ffB3x", *map(float, point), score, kind)


def write_tensorstore_annotations(root: pathlib.Path, *, seed: int = 0) -> dict[str, bytes]:
    """Point annotations whose `by_id` (murmur, 5 shard bits -> 2-digit names), relationship
    `segment` (key `segments`, single `0.shard`) and `spatial0` (identity hash) are all sharded.
    Returns unsharded relative path -> bytes: `by_id/<id>`, `segments/<segid>`,
    `spatial0/<x>_<y>_<z>`."""
    rng = np.random.default_rng(seed)
    n = 40
    lower, upper = np.array(ANNOTATION_LOWER), np.array(ANNOTATION_UPPER)
    points = (lower + rng.random((n, 3)) * (upper - lower)).astype(np.float32)
    ids = [1000 + 37 * i for i in range(n - 1)] + [2**40 + 3]
    scores = rng.random(n).astype(np.float32)
    kinds = rng.integers(0, 5, n)
    pool = [5, 77, 123, 2**33 + 1]
    segs = [sorted(set(rng.choice(pool, rng.integers(1, 3)).tolist())) for _ in range(n)]
    enc = [_encode_point(points[i], float(scores[i]), int(kinds[i])) for i in range(n)]

    def multiple(idx: list[int]) -> bytes:
        return (
            struct.pack("<Q", len(idx))
            + b"".join(enc[i] for i in idx)
            + b"".join(struct.pack("<Q", ids[i]) for i in idx)
        )

    by_id = {ids[i]: enc[i] + struct.pack(f"<I{len(segs[i])}Q", len(segs[i]), *segs[i]) for i in range(n)}
    by_seg = {s: multiple([i for i in range(n) if s in segs[i]]) for s in pool}
    chunk = (upper - lower) / np.array(ANNOTATION_GRID)
    cell_of = [
        tuple(int(min(c, g - 1)) for c, g in zip((points[i] - lower) // chunk, ANNOTATION_GRID, strict=True))
        for i in range(n)
    ]
    cells = {c: [i for i in range(n) if cell_of[i] == c] for c in sorted(set(cell_of))}
    by_cell = {c: multiple(idx) for c, idx in cells.items()}

    specs = {
        "by_id": sharding_spec(preshift_bits=0, minishard_bits=1, shard_bits=5, data_encoding="raw"),
        "segments": sharding_spec(preshift_bits=0, minishard_bits=2, shard_bits=0),
        "spatial0": sharding_spec(hash="identity", minishard_bits=1, shard_bits=1),
    }
    _ts_sharded_put(root / "by_id", specs["by_id"], by_id)
    _ts_sharded_put(root / "segments", specs["segments"], by_seg)
    _ts_sharded_put(
        root / "spatial0",
        specs["spatial0"],
        {compressed_morton_code(c, ANNOTATION_GRID): v for c, v in by_cell.items()},
    )
    _write_json(
        root / "info",
        {
            "@type": "neuroglancer_annotations_v1",
            "dimensions": {"x": [4e-9, "m"], "y": [4e-9, "m"], "z": [4e-8, "m"]},
            "lower_bound": list(ANNOTATION_LOWER),
            "upper_bound": list(ANNOTATION_UPPER),
            "annotation_type": "POINT",
            "properties": [{"id": "score", "type": "float32"}, {"id": "kind", "type": "uint8"}],
            "relationships": [{"id": "segment", "key": "segments", "sharding": specs["segments"]}],
            "by_id": {"key": "by_id", "sharding": specs["by_id"]},
            "spatial": [
                {
                    "key": "spatial0",
                    "grid_shape": list(ANNOTATION_GRID),
                    "chunk_size": chunk.tolist(),
                    "limit": max(len(v) for v in cells.values()),
                    "sharding": specs["spatial0"],
                }
            ],
        },
    )
    return (
        {f"by_id/{k}": v for k, v in by_id.items()}
        | {f"segments/{k}": v for k, v in by_seg.items()}
        | {f"spatial0/{x}_{y}_{z}": v for (x, y, z), v in by_cell.items()}
    )


# ---------------------------------------------------------------------------------------------
# 4-5. Skeletons and multi-resolution meshes (cloud-volume's shard writer)


def _segmentation(**overrides: Any) -> dict:
    """A uint64 segmentation volume's `info`, made by cloud-volume."""
    from cloudvolume import CloudVolume

    return CloudVolume.create_new_info(
        **{
            "num_channels": 1,
            "layer_type": "segmentation",
            "data_type": "uint64",
            "encoding": "raw",
            "resolution": [4, 4, 40],
            "voxel_offset": [0, 0, 0],
            "chunk_size": [64, 64, 16],
            "volume_size": [512, 512, 64],
            **overrides,
        }
    )


def _segmentation_info(root: pathlib.Path, **extra: str) -> None:
    """Root `info` of a (chunkless) segmentation volume so CloudVolume can open the dataset."""
    _write_json(root / "info", {**_segmentation(), **extra})


def write_cloudvolume_compresso(root: pathlib.Path, *, seed: int = 0) -> np.ndarray:
    """An unsharded compresso segmentation written by cloud-volume; returns its labels, (x, y, z)."""
    from cloudvolume import CloudVolume

    info = _segmentation(encoding="compresso", chunk_size=[16, 16, 8], volume_size=[40, 30, 20])
    vol = CloudVolume(f"file://{root}", info=info, progress=False)
    vol.commit_info()
    labels = np.random.default_rng(seed).integers(0, 6, size=(40, 30, 20)).astype(np.uint64) * (2**33 + 1)
    vol[:, :, :] = labels
    return labels


def _write_shards(directory: pathlib.Path, shard_files: dict[str, bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, blob in shard_files.items():
        (directory / name).write_bytes(blob)


SKELETON_IDS = (1, 2, 3, 77, 1000, 2**40 + 7)


def write_cloudvolume_skeletons(root: pathlib.Path, *, seed: int = 0) -> dict[int, bytes]:
    """Segmentation dataset with sharded `skeletons/` (gzip data) made by cloud-volume's
    `synthesize_shard_files`. Returns segid -> encoded skeleton (unsharded `skeletons/<segid>`)."""
    from cloudvolume import Skeleton
    from cloudvolume.datasource.precomputed.sharding import (
        ShardingSpecification,
        synthesize_shard_files,
    )

    rng = np.random.default_rng(seed)
    spec = sharding_spec(preshift_bits=0, minishard_bits=1, shard_bits=1)
    encoded = {}
    for segid in SKELETON_IDS:
        nv = int(rng.integers(2, 20))
        skel = Skeleton(
            vertices=(rng.random((nv, 3)) * 1000).astype(np.float32),
            edges=np.stack([np.arange(nv - 1), np.arange(1, nv)], axis=1).astype(np.uint32),
            radii=rng.random(nv).astype(np.float32),
            vertex_types=rng.integers(0, 5, nv).astype(np.uint8),
            segid=segid,
        )
        encoded[segid] = skel.to_precomputed()
    shards = synthesize_shard_files(ShardingSpecification.from_dict(spec), dict(encoded))
    _segmentation_info(root, skeletons="skeletons")
    _write_shards(root / "skeletons", shards)
    _write_json(
        root / "skeletons" / "info",
        {
            "@type": "neuroglancer_skeletons",
            "transform": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],
            "vertex_attributes": [
                {"id": "radius", "data_type": "float32", "num_components": 1},
                {"id": "vertex_types", "data_type": "uint8", "num_components": 1},
            ],
            "sharding": spec,
            "spatial_index": None,
        },
    )
    return encoded


MESH_IDS = (7, 42, 99, 2**35 + 11)
MESH_QUANT_BITS = 10
MESH_TRANSFORM = [4, 0, 0, 0, 0, 4, 0, 0, 0, 0, 40, 0]
MESH_CHUNK_SHAPE = (64.0, 64.0, 32.0)
MESH_GRID_ORIGIN = (8.0, 16.0, 0.0)
# Per LOD: fragment positions (Morton order); the last lod-0 fragment is empty (size 0).
MESH_FRAGMENTS = (((0, 0, 0), (1, 0, 0), (0, 1, 0)), ((0, 0, 0),))


def _cube(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """A closed box in stored-model integer coordinates [0, 2**bits)."""
    v = np.array([[x, y, z] for x in (lo, hi) for y in (lo, hi) for z in (lo, hi)], np.float32)
    f = [[0, 1, 3], [0, 3, 2], [4, 6, 7], [4, 7, 5], [0, 4, 5], [0, 5, 1],
         [2, 3, 7], [2, 7, 6], [0, 2, 6], [0, 6, 4], [1, 5, 7], [1, 7, 3]]  # fmt: skip
    return v, np.array(f, np.uint32)


def mesh_fragment_vertices(segid: int, lod: int, frag: int) -> np.ndarray | None:
    """Integer stored-model vertices written for one fragment (None for the empty fragment)."""
    if lod == 0 and frag == 2:
        return None
    lo = 10 * (MESH_IDS.index(segid) + 1) + 100 * frag + 50 * lod
    return _cube(lo, 1023 - lo)[0]


def mesh_expected_vertices(segid: int, lod: int = 0) -> np.ndarray:
    """Physical vertices cloud-volume should return for `mesh.get(segid, lod)` (unordered)."""
    out = []
    quant = 2**MESH_QUANT_BITS - 1
    for frag, pos in enumerate(MESH_FRAGMENTS[lod]):
        v = mesh_fragment_vertices(segid, lod, frag)
        if v is not None:
            model = np.array(MESH_GRID_ORIGIN) + np.array(MESH_CHUNK_SHAPE) * 2**lod * (np.array(pos) + v / quant)
            out.append(model * np.array([MESH_TRANSFORM[0], MESH_TRANSFORM[5], MESH_TRANSFORM[10]]))
    return np.concatenate(out)


def write_cloudvolume_multires_meshes(root: pathlib.Path, *, data_encoding: str = "raw") -> dict[str, bytes]:
    """Sharded `neuroglancer_multilod_draco` mesh dir built the igneous way: each chunk value is
    `fragments + manifest` passed to `synthesize_shard_files` with `data_offset = len(manifest)`,
    so the index points at the manifest and the Draco fragments sit just before it.
    `data_encoding="gzip"` gzips only the manifest (as the spec says); cloud-volume's writer
    would gzip fragments too, so we hand it a raw spec and pre-gzipped manifests.
    Returns `<segid>.index` -> manifest (decoded) and `<segid>` -> concatenated fragments."""
    import DracoPy
    from cloudvolume.datasource.precomputed.mesh.multilod import (
        MultiLevelPrecomputedMeshManifest,
    )
    from cloudvolume.datasource.precomputed.sharding import (
        ShardingSpecification,
        synthesize_shard_files,
    )

    spec = sharding_spec(minishard_bits=1, shard_bits=1, data_encoding=data_encoding)
    values, offsets, expected = {}, {}, {}
    for segid in MESH_IDS:
        frags, sizes = [], []
        for lod, positions in enumerate(MESH_FRAGMENTS):
            for frag in range(len(positions)):
                v = mesh_fragment_vertices(segid, lod, frag)
                blob = b""
                if v is not None:
                    blob = DracoPy.encode(
                        v, _cube(0, 1)[1], quantization_bits=MESH_QUANT_BITS,
                        quantization_range=2**MESH_QUANT_BITS - 1,
                        quantization_origin=(0, 0, 0),
                    )  # fmt: skip
                frags.append(blob)
                sizes.append(len(blob))
        manifest = MultiLevelPrecomputedMeshManifest(
            segment_id=segid,
            chunk_shape=MESH_CHUNK_SHAPE,
            grid_origin=MESH_GRID_ORIGIN,
            num_lods=len(MESH_FRAGMENTS),
            lod_scales=[2.0**i for i in range(len(MESH_FRAGMENTS))],
            vertex_offsets=[[0, 0, 0]] * len(MESH_FRAGMENTS),
            num_fragments_per_lod=[len(p) for p in MESH_FRAGMENTS],
            fragment_positions=[np.array(p) for p in MESH_FRAGMENTS],
            fragment_offsets=sizes,  # to_binary wants the flat list of fragment sizes
        ).to_binary()
        stored = gzip.compress(manifest, mtime=0) if data_encoding == "gzip" else manifest
        values[segid] = b"".join(frags) + stored
        offsets[segid] = len(stored)
        expected[f"{segid}.index"] = manifest
        expected[f"{segid}"] = b"".join(frags)
    writer_spec = ShardingSpecification.from_dict(dict(spec, data_encoding="raw"))
    shards = synthesize_shard_files(writer_spec, values, data_offset=offsets)
    _segmentation_info(root, mesh="mesh")
    _write_shards(root / "mesh", shards)
    _write_json(
        root / "mesh" / "info",
        {
            "@type": "neuroglancer_multilod_draco",
            "vertex_quantization_bits": MESH_QUANT_BITS,
            "transform": MESH_TRANSFORM,
            "lod_scale_multiplier": 1.0,
            "sharding": spec,
        },
    )
    return expected


def volume_chunk_shards(root: pathlib.Path, key: str) -> dict[str, str]:
    """Unsharded chunk name -> the shard file holding it, for a sharded volume scale, by the spec's maths
    written out here (compressed Morton code, murmurhash3_x86_128 of the preshifted key, minishard and
    shard bits): an account of where chunks live that owes nothing to shardfs."""
    info = json.loads((root / "info").read_text())
    scale = next(s for s in info["scales"] if s["key"] == key)
    size, chunk, offset = scale["size"], scale["chunk_sizes"][0], scale.get("voxel_offset", [0, 0, 0])
    spec = scale["sharding"]
    grid = tuple(-(-s // c) for s, c in zip(size, chunk, strict=True))
    digits = max(1, -(-spec["shard_bits"] // 4))
    out = {}
    for pos in itertools.product(*map(range, grid)):
        bounds = zip(pos, chunk, offset, size, strict=True)
        name = "_".join(f"{o + p * c}-{o + min((p + 1) * c, s)}" for p, c, o, s in bounds)
        hashed = compressed_morton_code(pos, grid) >> spec["preshift_bits"]
        if spec["hash"] == "murmurhash3_x86_128":
            hashed = mmh3.hash64(hashed.to_bytes(8, "little"), 0, False, False)[0]
        shard = (hashed >> spec["minishard_bits"]) & ((1 << spec["shard_bits"]) - 1)
        out[name] = f"{shard:0{digits}x}.shard"
    return out


def kv_dataset(root: Path, values: dict[int, bytes], *, minishard_bits: int = 0, encoding: str = "raw") -> Path:
    """A bare sharded key-value directory with one shard and the identity hash (minishard = key's low bits)."""
    root.mkdir(parents=True)
    spec = {
        "@type": "neuroglancer_uint64_sharded_v1",
        "preshift_bits": 0,
        "hash": "identity",
        "minishard_bits": minishard_bits,
        "shard_bits": 0,
        "minishard_index_encoding": "raw",
        "data_encoding": encoding,
    }
    (root / "info").write_text(json.dumps({"sharding": spec}))
    minishards = 1 << minishard_bits
    index, body = [], b""
    for m in range(minishards):
        keys = sorted(k for k in values if k % minishards == m)
        rows, previous_key, previous_end = [[], [], []], 0, 0  # each minishard starts from the shard index's end
        for key in keys:
            rows[0].append(key - previous_key)
            rows[1].append(len(body) - previous_end)
            rows[2].append(len(values[key]))
            body += values[key]
            previous_key, previous_end = key, len(body)
        table = b"".join(struct.pack(f"<{len(r)}Q", *r) for r in rows)
        index.append((len(body), len(body) + len(table)))
        body += table
    (root / "0.shard").write_bytes(b"".join(struct.pack("<QQ", *e) for e in index) + body)
    return root


def write_zarr_python(root: Path) -> dict[str, np.ndarray]:
    """A hierarchy covering the cases zarr-python 3 writes; returns each array's full contents."""
    rng = np.random.default_rng(0)
    g = zarr.open_group(root, mode="w", attributes={"note": "kept"})
    cases = {
        # name: (shape, dtype, create_array keyword arguments)
        "gzip": ((50, 37), "uint16", {"chunks": (4, 5), "shards": (16, 10), "compressors": GzipCodec()}),
        "zstd": ((17, 20, 9), "float32", {"chunks": (4, 5, 3), "shards": (8, 10, 9), "compressors": ZstdCodec()}),
        "blosc": ((33, 40), "int64", {"chunks": (8, 8), "shards": (16, 16), "compressors": BloscCodec()}),
        "raw": ((30, 30), "uint8", {"chunks": (5, 6), "shards": (10, 12), "compressors": None}),
        "whole_shard_zstd": ((40, 30), "int32", {"serializer": ShardingCodec(chunk_shape=(5, 5))}),
        "big_endian": (
            (21, 22),
            ">u2",
            {"chunks": (7, 11), "shards": (14, 22), "serializer": BytesCodec(endian="big"), "compressors": None},
        ),
        "index_start": (
            (24, 24),
            "uint32",
            {"serializer": ShardingCodec(chunk_shape=(4, 4), index_location="start"), "compressors": None},
        ),
        "nested": (
            (40, 45),
            "uint16",
            {
                "serializer": ShardingCodec(
                    chunk_shape=(10, 15), codecs=[ShardingCodec(chunk_shape=(5, 5), codecs=[BytesCodec(), GzipCodec()])]
                ),
            },
        ),
        "v2_keys": (
            (19, 23),
            "int16",
            {"chunks": (4, 4), "shards": (8, 8), "chunk_key_encoding": {"name": "v2", "separator": "."}},
        ),
        "deep/sub/one_d": ((101,), "float64", {"chunks": (10,), "shards": (40,)}),
        "plain_unsharded": ((20, 20), "uint8", {"chunks": (5, 5)}),
    }
    contents = {}
    for name, (shape, dtype, kwargs) in cases.items():
        if "serializer" in kwargs and "chunks" not in kwargs:
            kwargs = {**kwargs, "chunks": tuple(2 * c for c in kwargs["serializer"].chunk_shape)}
        array = g.create_array(name, shape=shape, dtype=dtype, fill_value=0, **kwargs)
        data = (rng.random(shape) * 1000).astype(dtype)
        partial = tuple(slice(0, max(1, s * 2 // 3)) for s in shape)  # the rest stays fill value: never written
        array[partial] = data[partial]
        contents[name] = array[...]
    assert [c["name"] for c in json.loads((root / "whole_shard_zstd" / "zarr.json").read_text())["codecs"]] == [
        "sharding_indexed",
        "zstd",
    ], "zarr-python no longer adds zstd over the whole shard; this case needs another writer"
    return contents


def write_cloudvolume_kv(root: Path, spec: dict, items: dict[int, bytes]) -> None:
    """Shards as cloud-volume (and igneous) write them: chunk data first, then every minishard index, one
    after the other; plus an `info` of just `{"sharding": spec}`."""
    root.mkdir(parents=True)
    for name, blob in synthesize_shard_files(ShardingSpecification.from_dict(spec), items).items():
        (root / name).write_bytes(blob)
    (root / "info").write_text(json.dumps({"sharding": spec}))
