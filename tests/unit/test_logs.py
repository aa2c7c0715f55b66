"""The log's rate limit, on its own with a clock the test moves: a burst per (level, event) and window,
then silence, then a line that says how many were dropped. A mount's log through the kernel: at DEBUG one
line per request and nothing else, within the limit; the mount's INFO line on `mount -f`'s terminal."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shardfs import logs
from shardfs.logs import DEBUG_BURST, Logfmt, RateLimit, _value, log_to, ours_or_warning, redact
from tests.support.cli import SHARDFS
from tests.support.daemons import wait_until


def record(level: int, event: str, uid: int | None = None) -> logging.LogRecord:
    """A record as a log call makes it, with extra={"event": event, "uid": uid}."""
    made = logging.LogRecord("shardfs", level, __file__, 1, "corrupt %s", ("chunk",), None, func="read")
    made.event, made.uid = event, uid
    return made


def test_burst_then_silence_then_the_count_of_what_was_dropped() -> None:
    now = [0.0]
    limit = RateLimit(burst=3, window=10, clock=lambda: now[0])
    passed = [limit.filter(record(logging.ERROR, "eio")) for _ in range(1000)]
    assert passed == [True] * 3 + [False] * 997
    assert limit.filter(record(logging.ERROR, "bug"))  # another event has its own budget
    assert limit.filter(record(logging.WARNING, "eio"))  # and so has another level
    now[0] = 9.9
    assert not limit.filter(record(logging.ERROR, "eio"))
    now[0] = 10.0  # a new window
    first = record(logging.ERROR, "eio")
    assert limit.filter(first)
    assert first.suppressed == 998
    assert "level=error event=eio suppressed=998 msg=" in Logfmt().format(first)
    second = record(logging.ERROR, "eio")
    assert limit.filter(second) and not hasattr(second, "suppressed")  # counted once


def test_every_window_restarts_the_budget_at_its_end_and_not_a_tick_before() -> None:
    """A user silenced in one window is heard again in the next, and in each one after: a window starts with the
    first line at or after the last one's end and lasts `window` seconds, the line one tick before its end
    dropped, the one at its end let through with the count dropped before it."""
    now = [0.0]
    limit = RateLimit(burst=2, window=10, clock=lambda: now[0])
    start = 0.0
    for later in (0.0, 0.5, 0.0, 15.0):  # how long after the last window's end the next line comes
        now[0] = start
        first = record(logging.ERROR, "eio")
        assert [limit.filter(first), *(limit.filter(record(logging.ERROR, "eio")) for _ in range(2))] == [
            True, True, False
        ]  # fmt: skip
        assert getattr(first, "suppressed", 0) == (0 if start == 0 else 2), start
        now[0] = start + 10 - 1e-6
        assert not limit.filter(record(logging.ERROR, "eio")), start
        start += 10 + later


def test_each_user_has_a_budget_of_their_own_and_budgets_are_bounded(monkeypatch) -> None:
    """The user whose request a line is about (its `uid`, passed by whoever holds the request) has a budget of
    their own: another user's burst leaves it whole, and the line names them. Past MAX_WINDOWS budgets, the
    users beyond share one, until a window ends and frees those that dropped nothing."""
    now = [0.0]
    limit = RateLimit(burst=2, window=10, clock=lambda: now[0])
    assert [limit.filter(record(logging.ERROR, "eio", 1000)) for _ in range(5)] == [True, True, False, False, False]
    mine = record(logging.ERROR, "eio", 0)
    assert limit.filter(mine) and " uid=0 msg=" in Logfmt().format(mine)
    own = record(logging.ERROR, "eio")  # the daemon's own work: a budget of its own, no uid named
    assert limit.filter(own) and "uid=" not in Logfmt().format(own)
    monkeypatch.setattr(logs, "MAX_WINDOWS", 5)
    for uid in (1, 2):
        assert limit.filter(record(logging.ERROR, "eio", uid))
    # a sixth budget: shares the daemon's, which has one line left
    assert [limit.filter(record(logging.ERROR, "eio", 3)) for _ in range(2)] == [True, False]
    now[0] = 10.0  # the window ended: budgets that dropped nothing are let go, and 3 gets its own
    assert [limit.filter(record(logging.ERROR, "eio", 3)) for _ in range(3)] == [True, True, False]
    assert len(limit._windows) <= 5


def test_info_is_never_dropped_and_debug_has_a_burst_of_its_own() -> None:
    limit = RateLimit(burst=1, window=10, clock=lambda: 0.0, debug_burst=5)
    assert all(limit.filter(record(logging.INFO, "mounted")) for _ in range(100))
    assert [limit.filter(record(logging.DEBUG, "request")) for _ in range(100)] == [True] * 5 + [False] * 95


# What botocore, urllib3 and the rest print at DEBUG, and what a user may paste: no value may survive.
SECRET_SHAPES = [
    "Response body:\nb'<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>ASIAX</AccessKeyId>"
    "<SecretAccessKey>SECRET1</SecretAccessKey><SessionToken>SECRET2</SessionToken></Credentials>'",
    "Sending http request: <AWSPreparedRequest headers={'x-amz-security-token': b'SECRET3', 'Authorization': "
    "b'AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=SECRET4'}>",
    '{"Credentials": {"SecretAccessKey": "SECRET5", "SessionToken": "SECRET6"}, "access_token": "SECRET7"}',
    "GET https://b.s3.amazonaws.com/k?X-Amz-Security-Token=SECRET8&X-Amz-Signature=SECRET9&X-Amz-Date=1",
    "[base]\naws_secret_access_key = SECRET10\naws_session_token=SECRET11\n",
    "Authorization: Basic SECRET12\nx-amz-security-token: SECRET13",
    "error sending request for url (https://reader:SECRET14@host/ds/info) and ftp://SECRET15@h",
]


@pytest.mark.parametrize("text", SECRET_SHAPES)
def test_known_secret_shapes_are_redacted(text: str) -> None:
    shown = redact(text)
    assert "SECRET" not in shown and "***" in shown, shown
    assert "SECRET" not in _value(text)


def test_other_libraries_log_only_warnings_and_errors() -> None:
    def passes(name: str, level: int) -> bool:
        return ours_or_warning(logging.LogRecord(name, level, __file__, 1, "m", (), None))

    assert all(passes(name, logging.DEBUG) for name in ("shardfs", "shardfs.stores.remote"))
    for name in ("botocore.parsers", "urllib3.connectionpool", "fuse", "shardfsx", "root"):
        assert not passes(name, logging.DEBUG) and not passes(name, logging.INFO), name
        assert passes(name, logging.WARNING) and passes(name, logging.ERROR), name


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, given back as it was (pytest's own handlers on it)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_every_record_is_one_logfmt_line_whatever_it_carries(root_logger, tmp_path: Path) -> None:
    """Names the kernel hands over need not be UTF-8 (surrogate escapes) and may hold control characters."""
    log = tmp_path / "log"
    log_to(log)
    root_logger.setLevel(logging.DEBUG)
    names = ["\udcff\udcfe", "a\x01b", "x\ny", "\x1b[2J", "caf\u00e9", "\u2028", "\ud83d"]
    for name in names:
        logging.getLogger("shardfs").error("lookup of %s failed", name, extra={"event": "eio", "path": name})
    lines = log.read_bytes().decode().split("\n")
    assert lines.pop() == "" and len(lines) == len(names), lines
    for line, name in zip(lines, names, strict=True):
        assert line.startswith("time=") and line.isprintable(), line
        assert f"path={json.dumps(name)}" in line or f"path={name}" in line, line


REQUEST = re.compile(
    r"level=debug event=request op=(\w+) path=(\S+) (?:bytes=(\d+) )?(?:errno=(\w+) )?store_reads=(\d+) us=(\d+) "
)


def requests(log: str) -> list[tuple[str, ...]]:
    """(op, path, bytes, errno, store_reads, us) of each request line."""
    return [m.groups() for m in map(REQUEST.search, log.splitlines()) if m]


@pytest.mark.kernel
def test_debug_logs_a_line_per_request_and_nothing_else(raw_volume: tuple[Path, Path, np.ndarray], mount) -> None:
    """A read, a listing and a missing name at DEBUG: each request is one logfmt line with its op, path, bytes
    or errno, store reads and microseconds; every other line is the mount's own (no library's records)."""
    source, twin, _ = raw_volume
    m = mount(source, "--log-level", "DEBUG")
    name = sorted(p.name for p in (twin / "4_4_40").iterdir())[0]
    size = len((m.path / "4_4_40" / name).read_bytes())
    os.listdir(m.path / "4_4_40")
    assert not (m.path / "nope").exists()
    seen = requests(m.log_text())
    read = next(r for r in seen if r[:2] == ("read", f"/4_4_40/{name}"))
    assert read[2] == str(size) and int(read[4]) >= 1 and int(read[5]) > 0, read
    assert next(r for r in seen if r[1] == "/nope")[:4] == ("lookup", "/nope", None, "ENOENT")
    assert {"opendir", "readdir"} <= {r[0] for r in seen if r[1] == "/4_4_40"}
    lines = m.log_text().splitlines()
    assert all(line.startswith("time=") for line in lines), lines
    events = {re.search(r" event=(\S+)", line)[1] for line in lines}
    assert events == {"mounted", "request"}, events


@pytest.mark.kernel
def test_a_flood_of_requests_logs_no_more_than_the_limit(raw_volume: tuple[Path, Path, np.ndarray], mount) -> None:
    """More lookups of missing names than the DEBUG burst, within the window: that many lines, no more."""
    m = mount(raw_volume[0], "--log-level", "DEBUG")
    for i in range(DEBUG_BURST + 300):
        os.path.lexists(m.path / f"missing-{i}")
    assert len(requests(m.log_text())) == DEBUG_BURST


@pytest.mark.kernel
def test_mount_f_shows_the_mount_line_on_the_terminal(raw_volume: tuple[Path, Path, np.ndarray], tmp_path) -> None:
    """One INFO line: source, mountpoint, view and what the kernel granted, on `-f`'s stderr by default."""
    point = tmp_path / "m"
    point.mkdir()
    command = [*SHARDFS, "mount", "-f", str(raw_volume[0]), str(point), "--view", "n5"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: os.path.ismount(point))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        mounted = [line for line in proc.stderr.read().splitlines() if "event=mounted" in line]
        assert len(mounted) == 1, mounted
        assert f"mounted {raw_volume[0]} at {point}, view n5; FUSE 7." in mounted[0], mounted
        assert "level=info" in mounted[0] and "granted ASYNC_READ|PARALLEL_DIROPS|MAX_PAGES" in mounted[0]
    finally:
        proc.kill()


