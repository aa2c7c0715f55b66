"""Zarr v3: every array whose array→bytes codec is `sharding_indexed` shown as the unsharded array with
the innermost chunks, whose `zarr.json` says so; groups and unsharded arrays pass through unchanged.
This module walks the hierarchy and rewrites its metadata; `zarr_codecs.py` reads codec chains,
`zarr_array.py` presents an array, `zarr_draft.py` plans the 2022 sharding draft.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from shardfs.cache import ByteCache
from shardfs.errors import SourceError, Unsupported
from shardfs.files import File
from shardfs.formats.plan import LARGEST, MALFORMED, Array, Category, Finding, Plan, load_json, senseless
from shardfs.formats.zarr_array import SourceChunks, ZarrArray
from shardfs.formats.zarr_codecs import (
    KNOWN_CODECS,
    chunk_codecs,
    fill_value,
    itemsize,
    positive_ints,
    unknown_codecs,
    unshard,
)
from shardfs.formats.zarr_draft import DRAFT_FORMAT, walk_draft
from shardfs.shards.kv import Fetch
from shardfs.shards.zarr import ChunkKeys
from shardfs.shards.zarr_kv import ZarrKV
from shardfs.stores.protocol import Store

log = logging.getLogger("shardfs")
OME_KINDS = {"multiscales": "image", "plate": "plate", "well": "well", "labels": "labels"}  # by the key that says so


@dataclass
class ZarrPlan(Plan):
    """The mount plan for a zarr v3 hierarchy: rewritten array metadata and sharded arrays."""

    consolidated: dict[str, dict] = field(default_factory=dict)  # groups with consolidated metadata, by path
    # Every node a group's consolidated metadata names, by its path from the root: a subgroup has none of its
    # own, so where the store cannot list, its children are known from its ancestor's.
    consolidated_nodes: set[str] = field(default_factory=set)

    def walk(self) -> None:
        """Every node from the root down, depth first, without recursion: nesting is the source's to choose."""
        pending = [""]
        while pending:
            pending += reversed(self._node(pending.pop()))
        for directory, meta in self.consolidated.items():
            self._reconsolidate(directory, meta)

    def _reconsolidate(self, directory: str, meta: dict) -> None:
        """A group's consolidated metadata repeats its descendants' metadata, and readers prefer it: an
        array shown unsharded must be so there too, or a reader takes its inner chunks for shards."""
        entries = meta["consolidated_metadata"].get("metadata")
        if not isinstance(entries, dict):
            return
        rewritten = {
            key: self.files[path]
            for key in entries
            if isinstance(key, str) and (path := posixpath.join(directory, key, "zarr.json")) in self.files
        }
        if rewritten:
            entries.update({key: json.loads(data) for key, data in rewritten.items()})
            self.files[posixpath.join(directory, "zarr.json")] = json.dumps(meta, indent=2).encode()

    def _node(self, directory: str) -> list[str]:
        """Plan the node in directory; the directories of its children, for a group. A malformed node below
        the root is served as stored; a malformed root refuses the mount."""
        root = not directory
        path = posixpath.join(directory, "zarr.json")
        where = self.store.where(path)
        try:
            meta = load_json(self.store, path)
            self.found.add(path)
            if root and isinstance(meta, dict) and meta.get("zarr_format") == DRAFT_FORMAT:
                walk_draft(self)
                return []
            if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
                raise SourceError(f"{where}: field 'zarr_format' must be 3")
            node_type = meta.get("node_type")
            if not isinstance(meta.get("attributes", {}), dict):
                raise SourceError(f"{where}: field 'attributes' must be an object")
            if node_type not in ("group", "array"):
                raise SourceError(f"{where}: field 'node_type' must be 'group' or 'array', not {node_type!r}")
            if root:
                self.what = _what(node_type, meta.get("attributes") or {})
            if node_type == "array":
                self._array(directory, meta, where)
                return []
        except SourceError as e:
            self.refuse(e, root)
            return []
        except MALFORMED as e:
            self.refuse(senseless(where, e), root)
            return []
        self.report.append(Finding(f"{directory or '.'}: zarr v3 group"))
        self.groups[directory] = meta.get("attributes") or {}
        self.directories.add(directory)
        if isinstance(meta.get("consolidated_metadata"), dict):
            self.consolidated[directory] = meta
            self.consolidated_nodes.update(posixpath.join(directory, key) for key in named_keys(meta))
        names: Iterable[str] = (name for name, is_dir in self.store.list(directory) if is_dir)
        if not self.store.can_list:
            prefix = f"{directory}/" if directory else ""
            below = (path[len(prefix) :].split("/")[0] for path in self.consolidated_nodes if path.startswith(prefix))
            names = sorted({*named_children(meta), *below} - {"", ".", ".."})
        children = (posixpath.join(directory, name) for name in names)
        return [child for child in children if self.store.type_of(posixpath.join(child, "zarr.json")) == "file"]

    def refuse(self, error: SourceError, root: bool) -> None:
        if root:
            raise error
        log.error("%s; served as it is stored", error)
        self.report.append(Finding(f"{error}", Category.REFUSED))

    def _array(self, directory: str, document: dict, where: str) -> None:
        self.directories.add(directory)
        meta = ArrayMeta.from_json(document, where)
        if unknown := unknown_codecs(meta.codecs):
            why = f"{where}: field 'codecs' names unknown codec(s) {unknown} (known: {', '.join(KNOWN_CODECS)})"
            log.warning(
                "%s; a typo? its files are served as stored", why, extra={"event": "unknown_codec", "in_report": True}
            )
            self.report.append(Finding(f"{why}", Category.WARNING))
        try:
            unsharded = unshard(meta.codecs, meta.chunk_shape)
            keys = ChunkKeys.from_json(document.get("chunk_key_encoding"), len(meta.shape))
            if unsharded is None:
                self.report.append(Finding(f"{directory or '.'}: zarr v3 array, unsharded (passes through)"))
                chunks = SourceChunks(self.store, directory, keys, meta.chunk_shape, meta.shape)
                self._for_views(
                    directory, meta, meta.codecs, meta.chunk_shape, chunks.chunk, chunks.stored, keys, where
                )
                return
            levels, inner_codecs = unsharded
        except Unsupported as e:
            log.error("%s: %s; served as it is stored", where, e)
            self.report.append(Finding(f"{where}: {e}", Category.REFUSED))
            return
        self.files[posixpath.join(directory, "zarr.json")] = meta.shown(levels[-1].inner, inner_codecs)
        kv = ZarrKV(self.store, self.cache, directory, meta.shape, levels, keys, itemsize(meta.data_type))
        array = ZarrArray(kv)
        self.providers[directory] = array
        self.report.append(
            Finding(
                f"{directory or '.'}: zarr v3 array, sharded ({len(levels)} level(s), {math.prod(meta.shape)} elements)"
            )
        )
        self._for_views(directory, meta, inner_codecs, kv.inner, array.chunk, kv.present_under, keys, where, kv.fetches)

    def _for_views(
        self, directory: str, meta: ArrayMeta, codecs: list, chunks: tuple[int, ...],
        chunk: Callable[[tuple[int, ...]], File | None], stored: Callable[[tuple[int, ...]], Iterable[tuple[int, ...]]],
        keys: ChunkKeys, where: str, prefetch: Callable[[list[tuple[int, ...]]], list[Fetch]] = lambda positions: [],
    ) -> None:  # fmt: skip
        """Describe the array for --view n5/zarr2; one they cannot show is named in `shardfs info`."""
        try:
            dtype, compressor, opaque, decode = chunk_codecs(meta.data_type, codecs, chunks)
            fill = fill_value(meta.fill_value, dtype)
        except Unsupported as e:
            self.report.append(Finding(f"{where}: {e}", Category.NOT_IN_VIEWS))
            return
        self.arrays[directory] = Array(
            meta.shape, chunks, dtype, fill, meta.attributes, compressor, opaque, False, chunk, stored, True,
            decode, self.store.owner(directory), dimension_names=meta.dimension_names, separator=keys.separator,
            prefetch=prefetch,
        )  # fmt: skip


