"""`python -m tests.support.as_user UID GID tests.support.keeper_probe SOCKET NAME`: try to take a mount's
descriptors from a keeper as another user; prints `taken: N` or `refused: why`."""

from __future__ import annotations

from pathlib import Path

from shardfs.errors import ServiceError
from shardfs.service import keeper


def main(args: list[str]) -> int:
    try:
        print(f"taken: {len(keeper.take(Path(args[0]), args[1]))}")
    except ServiceError as e:
        print(f"refused: {e}")
    return 0
