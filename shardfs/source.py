"""Opening a source: its format detected and planned, in the view asked for, as one virtual tree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardfs.cache import DEFAULT_MAX_VALUE, ByteCache
from shardfs.errors import SourceError
from shardfs.formats.plan import Plan
from shardfs.formats.precomputed import open_precomputed
from shardfs.formats.zarr import open_zarr
from shardfs.store import LocalStore
from shardfs.tree import Provider, Tree
from shardfs.views import view_of


@dataclass
class Source:
    """An opened source: its virtual tree, and what was detected, for `shardfs info`."""

    path: Path
    tree: Tree
    kinds: list[str]
    providers: dict[str, Provider]
    cache: ByteCache


def open_source(
    path: str | Path, cache_bytes: int, view: str = "native", max_file_size: int = DEFAULT_MAX_VALUE
) -> Source:
    """Detect the source's format and plan its mount, in the view asked for; SourceError, in one sentence,
    if it makes no sense."""
    root = Path(path).resolve()
    if not root.is_dir():
        raise SourceError(f"{root}: {'not a directory' if root.exists() else 'does not exist'}")
    store = LocalStore(root)
    cache = ByteCache(cache_bytes, max_file_size)
    if store.kind("zarr.json") == "file":
        plan: Plan = open_zarr(store, cache)
    elif store.kind("info") == "file":
        plan = open_precomputed(store, cache)
    else:
        raise SourceError(f"{root}: neither 'zarr.json' (zarr v3) nor 'info' (Neuroglancer precomputed) is there")
    if view != "native":
        plan = view_of(plan, view)
    tree = Tree(store, cache, plan.files, plan.providers, passthrough=view == "native")
    return Source(root, tree, plan.kinds, plan.providers, cache)