@dataclass(frozen=True)
class ArrayMeta:
    """A zarr v3 array's zarr.json as the values planning needs, checked once (an error names file and field);
    `document` is the object as read, which the shown metadata keeps all else of."""

    document: dict
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    codecs: list
    data_type: Any
    fill_value: Any
    attributes: dict
    dimension_names: tuple[str | None, ...] | None  # malformed names are the source's problem: None, not a refusal

    @classmethod
    def from_json(cls, meta: dict, where: str) -> ArrayMeta:
        shape = meta.get("shape")
        if not isinstance(shape, list) or not all(isinstance(s, int) and 0 <= s < LARGEST for s in shape):
            raise SourceError(f"{where}: field 'shape' must be a list of non-negative integers")
        grid = meta.get("chunk_grid") or {}
        chunk_shape = (grid.get("configuration") or {}).get("chunk_shape")
        if grid.get("name") != "regular" or not positive_ints(chunk_shape, len(shape)):
            raise SourceError(f"{where}: field 'chunk_grid' must be regular, with a positive chunk size per dimension")
        codecs = meta.get("codecs")
        if not isinstance(codecs, list):
            raise SourceError(f"{where}: field 'codecs' must be a list")
        names = meta.get("dimension_names")
        named = isinstance(names, list) and len(names) == len(shape)
        named = named and all(n is None or isinstance(n, str) for n in names)
        return cls(
            meta, tuple(shape), tuple(chunk_shape), codecs, meta.get("data_type"), meta.get("fill_value"),
            meta.get("attributes") or {}, tuple(names) if named else None,
        )  # fmt: skip

    def shown(self, chunk_shape: tuple[int, ...], codecs: list) -> bytes:
        """The zarr.json of the array with chunk_shape and codecs in place of its own (its innermost chunks)."""
        grid = self.document["chunk_grid"]
        configuration = {**grid["configuration"], "chunk_shape": list(chunk_shape)}
        return json.dumps({**self.document, "chunk_grid": {**grid, "configuration": configuration}, "codecs": codecs},
                          indent=2).encode()  # fmt: skip


