"""`shardfs mount|unmount|list|stats|ls|cat|info|check`. Errors are one line on stderr and a non-zero exit.

`shardfs SOURCE MOUNTPOINT -o key=value,...` is `mount` as libfuse's `mount.fuse3` runs it for fstab
and `mount -t fuse.shardfs`; there, and in `mount`, every option may be given as `-o key=value`.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from shardfs import __version__, csi, options
from shardfs.check import check, check_each, plural
from shardfs.collection import LOOKED
from shardfs.context import Context
from shardfs.errors import CacheDirRefused, CorruptChunk, ServiceError, SourceError, over_max_file_size
from shardfs.files import Dir
from shardfs.fuse.mount import FuseMountError, target_of
from shardfs.logs import LogFileError, log_to_terminal, redact
from shardfs.service import mountinfo, stats_socket
from shardfs.service.daemon import (
    MountError,
    UsageError,
    fuse_options,
    mount,
    parse_options,
    unmount,
    waits_for_daemon,
)
from shardfs.service.handover import HANDED_OVER
from shardfs.service.spec import MountSpec, Reading, Service
from shardfs.service.summary import identity, summary
from shardfs.source import Source, is_remote
from shardfs.stores.disk_cache import DiskCache
from shardfs.stores.remote import Access

SHOWN = 100  # datasets `info` names of a directory of them; the others are counted


class Parser(argparse.ArgumentParser):
    """A usage error is one line naming the problem and the valid values, exit 2: not argparse's usage dump.
    A mistyped command or option is told the nearest one there is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}{self._nearest(message)} (see {self.prog} --help)\n")

    def _nearest(self, message: str) -> str:
        if found := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
            words, known = [found.group(1)], re.findall(r"'([^']*)'", found.group(2))
        elif found := re.match(r"unrecognized arguments: (.*)", message):
            words, known = found.group(1).split(), sorted(_option_strings(self))
        else:
            return ""
        for word in words:
            if close := difflib.get_close_matches(word.partition("=")[0], known, n=1):
                return f"; did you mean {close[0]!r}?"
        return ""


