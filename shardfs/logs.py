"""The daemon's log: one logfmt line a record, `time= level= event= path= shard= key= msg=`, so that
grep, journald and log shippers can pick out every EIO of one shard without parsing prose.

Any user who can read the mount can make it log (corrupt chunks read again and again), so warnings and errors
are rate-limited per kind and per user: a burst, then a count of what was dropped on the next line let through.
The user is the one whose FUSE request the line is about, passed with it (`extra={"uid": ...}`, by the bridge
and the session, which hold the request; `uid=` on the line): one user's noise spends that user's budget, never
the one that lets another user's errors through. A line logged with no request at hand (deep in a store or a
shard's reading) is the daemon's own, on the daemon's budget. At DEBUG,
the daemon logs a line per FUSE request (`event=request op= path= bytes= store_reads= us= uid=`), limited the same
way with a larger burst; INFO lines (mounted, unmounted) always pass.

No secret reaches a log at any level. DEBUG and INFO records pass only from shardfs's own loggers: a
library's debug log prints what it sends and receives (botocore logs STS's whole AssumeRoleResponse, the
session's secret key and token in it), and no list of libraries keeps up with the next dependency. What
does pass is redacted of the shapes secrets come in (URL passwords, Authorization headers, AWS key and token
fields), and is written as one line whatever bytes it carries (names the kernel hands over need not be UTF-8).
The log file is created 0600, never through a link, and narrowed if it was wider."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from shardfs.errors import binary_size

OURS = "shardfs"  # the logger hierarchy whose DEBUG and INFO records are logged
# Passed as `extra=` by the calls that know them, written in this order.
FIELDS = ("event", "op", "path", "bytes", "errno", "store_reads", "us", "shard", "key", "suppressed", "uid")
_BARE = re.compile(r"[^\s\"=\\]+")


BURST = 20  # lines of one (level, event) let through per window
DEBUG_BURST = 1000  # DEBUG lines of one event (a request each) let through per window
WINDOW = 60.0  # seconds
# Budgets kept at most: one per (level, event, user). Past this many (root can make requests under any uid),
# the users beyond share one budget.
MAX_WINDOWS = 4096

_thread = threading.local()  # what a thread is for, set once as it starts (see own_thread)


def own_thread(mount: str | None) -> None:
    """This thread does one mount's work from now to its end (None: the process's own): a daemon that serves
    several mounts (host/daemon.py) names that mount on each line the thread logs. Not a request's state: a
    mount's threads (its session's, its listing workers, its read-ahead) serve that mount alone all their
    lives, whoever's requests they answer."""
    _thread.mount = mount


