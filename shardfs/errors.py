"""The two ways a source can be wrong: at mount time, or in one stored chunk."""


class SourceError(Exception):
    """The source cannot be mounted. The message is one sentence naming the file and the field."""


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


class CacheDirRefused(Exception):
    """--cache-dir cannot be trusted or opened. The message is one sentence naming the directory, what is
    wrong and what to do."""


class ServiceError(Exception):
    """A service part could not start; the message says why in one sentence."""