def _option_strings(p: argparse.ArgumentParser) -> set[str]:
    """Every option of a parser and of its subcommands."""
    found = set()
    for action in p._actions:  # argparse keeps no public list of them
        found.update(s for s in action.option_strings if s.startswith("--"))
        for sub in getattr(action, "choices", None) or {}:
            if isinstance(action.choices, dict) and isinstance(action.choices[sub], argparse.ArgumentParser):
                found |= _option_strings(action.choices[sub])
    return found


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """Show "(default: …)" where a default says something: not for flags, lists or what is off unless given."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return super()._get_help_string(action) if action.default not in (None, False, []) else action.help


def parser() -> tuple[argparse.ArgumentParser, set[str]]:
    """The parser, and its command names (for telling the mount-helper form apart)."""
    p = Parser(prog="shardfs", description="Mount sharded datasets as their unsharded files.")
    p.add_argument("--version", action="version", version=f"shardfs {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=Help)

    def with_source(name: str, help: str) -> argparse.ArgumentParser:
        s = command(name, help)
        s.add_argument(
            "source", metavar="SOURCE",
            help="the sharded dataset: a directory, file://, gs://, s3://, http:// or https:// URL",
        )  # fmt: skip
        for setting in options.SETTINGS:
            if not setting.mount_only:
                setting.add_to(s)
        return s

    m = with_source("mount", "mount SOURCE at MOUNTPOINT; returns once the mount is live")
    m.add_argument(
        "mountpoint", type=Path, metavar="MOUNTPOINT",
        help="an existing empty directory, neither inside SOURCE nor holding it",
    )  # fmt: skip
    m.add_argument(
        "-o", dest="options", action="append", default=[],
        help="FUSE options, e.g. allow_other; nonempty is --allow-non-empty",
    )  # fmt: skip
    for setting in options.SETTINGS:
        if setting.mount_only:
            setting.add_to(m)
    u = command("unmount", "unmount a shardfs mount")
    u.add_argument("mountpoint", type=Path, metavar="MOUNTPOINT", help="where it is mounted")
    u.add_argument("--any-type", action="store_true", help="unmount whatever is mounted there, even if not shardfs")
    u.add_argument(
        "--lazy", action="store_true",
        help="detach it now even if busy: new opens fail at once, and it goes when the last user lets go",
    )  # fmt: skip
    command("list", "the shardfs mounts on this machine: mountpoint, source, view, daemon pid, uptime")
    st = command("stats", "a live mount's figures: uptime, operations, bytes served, cache hit rate, errors")
    st.add_argument("mountpoint", type=Path, metavar="MOUNTPOINT", help="where it is mounted")
    st.add_argument("--prometheus", action="store_true", help="every figure, in Prometheus' text format")
    ls = with_source("ls", "list a directory of the virtual tree without mounting")
    ls.add_argument("path", nargs="?", default="")
    ls.add_argument("-l", dest="long", action="store_true", help="with each file's size in bytes")
    cat = with_source("cat", "write a virtual file to stdout without mounting")
    cat.add_argument("path")
    with_source("info", "what was detected: kinds, scales, sharding, shard files")
    ch = with_source("check", "read every shard index, verify checksums, count chunks; non-zero exit if any is corrupt")
    ch.add_argument("--deep", action="store_true", help="also read and decode every chunk (reads the whole dataset)")
    csi.add_arguments(command("csi", "serve as a Kubernetes CSI node plugin (see README, Kubernetes)"))
    return p, set(sub.choices)


def mount_argv(argv: list[str], commands: set[str]) -> list[str]:
    """The mount-helper form made `mount`, `-o` keys that are shardfs options made those options, and every
    option's value joined to it (`--cache-size=-5M`), so a value that starts with '-' reaches the option's
    check. ValueError if one setting is given two different values (`-o view=zarr2 --view n5`)."""
    if argv and argv[0] not in commands and not argv[0].startswith("-"):
        if _mistyped(argv, commands):
            raise ValueError(f"invalid choice: {argv[0]!r} (choose from {', '.join(map(repr, sorted(commands)))})")
        argv = ["mount", *argv]
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if argv[0] == "mount" and arg.startswith("-o"):
            out += _mount_options(arg[2:] or next(args, ""))
        elif arg.startswith("--") and _takes_value(arg):
            out.append(f"{arg}={next(args, '')}")
        else:
            out.append(arg)
    given: dict[str, str] = {}
    for arg in out:
        key, eq, value = arg.partition("=")
        if eq and key.startswith("--") and given.setdefault(key, value) != value:
            raise ValueError(f"{key} given twice, as {given[key]!r} and {value!r}: give it once")
    return out


def _mistyped(argv: list[str], commands: set[str]) -> bool:
    """Whether argv[0], not a command, is a command mistyped rather than the SOURCE of the mount-helper form:
    mount.fuse3 always passes `-o`, a SOURCE exists or is a URL, and a typo is near a command's name."""
    word = argv[0]
    return (
        "-o" not in argv
        and not os.path.lexists(word)
        and "://" not in word
        and bool(difflib.get_close_matches(word, commands))
    )


def _takes_value(flag: str) -> bool:
    setting = options.BY_NAME.get(flag.removeprefix("--").replace("-", "_"))
    return setting is not None and not setting.switch


def _mount_options(group: str) -> list[str]:
    """One `-o` group: shardfs's own settings and flags as options, the rest passed on to FUSE."""
    out, kept = [], []
    for word, value in parse_options([group]).items():
        setting, item = options.word_of(word), word if value is True else f"{word}={value}"
        if setting is not None and setting.switch == (value is True):
            out.append(setting.flag if value is True else f"{setting.flag}={value}")
        elif word == "debug" and value is True:  # libfuse's: every request on stderr; here in the log, at DEBUG
            out.append("--log-level=DEBUG")
            kept.append(item)
        elif not options.dropped(word):
            kept.append(item)
    return [*out, *(["-o", ",".join(kept)] if kept else [])]