def thread_mount() -> str | None:
    """The mount this thread works for (own_thread), if it was given one."""
    return getattr(_thread, "mount", None)


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread running target, started for the mount this thread works for: it works for it too."""
    mount = thread_mount()

    def run() -> None:
        own_thread(mount)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _event(record: logging.LogRecord) -> str:
    return str(getattr(record, "event", record.funcName.strip("_")))


# Where a secret follows its name: `SecretAccessKey>v<`, `"SessionToken": "v"`, `aws_secret_access_key = v`,
# `X-Amz-Security-Token=v&`, `'x-amz-security-token': b'v'`; and a whole Authorization header's value.
_SECRET_NAMES = (
    r"secret[_-]?access[_-]?key|session[_-]?token|security[_-]?token|signature|password|private[_-]?key"
    r"|client[_-]?secret|access[_-]?token|refresh[_-]?token"
)
_NAMED_SECRET = re.compile(rf"(?i)((?:{_SECRET_NAMES})[\"']?\s*(?:[:=]\s*b?[\"']?|>))[^\"'<\s,;&]+")
_AUTHORIZATION = re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*b?[\"']?)[^\"'\n]+")


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s?#]+@")  # up to the authority's last '@'


def redact_userinfo(text: str) -> str:
    """text with the `user:password@` of every URL in it shown as `***@`."""
    return _USERINFO.sub(r"\1***@", text)


def redact(text: str) -> str:
    """text without the secrets of the shapes they are known to come in, each replaced by `***`."""
    text = _AUTHORIZATION.sub(r"\1***", text)
    return redact_userinfo(_NAMED_SECRET.sub(r"\1***", text))


def _value(value: object) -> str:
    """A bare word when it is one, else a JSON string of printable characters only: a control character or a
    byte that is not UTF-8 (a surrogate escape) is escaped, never written as it is."""
    text = redact(str(value))
    if _BARE.fullmatch(text) and text.isprintable():
        return text
    quoted = json.dumps(text, ensure_ascii=False)
    return quoted if quoted.isprintable() else "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in quoted)


class Logfmt(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        parts = [f"time={when.replace('+00:00', 'Z')}", f"level={record.levelname.lower()}"]
        parts.append(f"event={_value(_event(record))}")
        fields = ((name, getattr(record, name, None)) for name in FIELDS[1:])  # None: not known (a uid)
        parts += [f"{name}={_value(value)}" for name, value in fields if value is not None]
        parts.append(f"msg={_value(record.getMessage())}")
        if record.exc_info:
            parts.append(f"error={_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


class Plain(logging.Formatter):
    """`LEVEL: message` for a terminal (the CLI's commands), redacted as the log file is."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def ours_or_warning(record: logging.LogRecord) -> bool:
    """Whether a record is logged: shardfs's own at the level asked, any other library's only from WARNING."""
    return record.levelno >= logging.WARNING or record.name == OURS or record.name.startswith(f"{OURS}.")


@dataclass
class _Window:
    start: float
    count: int = 0
    suppressed: int = 0


class RateLimit(logging.Filter):
    """At most `burst` warnings or errors of one (level, event) per user (a record's `uid`) and mount (a record's
    `mount`, where one process serves several: the CSI daemon names it) per `window` seconds, so that one
    tenant's errors never silence another's, and `debug_burst` DEBUG lines (one a FUSE request: a reader can
    send thousands a second); the next one let through carries `suppressed=N`, the number dropped before it.
    INFO passes: the mount's few milestones."""

    def __init__(
        self, burst: int = BURST, window: float = WINDOW, clock: Callable[[], float] = time.monotonic,
        debug_burst: int = DEBUG_BURST,
    ) -> None:  # fmt: skip
        super().__init__()
        self.burst, self.window, self.clock, self.debug_burst = burst, window, clock, debug_burst
        self._windows: dict[tuple[int, str, int | None, str | None], _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.DEBUG < record.levelno < logging.WARNING:
            return True
        burst = self.burst if record.levelno >= logging.WARNING else self.debug_burst
        now = self.clock()
        uid = getattr(record, "uid", None)
        with self._lock:
            mount = getattr(record, "mount", None)
            key = (record.levelno, _event(record), uid, mount)
            if key not in self._windows and len(self._windows) >= MAX_WINDOWS:
                self._forget_ended(now)
                if len(self._windows) >= MAX_WINDOWS:
                    key = (record.levelno, _event(record), None, None)
            w = self._windows.setdefault(key, _Window(now))
            if now - w.start >= self.window:
                w.start, w.count = now, 0
            w.count += 1
            if w.count > burst:
                w.suppressed += 1
                return False
            if w.suppressed:
                record.suppressed, w.suppressed = w.suppressed, 0
        return True

    def _forget_ended(self, now: float) -> None:
        """Drop the budgets whose window has ended with nothing dropped: they would start afresh anyway."""
        ended = [k for k, w in self._windows.items() if now - w.start >= self.window and not w.suppressed]
        for key in ended:
            del self._windows[key]


class LogFileError(Exception):
    """The log file cannot be ours alone; the message names it and says why."""


def open_log(path: Path) -> int:
    """path opened for appending, created 0600, never through a link; a file of ours open to others is narrowed
    to 0600. One that another user owns is refused: what the daemon logs would be theirs to read."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        why = "is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise LogFileError(f"{path}: cannot be the log file: {why}") from None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):  # not a terminal, /dev/null or a pipe, whose modes are not the log's
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise LogFileError(f"{path}: cannot be the log file: another user owns it")
        if st.st_mode & 0o077:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o600)
    return fd


def _stream(fd: int) -> TextIO:
    """fd as text that never fails to encode: a surrogate escape is written as its backslash form."""
    return open(fd, "a", encoding="utf-8", errors="backslashreplace", buffering=1)


def _install(handler: logging.Handler, formatter: logging.Formatter, level: str | int | None = None) -> None:
    handler.setFormatter(formatter)
    handler.addFilter(ours_or_warning)
    root = logging.getLogger()
    if level is not None:
        root.setLevel(level)
    root.handlers[:] = [handler]


def log_to(log_file: Path | None, most: int | None = None) -> None:
    """The daemon's records go to log_file, or to stderr (which systemd sends to the journal), as logfmt. most:
    the most bytes the log may hold, if it is a file (a pipe or the journal bounds itself)."""
    stream = _stream(open_log(log_file)) if log_file else sys.stderr
    handler = logging.StreamHandler(stream) if most is None else _Capped(stream, most)
    handler.addFilter(RateLimit())
    _install(handler, Logfmt())


class _Capped(logging.StreamHandler):  # type: ignore[type-arg]
    """A log file that never grows past `most` bytes: once it would, it is emptied and begun again with a line
    saying so (a file nobody rotates, as a Slurm job's daemon writes, is read by the job's user meanwhile)."""

    def __init__(self, stream: TextIO, most: int) -> None:
        super().__init__(stream)
        self.most = most

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError, ValueError):
            fd = self.stream.fileno()
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size >= self.most:
                self.stream.flush()
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)  # a descriptor without O_APPEND would write on past a hole
                self.stream.write(f"(the log reached {binary_size(self.most)} and was begun again here)\n")
        super().emit(record)


class _Early(logging.Handler):
    """Warnings and errors the CLI logged before a daemon's log existed (a local source is planned before the
    daemon detaches), kept to be written there too: the log must hold what the terminal was told."""

    KEPT = 100

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < self.KEPT:
            self.records.append(record)


_early = _Early()


def log_to_terminal(level: str) -> None:
    """The CLI's records, from `level` up, go to stderr as `LEVEL: message` (and warnings are kept for
    replay_early)."""
    _install(logging.StreamHandler(sys.stderr), Plain(), level)
    logging.getLogger().addHandler(_early)


def replay_early() -> None:
    """Write the warnings kept by log_to_terminal through the handlers installed since (the daemon's log)."""
    records, _early.records = _early.records, []
    for record in records:
        logging.getLogger().handle(record)
