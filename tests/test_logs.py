"""The log's rate limit, on its own with a clock the test moves: a burst per (level, event) and window,
then silence, then a line that says how many were dropped."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfs.logs import Logfmt, RateLimit, _value, log_to, ours_or_warning, redact


def record(level: int, event: str) -> logging.LogRecord:
    made = logging.LogRecord("shardfs", level, __file__, 1, "corrupt %s", ("chunk",), None, func="read")
    made.event = event
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


def test_what_the_operator_asked_for_is_never_dropped() -> None:
    limit = RateLimit(burst=1, window=10, clock=lambda: 0.0)
    assert all(limit.filter(record(level, "read")) for level in (logging.DEBUG, logging.INFO) for _ in range(100))


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