def main(argv: list[str] | None = None) -> int:
    p, commands = parser()
    try:
        args = p.parse_args(mount_argv(sys.argv[1:] if argv is None else argv, commands))
    except ValueError as e:
        p.error(redact(str(e)))
    log_to_terminal(args.__dict__.get("log_level") or ("INFO" if args.__dict__.get("foreground") else "WARNING"))
    context = Context()  # of the one source a command reads or mounts
    if args.command in ("info", "check"):  # their report on stdout says the source's warnings: once is enough
        logging.getLogger("shardfs").addFilter(lambda record: not getattr(record, "in_report", False))
    try:
        if args.command == "unmount":
            unmount(args.mountpoint.absolute(), args.any_type, args.lazy)
            return 0
        if args.command == "csi":
            return csi.run(args)
        if args.command == "list":
            list_mounts(time.time())
            return 0
        if args.command == "stats":
            text = stats_socket.read(args.mountpoint.absolute())
            print(text if args.prometheus else summary(text, time.time()), end="")
            return 0
        if ignored := remote_only(args):
            say(f"{', '.join(ignored)}: for remote sources only; ignored for {args.source}")
        reading = reading_of(args)
        disk = DiskCache(Path(reading.cache_dir), reading.cache_dir_size) if reading.cache_dir else None
        if args.command == "mount":
            return mount_source(spec_of(args, reading), args.mountpoint, disk, context)
        source = MountSpec(args.source, reading).open_source(context, disk)
        if args.command == "ls":
            ls(source, args.path.strip("/"), args.long)
        elif args.command == "cat":
            cat(source, args.path.strip("/"))
        elif args.command == "check" and source.collection is not None:
            within = str(args.source).rstrip("/")
            return check_each(
                source, lambda dataset: MountSpec(f"{within}/{dataset}", reading).open_source(context, disk),
                sys.stderr.isatty(), args.deep,
            )  # fmt: skip
        elif args.command == "check":
            return check(source, progress=sys.stderr.isatty(), deep=args.deep)
        else:
            info(source)
    except (SourceError, MountError, CorruptChunk, ServiceError, LogFileError, CacheDirRefused) as e:
        too_large = isinstance(e, CorruptChunk) and over_max_file_size(e, args.max_file_size)
        say(too_large or str(e))
        return 2 if isinstance(e, (SourceError, UsageError, CacheDirRefused)) else 1
    except FileNotFoundError as e:
        path = args.__dict__.get("path")  # ls and cat name it whole, not the last component the tree tried
        say(f"{e.filename or e}: no such file" if path is None else f"{path}: not in the virtual tree of {args.source}")
        return 1
    except IsADirectoryError as e:
        say(f"{e}: a directory; `shardfs ls` lists it")
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt as e:  # its text: what a detached daemon stopped by it left waiting (daemon.mount)
        say(str(e) or context.waiting.said() or "stopping")
        return 130  # as a shell reports a command ended by SIGINT
    except Exception as e:  # a source shaped in a way no check foresaw: one line, not a traceback
        logging.getLogger("shardfs").debug("unexpected error", exc_info=True)
        say(f"{args.__dict__.get('source', '')}: cannot be read ({type(e).__name__}: {e})")
        return 2
    return 0


def run() -> NoReturn:
    """The command line's entry point: main(), then an exit that skips the interpreter's finalization. A
    remote source leaves obstore's Rust runtime threads behind, and one of them still busy while Python
    tears itself down can panic and abort the process (SIGABRT after the command's last line, seen after
    a refused S3 listing): nothing of ours is left to finalize once output and logs are flushed."""
    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def say(error: str) -> None:
    """An error or a warning, one line on stderr, without the secrets a source URL or a library's message may hold."""
    print(f"shardfs: {redact(error)}", file=sys.stderr)


def remote_only(args: argparse.Namespace) -> list[str]:
    """The remote sources' options given with a local source, where they would change nothing."""
    if is_remote(args.source):
        return []
    return [s.flag for s in options.SETTINGS if s.remote_only and getattr(args, s.name) != s.initial()]


def reading_of(args: argparse.Namespace) -> Reading:
    """How a command reads its source, from its flags (`check` reads the source's own format)."""
    access = Access(
        anonymous=args.anonymous, endpoint=args.endpoint, region=args.region, timeout=args.timeout,
        profile=args.profile, requester_pays=args.requester_pays,
    )  # fmt: skip
    return Reading(
        view="native" if args.command == "check" else args.view, cache_size=args.cache_size,
        max_file_size=args.max_file_size, access=access,
        cache_dir=str(args.cache_dir.absolute()) if args.cache_dir else None, cache_dir_size=args.cache_dir_size,
    )  # fmt: skip


