"""The log's rate limit, on its own with a clock the test moves: a burst per (level, event) and window,
then silence, then a line that says how many were dropped."""

from __future__ import annotations

import logging

from shardfs.logs import Logfmt, RateLimit


def record(level: int, event: str) -> logging.LogRecord:
    made = logging.LogRecord("shardfs", level, __file__, 1, "corrupt %s", ("chunk",), None, func="read")
    made.event = event
    return made


def test_burst_then_silence_then_the_count_of_what_was_dropped() -> None:
    now = [0.0]
    limit = RateLimit(burst=3, window=10, clock=lambda: now[0])
    passed = [limit.filter(record(logging.ERROR, "eio")) for _ in range(1000)]
    assert passed == [True] * 3 + [False] * 997
    assert limit.filter(record(logging.ERROR, "bug"))  # another event has its own budget
    assert limit.filter(record(logging.WARNING, "eio"))  # and so has another level
    now[0] = 9.9
    assert not limit.filter(record(logging.ERROR, "eio"))
    now[0] = 10.0  # a new window
    first = record(logging.ERROR, "eio")
    assert limit.filter(first)
    assert first.suppressed == 998
    assert "level=error event=eio suppressed=998 msg=" in Logfmt().format(first)
    second = record(logging.ERROR, "eio")
    assert limit.filter(second) and not hasattr(second, "suppressed")  # counted once


def test_what_the_operator_asked_for_is_never_dropped() -> None:
    limit = RateLimit(burst=1, window=10, clock=lambda: 0.0)
    assert all(limit.filter(record(level, "read")) for level in (logging.DEBUG, logging.INFO) for _ in range(100))
