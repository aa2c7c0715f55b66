"""A store seen from one of its directories: a dataset found inside a mounted directory or bucket.

The formats read a dataset from its own root (`info`, `zarr.json`, shard paths relative to it), so a dataset
below the mount's source is given the source's store seen from its directory. Nothing is opened anew: every
path is resolved by the source's store from the source's root, so no link is followed on the way to the
dataset and its owners are narrowed by every directory from the mount's root down, and one bucket keeps one
client. Files it hands out carry paths relative to the dataset, as a mount of the dataset alone would have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from shardfs.request import OWN, Request
from shardfs.stores.protocol import ByteRange, Owner, Store, StoredFile


class Beneath:
    """store, its paths taken relative to directory (a path of store, not '')."""

    def __init__(self, store: Store, directory: str) -> None:
        self.store = store
        self.directory = directory

    def __getattr__(self, name: str) -> Any:
        """What names no path (can_list, reads, forget, descriptors, ...) is the store's, unchanged."""
        return getattr(self.store, name)

    def _full(self, path: str) -> str:
        return f"{self.directory}/{path}" if path else self.directory

    def _theirs(self, file: StoredFile) -> StoredFile:
        return dataclasses.replace(file, path=self._full(file.path), store=self.store)

    def _ours(self, file: StoredFile) -> StoredFile:
        return dataclasses.replace(file, path=file.path[len(self.directory) + 1 :], store=self)

    def open(self, path: str) -> StoredFile:
        return self._ours(self.store.open(self._full(path)))

    def open_reading(self, path: str, want: ByteRange, request: Request = OWN) -> tuple[StoredFile, bytes]:
        file, data = self.store.open_reading(self._full(path), want, request)
        return self._ours(file), data

    def read(self, file: StoredFile, start: int, stop: int, request: Request = OWN) -> bytes:
        return self.store.read(self._theirs(file), start, stop, request)

    def next_data(self, file: StoredFile, offset: int) -> int:
        return self.store.next_data(self._theirs(file), offset)

    def list(self, path: str) -> Iterator[tuple[str, bool]]:
        return self.store.list(self._full(path))

    def type_of(self, path: str) -> str | None:
        return self.store.type_of(self._full(path))

    def is_file(self, path: str) -> bool:
        return self.store.is_file(self._full(path))

    def owner(self, path: str) -> Owner:
        return self.store.owner(self._full(path))

    def where(self, path: str) -> str:
        return self.store.where(self._full(path))

    def sizes(self) -> Iterator[int]:
        """Nothing: `df` counts the source's files, once, from its root."""
        return iter(())
