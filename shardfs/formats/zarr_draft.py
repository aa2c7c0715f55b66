"""The 2022 zarr sharding storage transformer draft (zarr-python 2.14-2.18), planned as the unsharded
draft hierarchy: metadata at meta/root/<path>.array.json without `storage_transformers`, shards at
data/root/<path>/c<i>/<j> shown as their inner chunks."""

from __future__ import annotations

import json
import posixpath
from typing import TYPE_CHECKING

from shardfs.errors import SourceError
from shardfs.formats.plan import MALFORMED, Finding, load_json, senseless
from shardfs.formats.zarr_array import ZarrArray
from shardfs.formats.zarr_codecs import itemsize, positive_ints
from shardfs.shards.kv import files_below
from shardfs.shards.zarr import ChunkKeys, IndexLayout, Level
from shardfs.shards.zarr_kv import ZarrKV

if TYPE_CHECKING:
    from shardfs.formats.zarr import ZarrPlan

DRAFT_FORMAT = "https://purl.org/zarr/spec/protocol/core/3.0"


def walk_draft(plan: ZarrPlan) -> None:
    """The 2022 sharding storage transformer draft (zarr-python 2.14-2.18): metadata at
    meta/root/<path>.array.json, shards at data/root/<path>/c<i>/<j>, index at the end, no checksum."""
    plan.what = "zarr v3 draft hierarchy (2022 sharding storage transformer)"
    plan.report.append(Finding(f".: {plan.what}"))
    plan.format = "zarr draft"
    for path in files_below(plan.store, "meta"):
        if path.endswith(".array.json"):
            try:
                _draft_array(plan, path)
            except SourceError as e:
                plan.refuse(e, root=False)
            except MALFORMED as e:
                plan.refuse(senseless(plan.store.where(path), e), False)


def _draft_array(plan: ZarrPlan, path: str) -> None:
    where = plan.store.where(path)
    meta = load_json(plan.store, path)
    if not isinstance(meta, dict):
        raise SourceError(f"{where}: must hold a JSON object")
    name = path[len("meta/root") : -len(".array.json")].strip("/")
    transformers = meta.get("storage_transformers") or []
    if not transformers:
        plan.report.append(Finding(f"{name or '.'}: zarr v3 draft array, unsharded (passes through)"))
        return
    shape, grid = meta.get("shape"), meta.get("chunk_grid") or {}
    inner = grid.get("chunk_shape")
    if len(transformers) != 1 or transformers[0].get("type") != "indexed":
        raise SourceError(f"{where}: field 'storage_transformers' holds something other than one 'indexed'")
    per_shard = (transformers[0].get("configuration") or {}).get("chunks_per_shard")
    ndim = len(shape) if isinstance(shape, list) else -1
    if not (positive_ints(inner, ndim) and positive_ints(per_shard, ndim)) or grid.get("separator", "/") not in "/.":
        raise SourceError(
            f"{where}: fields 'shape', 'chunk_grid' and 'chunks_per_shard' must agree, in positive integers"
        )
    level = Level(
        tuple(i * n for i, n in zip(inner, per_shard, strict=True)),
        tuple(inner),
        IndexLayout(tuple(per_shard), checksum=False),
        (),
    )
    keys = ChunkKeys("c", grid.get("separator", "/"), len(shape))
    rewritten = {k: v for k, v in meta.items() if k != "storage_transformers"}
    plan.files[path] = json.dumps(rewritten, indent=4).encode()
    data = posixpath.join("data/root", name) if name else "data/root"
    kv = ZarrKV(plan.store, plan.cache, data, tuple(shape), [level], keys, itemsize(meta.get("data_type")))
    plan.providers[data] = ZarrArray(kv)
    plan.report.append(Finding(f"{name or '.'}: zarr v3 draft array, sharded"))
