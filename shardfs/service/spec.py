"""What one mount asks for, made once where the request comes in (the command line, a CSI volume, a Slurm job's
words) and read, never parsed again, by whatever serves it: the source and how it is read, the FUSE options, and
the service's own settings. Frozen; JSON for the hand-off to a daemon in another process. A publish secret travels
beside a spec, never in it: a spec is compared, logged and kept, a secret only set in its daemon's environment."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shardfs.context import Context
from shardfs.logs import redact_userinfo
from shardfs.options import BY_NAME
from shardfs.source import Source, open_source
from shardfs.stores.disk_cache import DiskCache
from shardfs.stores.location import parse_source
from shardfs.stores.remote import Access


@dataclass(frozen=True)
class Reading:
    """How the source is read: the view shown, the byte budgets and, for a remote source, how it is reached (its
    credentials aside). cache_dir: where a remote source's byte ranges are kept across mounts, if anywhere."""

    view: str = field(default_factory=BY_NAME["view"].initial)
    cache_size: int = field(default_factory=BY_NAME["cache_size"].initial)
    max_file_size: int = field(default_factory=BY_NAME["max_file_size"].initial)
    access: Access = field(default_factory=Access)
    cache_dir: str | None = None
    cache_dir_size: int = field(default_factory=BY_NAME["cache_dir_size"].initial)


@dataclass(frozen=True)
class Service:
    """The daemon's own settings: how it logs, where its figures are served, whether it stays attached, and where
    its connection is kept for a next daemon (`-o keeper[=SOCKET]`; True: the default keeper)."""

    log_level: str | None = None
    log_file: str | None = None
    metrics: tuple[str, int] | None = None
    foreground: bool = False
    allow_non_empty: bool = False
    keeper: str | bool | None = None


@dataclass(frozen=True)
class MountSpec:
    """source: as given (a URL's user:password@ included: said only redacted). options: the `-o` options mount(2)
    and the session are given, shardfs's defaults applied (daemon.fuse_options)."""

    source: str
    reading: Reading = field(default_factory=Reading)
    options: dict[str, str | bool] = field(default_factory=dict)
    service: Service = field(default_factory=Service)

    @property
    def name(self) -> str:
        """The source as the mount's name, its log and `shardfs stats` show it: a local one's real path, a remote
        one's URL without its user:password@ (/proc/mounts is readable by everyone)."""
        local = parse_source(self.source)
        return str(Path(local).resolve()) if isinstance(local, str) else redact_userinfo(self.source)

    def open_source(self, context: Context, disk: DiskCache | None = None) -> Source:
        """The source opened as reading asks; SourceError in one sentence if it cannot be."""
        r = self.reading
        return open_source(self.source, r.cache_size, r.view, r.max_file_size, r.access, disk, context)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MountSpec:
        """The spec to_json made; TypeError or ValueError if data is not one."""
        reading, service = dict(data["reading"]), dict(data["service"])
        reading["access"] = Access(**reading["access"])
        if service.get("metrics") is not None:
            host, port = service["metrics"]
            service["metrics"] = (str(host), int(port))
        return cls(str(data["source"]), Reading(**reading), dict(data["options"]), Service(**service))
