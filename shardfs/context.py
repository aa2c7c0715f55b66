"""What one mount counts and tracks, passed down to its stores and its session rather than kept in module
globals, so that one process can serve several mounts (the CSI daemon), each with its own figures and its
own requests under way. Its cache (and with it the turn of large values: one at a time, see
cache.ByteCache.large_value_turn, given to what decodes when the tree is made) is the mount's tree's; what one
request may decode travels with the request (shardfs/request.py)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from shardfs.metrics import Metrics

T = TypeVar("T")


class Waiting:
    """Requests under way, so that stopping can say what it leaves behind (`shardfs mount -f` and Ctrl-C)."""

    def __init__(self) -> None:
        self._requests: dict[int, tuple[str, str, float]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def run(self, what: str, url: str, request: Callable[[], T]) -> T:
        """request(), known to be under way until it returns (in whichever thread runs it)."""
        with self._lock:
            token = next(self._ids)
            self._requests[token] = (what, url, time.monotonic())
        try:
            return request()
        finally:
            with self._lock:
                del self._requests[token]

    def said(self) -> str | None:
        """`stopping: 3 requests still waiting on the source (the oldest: get URL, for 12.0 s)`, or None."""
        with self._lock:
            requests = list(self._requests.values())
        if not requests:
            return None
        what, url, started = min(requests, key=lambda r: r[2])
        n = len(requests)
        oldest = f"{'the oldest: ' if n > 1 else ''}{what} {url}, for {time.monotonic() - started:.1f} s"
        return f"stopping: {n} request{'s' if n > 1 else ''} still waiting on the source ({oldest})"


@dataclass(frozen=True)
class Context:
    """One mount's figures and requests under way (a command that mounts nothing, `ls` or `cat`, has one too)."""

    metrics: Metrics = field(default_factory=Metrics)
    waiting: Waiting = field(default_factory=Waiting)
