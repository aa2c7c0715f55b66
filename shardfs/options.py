"""shardfs's own settings, each once: its flag, its `-o` word, its CSI volume attribute, how its text is read, its
default and whether only remote sources use it. `shardfs mount`'s flags, the fstab helper's `-o` words, a CSI
volume's attributes and a Slurm job's words are all read from this one table, so that a setting cannot mean one
thing on the command line and another in a PersistentVolume. The `-o` words that are nobody's (fstab's, and those
a deployment keeps for itself) are here too, each with why."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shardfs.logs import DEBUG_BURST

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MIN_CACHE = 64 << 10  # below it, a size is a slip (`--cache-size 512` for 512M): every read would decode again
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
VIEWS = ("native", "n5", "zarr2")
DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_TIMEOUT = 30.0  # --timeout: the most one remote request may take, retries included
TRUE_FALSE = {"true": True, "false": False}


def byte_size(text: str) -> int:
    """`512M`, `1.5G`, `2GiB` (powers of 1024), at least MIN_CACHE."""
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 512M or 1.5G")
    n = int(float(m.group(1)) * UNITS[m.group(2).upper()])
    if n < MIN_CACHE:
        raise argparse.ArgumentTypeError(f"{text!r} is too small: at least {MIN_CACHE >> 10}K")
    return n


def metrics_address(text: str) -> tuple[str, int]:
    """'9477' or ':9477' → localhost; 'HOST:PORT' and '[v6]:PORT' as given."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_METRICS_HOST
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not PORT or HOST:PORT (a port from 1 to 65535)")
    return host, int(port)


def seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def endpoint_url(text: str) -> str:
    """An http:// or https:// base URL with a host."""
    url = urlsplit(text)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL such as https://storage.example.org")
    return text


def boolean(text: str) -> bool:
    """`true` or `false`, as Kubernetes writes a switch's attribute."""
    if text.lower() not in TRUE_FALSE:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return TRUE_FALSE[text.lower()]


@dataclass(frozen=True)
class Setting:
    """One setting. name is its argparse dest and its `-o` word (unless word says another); a switch takes no
    value (`--anonymous`, `-o anonymous`, the attribute `anonymous: "true"`). attribute: its name in a CSI volume
    (and so a Slurm job's), None where a volume cannot ask for it (the daemon's own files, the node's identity).
    mount_only: `shardfs mount`'s alone, not `ls`/`cat`/`info`/`check`'s."""

    name: str
    help: str
    parse: Callable[[str], Any] = str
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    word: str = ""
    attribute: str | None = None
    remote_only: bool = False
    mount_only: bool = False
    short: str = ""  # a one-letter flag beside the long one (`-f`)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def said(self) -> str:
        """The `-o` word that asks for it."""
        return self.word or self.name

    def initial(self) -> Any:
        """Its value when not given: the default's text read as given text is; a switch off."""
        if self.switch:
            return False
        return self.parse(self.default) if isinstance(self.default, str) else self.default

    def read(self, text: str) -> Any:
        """Its value from text (an attribute's, a job's word); ArgumentTypeError saying why it cannot be."""
        if self.switch:
            return boolean(text)
        value = self.parse(text)
        if self.choices is not None and value not in self.choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(self.choices)}")
        return value

    def add_to(self, p: argparse.ArgumentParser) -> None:
        flags = [self.short, self.flag] if self.short else [self.flag]
        if self.switch:
            p.add_argument(*flags, action="store_true", help=self.help)
        else:
            p.add_argument(
                *flags, type=self.parse, default=self.default, metavar=self.metavar, choices=self.choices,
                help=self.help,
            )  # fmt: skip


