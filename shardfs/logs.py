"""The daemon's log: one logfmt line a record, `time= level= event= path= shard= key= msg=`, so that
grep, journald and log shippers can pick out every EIO of one shard without parsing prose."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

FIELDS = ("event", "path", "shard", "key")  # passed as `extra=` by the calls that know them
_BARE = re.compile(r"[^\s\"=\\]+")


def _value(value: object) -> str:
    text = str(value)
    return text if _BARE.fullmatch(text) else json.dumps(text)


class Logfmt(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
        parts = [f"time={when.replace('+00:00', 'Z')}", f"level={record.levelname.lower()}"]
        parts.append(f"event={_value(getattr(record, 'event', record.funcName.strip('_')))}")
        parts += [f"{name}={_value(getattr(record, name))}" for name in FIELDS[1:] if hasattr(record, name)]
        parts.append(f"msg={_value(record.getMessage())}")
        if record.exc_info:
            parts.append(f"error={_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


def log_to(log_file: Path | None) -> None:
    """Records go to log_file, or to stderr (which systemd sends to the journal)."""
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(Logfmt())
    logging.getLogger().handlers[:] = [handler]
