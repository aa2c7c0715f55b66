"""The ways a source can be wrong: at mount time, or in one stored chunk; and a file too large to make."""


class SourceError(Exception):
    """The source cannot be mounted. The message is one sentence naming the file and the field."""


class SourceMissing(SourceError):
    """Nothing is at the source: no such directory, or no dataset's metadata where it names (a CSI publish
    answers NOT_FOUND, as the spec has it, rather than FAILED_PRECONDITION)."""


class Unsupported(Exception):
    """An array whose metadata shardfs cannot present faithfully (a codec chain, a chunk key encoding); it
    passes through as it is stored."""


class CorruptChunk(Exception):
    """Stored bytes contradict their index. The read fails with EIO; the rest of the mount keeps serving."""

    def __init__(self, shard: str, key: object, why: str) -> None:
        super().__init__(f"corrupt data in shard {shard!r} for key {key}: {why}")
        self.shard = shard
        self.key = key
        self.why = why

    def log_fields(self, event: str) -> dict[str, object]:
        """The structured log fields of this chunk (see shardfs/logs.py)."""
        return {"event": event, "shard": self.shard, "key": self.key}

    @property
    def reason(self) -> str:
        """What is wrong, in the words the mount would log, without the shard's name (for a line that gives it)."""
        return self.why if self.key == "?" else f"{self.key}: {self.why}"


class OverLimit(ValueError):
    """Data that would take more bytes than it may: `size` when known (bytes stored, a size declared), else
    only more than `limit`. Corrupt data unless the limit is --max-file-size's (see `over_max_file_size`)."""

    def __init__(self, why: str, limit: int, size: int | None = None) -> None:
        super().__init__(why)
        self.limit, self.size = limit, size


def over_max_file_size(e: CorruptChunk, max_file_size: int) -> str | None:
    """What to tell the operator when e is a file refused at --max-file-size (or at a per-request bound made
    of it), which is no corruption: a larger cap serves it. None when e is corruption."""
    cause = e.__cause__
    if not isinstance(cause, OverLimit) or cause.limit < max_file_size:
        return None  # a tighter bound the format knows (a volume chunk's raw size): the data is wrong
    what = f"is {binary_size(cause.size)}" if cause.size is not None else f"is more than {binary_size(cause.limit)}"
    if cause.limit > max_file_size:
        what = f"{what} in one request (4 times --max-file-size)"
    return (
        f"shard {e.shard!r} key {e.key} {what}, over --max-file-size {binary_size(max_file_size)};"
        " mount with a larger --max-file-size"
    )


def binary_size(n: float) -> str:
    """n bytes in the largest power-of-1024 unit that keeps it at 1 or more: `3.0 MiB`."""
    if n < 1024:
        return f"{n:,.0f} B"
    units = iter(("KiB", "MiB", "GiB", "TiB"))
    unit = next(units)
    while (n := n / 1024) >= 1024 and unit != "TiB":
        unit = next(units)
    return f"{n:,.1f} {unit}"


class CacheDirRefused(Exception):
    """--cache-dir cannot be trusted or opened. The message is one sentence naming the directory, what is
    wrong and what to do."""


class ServiceError(Exception):
    """A service part could not start; the message says why in one sentence."""