REMOTE = "remote sources: "
SETTINGS = (
    Setting("view", "native: the source's own format, unsharded; n5 or zarr2: its arrays in that format",
            default="native", choices=VIEWS, attribute="view"),
    Setting("cache_size", "byte budget for all caches together: 512M, 1.5G, 2GiB (powers of 1024; at least"
            f" {MIN_CACHE >> 10}K)", byte_size, "64M", "SIZE", attribute="cacheSize"),
    Setting("max_file_size", "the largest file decoded (a chunk, a shard under a whole-shard codec); a larger one"
            " is EIO, logged and counted as over --max-file-size (not as corrupt)", byte_size, "256M", "SIZE",
            attribute="maxFileSize"),
    Setting("log_level", f"{', '.join(LOG_LEVELS)}: the least severe records logged; mount -f logs from INFO unless"
            " given, so that its terminal shows the mount and its end; DEBUG logs a line per FUSE request (op, path,"
            f" bytes, store_reads, us), at most {DEBUG_BURST} a minute (default: WARNING)", str.upper,
            metavar="LEVEL", choices=LOG_LEVELS, attribute="logLevel"),
    Setting("anonymous", REMOTE + "send unsigned requests, whatever credentials are found", switch=True,
            attribute="anonymous", remote_only=True),
    Setting("endpoint", REMOTE + "an S3-compatible or GCS-compatible server's base URL", endpoint_url,
            metavar="URL", attribute="endpoint", remote_only=True),
    Setting("region", "s3:// sources: the bucket's region", attribute="region", remote_only=True),
    Setting("profile", "s3:// sources: the AWS profile to sign with (as AWS_PROFILE)", metavar="NAME",
            remote_only=True),  # a volume's credentials are its publish secret's
    Setting("requester_pays", "s3:// sources: a Requester Pays bucket, whose requests this account pays for",
            switch=True, attribute="requesterPays", remote_only=True),
    Setting("timeout", REMOTE + "the most one request may take, retries included; then the read is EIO", seconds,
            DEFAULT_TIMEOUT, "SECONDS", attribute="timeout", remote_only=True),
    Setting("cache_dir", REMOTE + "keep the byte ranges read in DIR, across mounts (default: not kept); DIR must"
            " be yours and writable by nobody else (made 0700 if missing)", Path, metavar="DIR", remote_only=True),
    Setting("cache_dir_size", "the most --cache-dir holds; the least recently used ranges go first", byte_size,
            "1G", "SIZE", remote_only=True),
    Setting("foreground", "stay attached (systemd, debugging)", switch=True, mount_only=True,
            short="-f"),
    Setting("allow_non_empty", "mount over a directory that has files in it", switch=True, word="nonempty",
            mount_only=True),
    Setting("allow_other", "let every local user read the mount (-o allow_other; a user needs user_allow_other in"
            " fuse.conf)", switch=True, mount_only=True),
    Setting("log_file", "where the detached daemon logs (default: $TMPDIR/shardfs-UID/<mountpoint>.log)", Path,
            metavar="PATH", mount_only=True),
    Setting("metrics", f"serve Prometheus metrics (HOST defaults to {DEFAULT_METRICS_HOST}; off by default)",
            metrics_address, metavar="[HOST:]PORT", mount_only=True),
)  # fmt: skip
BY_NAME = {s.name: s for s in SETTINGS}
BY_WORD = {s.said: s for s in SETTINGS}
BY_ATTRIBUTE = {s.attribute: s for s in SETTINGS if s.attribute is not None}

# `-o` words that mean nothing to a read-only mount, as fstab and mount(8) write them (and any `x-` word: mount(8)
# leaves those to userspace tools such as systemd), dropped before FUSE reads the rest.
FSTAB_WORDS = {
    "rw": "the mount is read-only whatever is asked",
    "defaults": "fstab's placeholder for no options",
    "comment": "fstab's note for other tools",
}
# Words a CSI volume's mountOptions may not say: the plugin finds its mounts by their type and unmounts them itself.
PLUGINS_OWN = {
    "subtype": "its mounts are fuse.shardfs",
    "fsname": "the source, without credentials",
    "auto_unmount": "the plugin unmounts",
}
# Words that say who may reach a mount or its daemon: a Slurm node's policy (a job's mount is its user's alone),
# never a job's comment to choose. allow_other or allow_root would let every user's df, and root's, wait on a
# daemon the job's user may stop.
NODES_POLICY = ("allow_other", "allow_root", "uid", "gid", "umask", "user_id", "group_id", "default_permissions",
                "context", "fscontext", "defcontext", "rootcontext")  # fmt: skip


def word_of(key: str) -> Setting | None:
    """The setting an `-o` word (`cache_size`, or `cache-size` as a flag spells it) names, if any."""
    return BY_WORD.get(key.replace("-", "_"))


def dropped(word: str) -> bool:
    """Whether an `-o` word is fstab's, meaning nothing to shardfs (see FSTAB_WORDS)."""
    return word in FSTAB_WORDS or word.startswith("x-")
