"""Whether a daemon came up: what a detached daemon tells `shardfs mount` through its pipe, and what the CSI daemon
answers the plugin for each volume. One typed value with its reason beside it, never words parsed for a prefix: a
source's own message may start with anything."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from shardfs.errors import SourceError, SourceMissing


class Said(enum.Enum):
    READY = "ready"  # the kernel's INIT is answered (or a kept connection taken up)
    REFUSED = "refused"  # the source cannot be opened: the request's fault, in the daemon's words
    MISSING = "missing"  # nothing is at the source (no such path, no dataset's metadata there)
    FAILED = "failed"  # anything else
    STOPPED = "stopped"  # Ctrl-C reached it before it was ready; why: what it left waiting, if anything


@dataclass(frozen=True)
class Outcome:
    said: Said
    why: str = ""

    @classmethod
    def of(cls, e: BaseException) -> Outcome:
        """The outcome an error that ended a mount before it was ready means."""
        if isinstance(e, SourceMissing):
            return cls(Said.MISSING, str(e))
        return cls(Said.REFUSED if isinstance(e, SourceError) else Said.FAILED, str(e))

    def to_json(self) -> dict[str, str]:
        return {"said": self.said.value, "why": self.why}

    @classmethod
    def from_json(cls, data: object) -> Outcome:
        """The outcome data carries; one that is not is FAILED, saying so (a daemon is trusted with nothing)."""
        try:
            return cls(Said(data["said"]), str(data.get("why", "")))  # type: ignore[index, union-attr]
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls(Said.FAILED, f"not an outcome: {str(data)[:200]!r}")

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json()).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Outcome | None:
        """The outcome written to a pipe; None if nothing was (the daemon ended without saying)."""
        if not data:
            return None
        try:
            return cls.from_json(json.loads(data))
        except ValueError:
            return cls(Said.FAILED, data.decode(errors="replace"))


READY = Outcome(Said.READY)
