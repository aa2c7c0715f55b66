"""`shardfs mount|unmount|stats|ls|cat|info|check`. Errors are one line on stderr and a non-zero exit.

`shardfs SOURCE MOUNTPOINT -o key=value,...` is `mount` as libfuse's `mount.fuse3` runs it for fstab
and `mount -t fuse.shardfs`; there, and in `mount`, every option may be given as `-o key=value`.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path

from shardfs import stats_socket
from shardfs.check import check
from shardfs.daemon import MountError, fuse_options, mount, parse_options, unmount
from shardfs.errors import CorruptChunk, SourceError
from shardfs.service import ServiceError, metrics_address
from shardfs.source import Source, open_source
from shardfs.summary import summary
from shardfs.tree import Dir

DEFAULT_CACHE = "64M"
SETTINGS = {"view", "cache_size", "log_level", "log_file", "metrics"}  # mount options that are ours
IGNORED = {"rw", "defaults", "comment"}  # fstab words that mean nothing to a read-only mount
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 512M or 2G")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def parser() -> tuple[argparse.ArgumentParser, set[str]]:
    """The parser, and its command names (for telling the mount-helper form apart)."""
    p = argparse.ArgumentParser(prog="shardfs", description="Mount sharded datasets as their unsharded files.")
    sub = p.add_subparsers(dest="command", required=True)

    def with_source(name: str, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help)
        s.add_argument("source", type=Path, help="the sharded dataset's directory")
        s.add_argument("--cache-size", type=byte_size, default=DEFAULT_CACHE, help="byte budget for all caches")
        s.add_argument(
            "--view", choices=["native", "n5", "zarr2"], default="native",
            help="native: the source's own format, unsharded; n5 or zarr2: its arrays in that format",
        )  # fmt: skip
        s.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
        return s

    m = with_source("mount", "mount SOURCE at MOUNTPOINT; returns once the mount is live")
    m.add_argument("mountpoint", type=Path)
    m.add_argument("-f", "--foreground", action="store_true", help="stay attached (systemd, debugging)")
    m.add_argument("-o", dest="options", action="append", default=[], help="FUSE options, e.g. allow_other")
    m.add_argument("--log-file", type=Path, help="where the detached daemon logs (default: under the temp dir)")
    m.add_argument("--metrics", metavar="[HOST:]PORT", help="serve Prometheus metrics (host defaults to 127.0.0.1)")
    u = sub.add_parser("unmount", help="unmount a shardfs mount")
    u.add_argument("mountpoint", type=Path)
    st = sub.add_parser("stats", help="a live mount's figures: uptime, operations, bytes, cache hit rate, errors")
    st.add_argument("mountpoint", type=Path)
    st.add_argument("--prometheus", action="store_true", help="every figure, in Prometheus' text format")
    ls = with_source("ls", "list a directory of the virtual tree without mounting")
    ls.add_argument("path", nargs="?", default="")
    cat = with_source("cat", "write a virtual file to stdout without mounting")
    cat.add_argument("path")
    with_source("info", "what was detected: kinds, scales, sharding, shard files")
    with_source("check", "read every shard index, verify checksums, count chunks; non-zero exit if any is corrupt")
    return p, set(sub.choices)


def mount_argv(argv: list[str], commands: set[str]) -> list[str]:
    """The mount-helper form made `mount`, and `-o` keys that are shardfs options made those options."""
    if argv and argv[0] not in commands and not argv[0].startswith("-"):
        argv = ["mount", *argv]
    if not argv or argv[0] != "mount":
        return argv
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if not arg.startswith("-o"):
            out.append(arg)
            continue
        kept = []
        for item in filter(None, (arg[2:] or next(args, "")).split(",")):
            word, eq, value = item.partition("=")
            key = word.replace("-", "_")
            if key in SETTINGS and eq:
                out += [f"--{key.replace('_', '-')}", value]
            elif key == "foreground" and not eq:
                out.append("--foreground")
            elif key not in IGNORED and not word.startswith("x-"):
                kept.append(item)
        if kept:
            out += ["-o", ",".join(kept)]
    return out


def main(argv: list[str] | None = None) -> int:
    p, commands = parser()
    args = p.parse_args(mount_argv(sys.argv[1:] if argv is None else argv, commands))
    logging.basicConfig(level=args.__dict__.get("log_level", "WARNING").upper(), format="%(levelname)s: %(message)s")
    try:
        if args.command == "unmount":
            unmount(args.mountpoint.absolute())
            return 0
        if args.command == "stats":
            text = stats_socket.read(args.mountpoint.absolute())
            print(text if args.prometheus else summary(text, time.time()), end="")
            return 0
        source = open_source(args.source, args.cache_size, "native" if args.command == "check" else args.view)
        if args.command == "mount":
            options = fuse_options(str(source.path), parse_options(args.options))
            log_file = args.log_file.absolute() if args.log_file else None
            metrics_at = metrics_address(args.metrics) if args.metrics else None
            mount(source, args.mountpoint.absolute(), options, args.foreground, log_file, metrics_at)
        elif args.command == "ls":
            ls(source, args.path.strip("/"))
        elif args.command == "cat":
            cat(source, args.path.strip("/"))
        elif args.command == "check":
            return check(source, progress=sys.stderr.isatty())
        else:
            info(source)
    except (SourceError, MountError, CorruptChunk, ServiceError) as e:
        print(f"shardfs: {e}", file=sys.stderr)
        return 2 if isinstance(e, SourceError) else 1
    except FileNotFoundError as e:
        print(f"shardfs: {e.filename or e}: no such file in the virtual tree", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except Exception as e:  # a source shaped in a way no check foresaw: one line, not a traceback
        logging.getLogger("shardfs").debug("unexpected error", exc_info=True)
        print(f"shardfs: {args.__dict__.get('source', '')}: cannot be read ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    return 0


def ls(source: Source, path: str) -> None:
    if not isinstance(source.tree.lookup(path), Dir):
        print(path)
        return
    for name, is_dir in source.tree.listdir(path):
        sys.stdout.write(f"{name}/\n" if is_dir else f"{name}\n")


def cat(source: Source, path: str) -> None:
    node = source.tree.lookup(path)
    if isinstance(node, Dir):
        raise FileNotFoundError(path)
    size, block = node.size(), 1 << 20
    for offset in range(0, size, block):
        sys.stdout.buffer.write(node.read(offset, block))
    sys.stdout.flush()


def info(source: Source) -> None:
    print(f"source: {source.path}")
    for kind in source.kinds:
        print(f"  {kind}")
    for directory, provider in sorted(source.providers.items()):
        print(f"{directory or '.'}/: {provider.kind}")
        for key, value in provider.describe().items():
            print(f"  {key}: {value}")
