"""The daemon's log: one logfmt line a record, `time= level= event= path= shard= key= msg=`, so that
grep, journald and log shippers can pick out every EIO of one shard without parsing prose.

Any user who can read the mount can make it log (bad names, corrupt chunks), so warnings and errors are
rate-limited per kind: a burst, then a count of what was dropped on the next line let through."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

FIELDS = ("event", "path", "shard", "key", "suppressed")  # passed as `extra=` by the calls that know them
_BARE = re.compile(r"[^\s\"=\\]+")


BURST = 20  # lines of one (level, event) let through per window
WINDOW = 60.0  # seconds


def _event(record: logging.LogRecord) -> str:
    return str(getattr(record, "event", record.funcName.strip("_")))


def _value(value: object) -> str:
    text = str(value)
    return text if _BARE.fullmatch(text) else json.dumps(text)


class Logfmt(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        parts = [f"time={when.replace('+00:00', 'Z')}", f"level={record.levelname.lower()}"]
        parts.append(f"event={_value(_event(record))}")
        parts += [f"{name}={_value(getattr(record, name))}" for name in FIELDS[1:] if hasattr(record, name)]
        parts.append(f"msg={_value(record.getMessage())}")
        if record.exc_info:
            parts.append(f"error={_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


@dataclass
class _Window:
    start: float
    count: int = 0
    suppressed: int = 0


class RateLimit(logging.Filter):
    """At most `burst` warnings or errors of one (level, event) per `window` seconds; the next one let
    through carries `suppressed=N`, the number dropped before it. DEBUG and INFO pass: the operator chose them."""

    def __init__(self, burst: int = BURST, window: float = WINDOW, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self._windows: dict[tuple[int, str], _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        now = self.clock()
        with self._lock:
            w = self._windows.setdefault((record.levelno, _event(record)), _Window(now))
            if now - w.start >= self.window:
                w.start, w.count = now, 0
            w.count += 1
            if w.count > self.burst:
                w.suppressed += 1
                return False
            if w.suppressed:
                record.suppressed, w.suppressed = w.suppressed, 0
        return True


def log_to(log_file: Path | None) -> None:
    """Records go to log_file, or to stderr (which systemd sends to the journal)."""
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(Logfmt())
    handler.addFilter(RateLimit())
    logging.getLogger().handlers[:] = [handler]
