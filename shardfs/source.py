"""Opening a source: its store chosen from its name, its format detected and planned, in the view asked
for, as one virtual tree."""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from shardfs.cache import DEFAULT_MAX_VALUE, ByteCache
from shardfs.collection import Collection
from shardfs.context import Context
from shardfs.errors import SourceError, SourceMissing
from shardfs.files import Provider
from shardfs.formats.plan import Array, Category, Finding, Plan
from shardfs.formats.precomputed import open_precomputed
from shardfs.formats.zarr import open_zarr
from shardfs.stores.disk_cache import DiskCache
from shardfs.stores.local import LocalStore
from shardfs.stores.location import Remote, parse_source
from shardfs.stores.protocol import Store
from shardfs.stores.remote import Access, NoBucket, RemoteStore
from shardfs.stores.unlisted import UNLISTED, NamedListing
from shardfs.tree import Tree
from shardfs.views import view_of

MARKERS = {"zarr.json": "zarr", "info": "precomputed"}  # a dataset's root metadata file, and its format
COLLECTION = (
    "no dataset at the root: its directories are shown as stored, and each one holding a dataset (zarr.json or"
    " info) is shown as a mount of that dataset would show it, found when first looked up or listed"
)


@dataclass
class Source:
    """An opened source: its virtual tree, and what was detected, for `shardfs info`."""

    name: str  # the directory or URL, as messages and `mount` show it
    local: Path | None  # the directory, for a local source
    tree: Tree
    report: list[Finding]  # what was found
    providers: dict[str, Provider]
    cache: ByteCache
    arrays: dict[str, Array]  # the arrays whose chunks decode to values (`check --deep` decodes them)
    context: Context

    @property
    def collection(self) -> Collection | None:
        """The tree, if the source is no dataset but a directory of them (`info` and `check` walk it)."""
        return self.tree if isinstance(self.tree, Collection) else None


def is_remote(text: str | Path) -> bool:
    """Whether a SOURCE argument names a remote source (SourceError if it names nothing shardfs reads)."""
    return isinstance(_parsed(str(text)), Remote)


def open_source(
    text: str | Path, cache_bytes: int, view: str = "native", max_file_size: int = DEFAULT_MAX_VALUE,
    access: Access | None = None, disk: DiskCache | None = None, context: Context | None = None,
) -> Source:  # fmt: skip
    """Detect the source's format and plan its mount, in the view asked for; SourceError, in one sentence,
    if it makes no sense or, remote, cannot be reached. disk: where a remote source's byte ranges are kept
    across mounts, if anywhere. context: the mount's, where its stores count and track what they do."""
    context = context or Context()
    parsed = _parsed(str(text))
    if isinstance(parsed, Remote):
        store: Store = RemoteStore(parsed, access or Access(), disk, context)
        name, local = parsed.url, None
    else:
        local = Path(parsed).resolve()
        try:
            is_dir = local.is_dir()
        except OSError as e:  # a parent this user may not search (EACCES), a loop of links
            raise SourceError(f"{local}: cannot be read: {e.strerror}") from None
        if not is_dir:
            raise (SourceError if local.exists() else SourceMissing)(
                f"{local}: {'not a directory' if local.exists() else 'does not exist'}"
            )
        store, name = LocalStore(local, context=context), str(local)
    cache = ByteCache(cache_bytes, max_file_size)
    try:
        kind = _kind(store)
        # A prefix nothing is under is no directory of datasets but a slip, as a missing local directory is.
        empty = kind is None and local is None and store.can_list and next(iter(store.list("")), None) is None
    except NoBucket as e:
        raise SourceError(f"{name}: {e.strerror}; check the bucket's name") from None
    except OSError as e:  # the first request of all: what failed is reaching the source, not one file of it
        hint = "check the URL and --endpoint"
        if e.errno == errno.EACCES:
            if access is not None and access.anonymous:
                hint = "the server refuses unsigned requests: drop --anonymous"
            elif isinstance(store, RemoteStore) and not store.signed:
                hint = ("the server refuses unsigned requests, and no credentials were found: see README, Remote"
                        " sources, for where they are looked for")  # fmt: skip
            else:
                hint = "it refused these credentials"
        raise SourceError(f"{name}: cannot be reached ({e.strerror}); {hint}") from None
    if kind is None:
        if not store.can_list:
            raise SourceMissing(f"{name}: neither 'zarr.json' (zarr v3) nor 'info' (Neuroglancer precomputed) is"
                                " there, and a web server cannot list what is below it: name a dataset")  # fmt: skip
        if empty:
            raise SourceMissing(f"{name}: nothing is there: no dataset ('zarr.json' or 'info'), and nothing below it")
        tree = Collection(
            store, cache, lambda beneath, scoped: _found(beneath, scoped, view)[1],
            lambda beneath, scoped: _found(beneath, scoped, view)[0].what,
        )  # fmt: skip
        return Source(name, local, tree, [Finding(COLLECTION, Category.NOTE)], {}, cache, {}, context)
    try:
        plan, tree = _dataset(store, cache, kind, view)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise
        raise SourceError(f"{e.filename or name}: cannot be read: {e.strerror}") from None
    return Source(name, local, tree, plan.report, plan.providers, cache, plan.arrays, context)


def _dataset(store: Store, cache: ByteCache, kind: str, view: str) -> tuple[Plan, Tree]:
    """The dataset of format kind at store's root, planned in view, and its tree."""
    plan = open_zarr(store, cache) if kind == "zarr" else open_precomputed(store, cache)
    if view != "native":
        viewed = view_of(plan, view)
        viewed.what = plan.what  # what the source is, whatever it is shown as
        plan = viewed
    shown: Store = store
    if not store.can_list and view == "native":
        marker = "zarr.json" if kind == "zarr" else ""  # a precomputed dataset names every directory it has
        shown = NamedListing(store, plan.directories, plan.found, marker, plan.providers)
        plan.report.append(Finding(UNLISTED, Category.NOTE))
    return plan, Tree(shown, cache, plan.files, plan.providers, view == "native", plan.aliases)


def _found(store: Store, cache: ByteCache, view: str) -> tuple[Plan, Tree]:
    """The plan and tree of a dataset found below a collection's root (its collection.Opener takes the tree, its
    Examiner what the plan says it is): SourceMissing where there is none, SourceError where its metadata cannot
    be opened, or a file it names is gone or may not be read."""
    kind = _kind(store)
    if kind is None:
        raise SourceMissing(store.where(""))
    try:
        return _dataset(store, cache, kind, view)
    except (FileNotFoundError, PermissionError) as e:
        raise SourceError(f"{e.filename or store.where('')}: cannot be read: {e.strerror}") from None


def _kind(store: Store) -> str | None:
    """The format of the dataset at the store's root, or None if there is none. Where reads wait on a network,
    every marker is asked for at once (one HEAD each, in one round trip), not one after the other: most
    directories of a bucket hold neither. A marker that is a prefix, not an object, is none."""
    pool = store.reads()
    asked: list[Callable[[], bool]] = [
        partial(store.is_file, marker) if pool is None else pool.submit(store.is_file, marker).result
        for marker in MARKERS
    ]
    return next((kind for kind, there in zip(MARKERS.values(), asked, strict=True) if there()), None)


def _parsed(text: str) -> str | Remote:
    try:
        return parse_source(text)
    except ValueError as e:
        raise SourceError(str(e)) from None
