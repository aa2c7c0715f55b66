"""`shardfs mount|unmount|ls|cat|info`. Errors are one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from shardfs.daemon import MountError, fuse_options, mount, parse_options, unmount
from shardfs.errors import CorruptChunk, SourceError
from shardfs.formats import Source, open_source
from shardfs.tree import Dir

DEFAULT_CACHE = "64M"
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 512M or 2G")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardfs", description="Mount sharded datasets as their unsharded files.")
    sub = p.add_subparsers(dest="command", required=True)

    def with_source(name: str, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help)
        s.add_argument("source", type=Path, help="the sharded dataset's directory")
        s.add_argument("--cache-size", type=byte_size, default=DEFAULT_CACHE, help="byte budget for all caches")
        s.add_argument("--view", choices=["native"], default="native", help="how to present the data")
        s.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
        return s

    m = with_source("mount", "mount SOURCE at MOUNTPOINT; returns once the mount is live")
    m.add_argument("mountpoint", type=Path)
    m.add_argument("-f", "--foreground", action="store_true", help="stay attached (systemd, debugging)")
    m.add_argument("-o", dest="options", action="append", default=[], help="FUSE options, e.g. allow_other")
    m.add_argument("--log-file", type=Path, help="where the detached daemon logs (default: under the temp dir)")
    u = sub.add_parser("unmount", help="unmount a shardfs mount")
    u.add_argument("mountpoint", type=Path)
    ls = with_source("ls", "list a directory of the virtual tree without mounting")
    ls.add_argument("path", nargs="?", default="")
    cat = with_source("cat", "write a virtual file to stdout without mounting")
    cat.add_argument("path")
    with_source("info", "what was detected: kinds, scales, sharding, shard files")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.__dict__.get("log_level", "WARNING").upper(), format="%(levelname)s: %(message)s")
    try:
        if args.command == "unmount":
            unmount(args.mountpoint.absolute())
            return 0
        source = open_source(args.source, args.cache_size)
        if args.command == "mount":
            options = fuse_options(str(source.path), parse_options(args.options))
            log_file = args.log_file.absolute() if args.log_file else None
            mount(source, args.mountpoint.absolute(), options, args.foreground, log_file)
        elif args.command == "ls":
            ls(source, args.path.strip("/"))
        elif args.command == "cat":
            cat(source, args.path.strip("/"))
        else:
            info(source)
    except (SourceError, MountError, CorruptChunk) as e:
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