def spec_of(args: argparse.Namespace, reading: Reading) -> MountSpec:
    """What `shardfs mount` asks for, read once from its flags and `-o` options."""
    extra = parse_options(args.options)
    keeper = extra.pop("keeper", None)  # where the connection waits between daemons: the service's, not FUSE's
    if args.allow_other:
        extra["allow_other"] = True
    service = Service(
        log_level=args.log_level, log_file=str(args.log_file.absolute()) if args.log_file else None,
        metrics=args.metrics, foreground=args.foreground, allow_non_empty=args.allow_non_empty, keeper=keeper,
    )  # fmt: skip
    spec = MountSpec(args.source, reading, service=service)
    remote = is_remote(args.source)
    return replace(spec, options=fuse_options(spec.name, extra, remote))


def mount_source(spec: MountSpec, mountpoint: Path, disk: DiskCache | None, context: Context) -> int:
    """A local source is opened here, so a refusal comes before anything else; a remote one by the daemon
    (see daemon.mount), once the mountpoint passed its checks."""
    source = None if is_remote(spec.source) else spec.open_source(context, disk)
    try:
        target = target_of(mountpoint.absolute())
    except FuseMountError as e:
        raise UsageError(str(e)) from None
    handed_over = mount(spec, target, context, source, disk)
    return HANDED_OVER if handed_over else 0  # systemd restarts the unit on this status (RestartForceExitStatus=)


def list_mounts(now: float) -> None:
    """One line a shardfs mount, from the kernel's mount table; view, pid and uptime from its daemon's stats
    socket ('-' where it cannot be asked: another user's private mount, or a daemon that died). A mount that
    no daemon serves but whose connection is kept (systemd's store, a keeper) is `daemon being replaced`. The
    daemons are asked at once: each stopped one costs ASK_TIMEOUT, and that only once in all."""
    mounts = mountinfo.shardfs_mounts()
    with ThreadPoolExecutor(max_workers=max(1, min(len(mounts), 32))) as pool:
        rows = [("MOUNTPOINT", "SOURCE", "VIEW", "PID", "UPTIME"), *pool.map(lambda m: _listed(*m, now), mounts)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[4])


def _listed(point: str, mounted: mountinfo.Mounted, now: float) -> tuple[str, str, str, str, str]:
    try:
        pid, text = stats_socket.ask(Path(point))
        view, uptime = identity(text, now)
        return point, mounted.source, view, str(pid), uptime
    except stats_socket.NoDaemon:
        return point, mounted.source, "-", "-", "daemon being replaced" if waits_for_daemon(Path(point)) else "-"
    except (ServiceError, OSError):
        return point, mounted.source, "-", "-", "-"


def ls(source: Source, path: str, long: bool = False) -> None:
    """Names, directories ending in '/'; with long, each file's size first (`-` for a directory), as the
    mount's `ls -l` shows it."""
    node = source.tree.lookup(path)
    if not isinstance(node, Dir):
        print(f"{node.size():>12} {path}" if long else path)
        return
    for name, is_dir in source.tree.listdir(path):
        if long:
            child = source.tree.lookup(f"{path}/{name}" if path else name)
            size = "-" if isinstance(child, Dir) else str(child.size())
            sys.stdout.write(f"{size:>12} {name}{'/' if is_dir else ''}\n")
        else:
            sys.stdout.write(f"{name}/\n" if is_dir else f"{name}\n")


def cat(source: Source, path: str) -> None:
    node = source.tree.lookup(path)
    if isinstance(node, Dir):
        raise IsADirectoryError(path)
    size, block = node.size(), 1 << 20
    for offset in range(0, size, block):
        sys.stdout.buffer.write(node.read(offset, block))
    sys.stdout.flush()


def info(source: Source) -> None:
    print(f"source: {source.name}")
    for found in sorted(source.report, key=lambda found: (found.category, str(found))):
        print(f"  {found}")
    if source.collection is not None:
        found = broken = 0
        for dataset, what in source.collection.datasets():
            broken += isinstance(what, SourceError)
            found += isinstance(what, str)
            if found + broken <= SHOWN:
                print(f"{dataset}/: {what}" if isinstance(what, str) else f"{dataset}/: shown as plain files: {what}")
        more = f" ({found + broken - SHOWN} not shown)" if found + broken > SHOWN else ""
        cannot = f" and {broken} that cannot be opened (shown as plain files)" if broken else ""
        print(f"{plural(found, 'dataset')} found{cannot}{more}, looking through {LOOKED} directories at most")
    for directory, provider in sorted(source.providers.items()):
        print(f"{directory or '.'}/: {provider.kind}")
        for key, value in provider.describe().items():
            print(f"  {key}: {value}")
