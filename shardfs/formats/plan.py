"""What a source format contributes to a mount: rewritten metadata files and computed directories."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardfs.cache import ByteCache
from shardfs.store import LocalStore
from shardfs.tree import Provider


@dataclass
class Plan:
    store: LocalStore
    cache: ByteCache
    files: dict[str, bytes] = field(default_factory=dict)  # metadata rewritten without sharding
    providers: dict[str, Provider] = field(default_factory=dict)  # sharded directories, by path
    kinds: list[str] = field(default_factory=list)  # what was found, for `shardfs info`