def named_children(meta: dict) -> list[str]:
    """The children a group's own metadata names, for a store that cannot list: the first component of each
    consolidated metadata key, else the paths of its OME-Zarr multiscales datasets (0.5 or 0.4 layout)."""
    if isinstance((meta.get("consolidated_metadata") or {}).get("metadata"), dict):
        names = (key.split("/")[0] for key in named_keys(meta))
    else:
        attributes = meta.get("attributes") or {}
        multiscales = (attributes.get("ome") or {}).get("multiscales") or attributes.get("multiscales") or []
        names = (
            d["path"].split("/")[0]
            for m in multiscales if isinstance(m, dict)
            for d in m.get("datasets") or [] if isinstance(d, dict) and isinstance(d.get("path"), str)
        )  # fmt: skip
    return sorted({name for name in names if name not in ("", ".", "..")})


def named_keys(meta: dict) -> list[str]:
    """The keys of a group's consolidated metadata: the paths of its descendants, relative to it."""
    consolidated = (meta.get("consolidated_metadata") or {}).get("metadata")
    return [key for key in consolidated if isinstance(key, str)] if isinstance(consolidated, dict) else []


def open_zarr(store: Store, cache: ByteCache) -> ZarrPlan:
    plan = ZarrPlan(store, cache, format="zarr")
    plan.walk()
    return plan


def _what(node_type: str, attributes: dict) -> str:
    """The hierarchy whose root is of node_type, in a few words: `zarr v3 array`, `OME-Zarr 0.5 image`."""
    ome = attributes.get("ome")
    if node_type == "group" and isinstance(ome, dict):
        kind = next((word for key, word in OME_KINDS.items() if key in ome), "group")
        return f"OME-Zarr {ome.get('version', '(no version)')} {kind}"
    return f"zarr v3 {node_type}"