def test_each_volume_of_a_shared_daemon_has_a_budget_of_its_own() -> None:
    """The CSI daemon serves several tenants' volumes: a thread's volume (the mount it works for, set when it
    started, named by host.daemon's filter, which runs first) has budgets of its own, so one volume's burst of
    errors never silences another's first lines."""
    from shardfs.host.daemon import _Naming

    naming, limit = _Naming(), RateLimit(burst=2, window=10, clock=lambda: 0.0)

    def logged(target: str) -> tuple[bool, str]:
        made: list[tuple[bool, str]] = []

        def log() -> None:  # in a thread the volume's own thread starts, as its session's are
            record_ = record(logging.ERROR, "eio")
            naming.filter(record_)
            made.append((limit.filter(record_), record_.getMessage()))

        def volume() -> None:
            logs.own_thread(target)
            logs.start_thread(log, "fuse-0").join()

        thread = threading.Thread(target=volume)
        thread.start()
        thread.join()
        return made[0]

    assert [logged("/pods/a")[0] for _ in range(5)] == [True, True, False, False, False]
    assert [logged("/pods/b") for _ in range(2)] == [(True, "/pods/b: corrupt chunk")] * 2


def test_a_log_file_of_its_own_stays_under_its_bound(tmp_path: Path) -> None:
    """A daemon whose log no one rotates (a Slurm job's) keeps it under `most` bytes: emptied and begun again,
    saying so, once it would grow past."""
    path = tmp_path / "job.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    stream = open(fd, "a", buffering=1)  # noqa: SIM115 (the handler's, closed below)
    handler = logs._Capped(stream, 4096)
    handler.setFormatter(Logfmt())
    try:
        for i in range(2000):
            made = record(logging.WARNING, "eio")
            made.msg, made.args = "line %d", (i,)
            handler.emit(made)
            assert path.stat().st_size < 4096 + 200
        text = path.read_text()
        assert text.startswith("(the log reached 4.0 KiB and was begun again here)") and "line 1999" in text
    finally:
        stream.close()
