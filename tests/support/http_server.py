"""A loopback web server for remote-source tests: files under a directory, served with Range, ETag and
Last-Modified as object stores and CDNs serve them, with latency, request counts and scripted failures.
With a bucket directory under its root it is also what obstore's GCSStore asks of GCS: objects at
`/{bucket}/{key}` (the key percent-encoded) and ListObjectsV2 XML listings at `/{bucket}?list-type=2`,
which is also what obstore's S3Store asks of a path-style endpoint."""

from __future__ import annotations

import contextlib
import email.utils
import gzip
import hashlib
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape


class RangeServer:
    """Serves root at `url`. `fail[path] = [503, 429, ...]` answers those statuses first, in order, then the file;
    `always` answers every request with that status; `hang` makes every request wait (bounded) before answering;
    `latency` delays every answer (`release` answers those waiting it out now). `requests` counts (method, path),
    `most_in_flight` the most answered at once; `authorizations` holds every request's Authorization header (None when
    unsigned), and a request whose header `admit` refuses is answered 403, as a private bucket answers. Suffix ranges
    (`bytes=-N`) are ignored (the whole object is sent), as some servers do, unless `suffix_ranges`. `ranges` records
    every GET's Range header. `endless_listing` answers every listing with "more to come" (IsTruncated, a
    NextContinuationToken) forever: "objects", each page a thousand new made-up keys, or "empty", each page none;
    `lists` counts listing requests.

    Servers that break the rules, as some do: `etag` / `last_modified` False leave that header out (and
    `weak_etags` sends weak ones, `W/"…"`, which If-Match never matches, as RFC 9110 has it);
    `preconditions` False ignores If-Match and If-Unmodified-Since; `extra` bytes follow a range's body
    (Content-Range still names the range asked; they are made as they are sent, never held), or so many
    are missing from its end when negative; `gzip` compresses a range's body and says so (Content-Encoding:
    gzip). `content_encoding` is sent with the stored bytes as they are, as S3 does for an object stored
    with that Content-Encoding."""

    def __init__(self, root: Path, latency: float = 0.0, suffix_ranges: bool = False) -> None:
        self.root = root
        self.latency = latency
        self.suffix_ranges = suffix_ranges
        self.fail: dict[str, list[int]] = {}
        self.always: int | None = None
        self.hang = False
        self.etag = True
        self.weak_etags = False
        self.last_modified = True
        self.preconditions = True
        self.extra = 0
        self.gzip = False
        self.content_encoding: str | None = None
        self.ranges: list[str | None] = []
        self.endless_listing: str | None = None
        self.lists = 0
        self.requests: Counter[tuple[str, str]] = Counter()
        self.authorizations: list[str | None] = []
        self.headers: list[dict[str, str]] = []  # every request's headers, names in lower case
        self.admit: Callable[[str | None], bool] | None = None
        self.in_flight = 0
        self.most_in_flight = 0  # the most requests answered at once so far
        self.lock = threading.Lock()
        self._released = threading.Event()  # set by `release`: the requests waiting out `latency` answer now
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def gets(self, suffix: str = "", prefix: str = "") -> int:
        """GETs so far of paths starting with prefix and ending with suffix."""
        with self.lock:
            return sum(
                n
                for (method, path), n in self.requests.items()
                if method == "GET" and path.startswith(prefix) and path.endswith(suffix)
            )

    def release(self) -> None:
        """Every request waiting out `latency` now is answered at once."""
        released, self._released = self._released, threading.Event()
        released.set()

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        """One request being answered, for `in_flight` and `most_in_flight`."""
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self.lock:
                self.in_flight -= 1

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body leave in two writes: with Nagle's algorithm the body would wait for the
            # client's delayed ACK of the headers (40 ms on Linux), as no real web server makes it wait.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                with server.counted():
                    self._answer(body=False)

            def do_GET(self) -> None:
                with server.counted():
                    self._answer(body=True)

            def _answer(self, body: bool) -> None:
                url = urlsplit(self.path)
                path = unquote(url.path).lstrip("/")
                with server.lock:
                    server.requests[(self.command, path)] += 1
                    server.authorizations.append(self.headers.get("Authorization"))
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    scripted = server.fail.get(path)
                    status = scripted.pop(0) if scripted else server.always
                if server.hang:
                    time.sleep(30)  # longer than any test's --timeout; the test's server is shut down after
                if server.latency:
                    server._released.wait(server.latency)
                if status is not None:
                    return self._status(status)
                if server.admit is not None and not server.admit(self.headers.get("Authorization")):
                    return self._status(403)
                if ".." in path.split("/"):
                    return self._status(404)
                query = parse_qs(url.query)
                if query.get("list-type") == ["2"]:
                    with server.lock:
                        server.lists += 1
                    if server.endless_listing:
                        return self._endless(path, query.get("prefix", [""])[0])
                    after = query.get("start-after", [""])[0]
                    return self._list(path, query.get("prefix", [""])[0], "delimiter" in query, after)
                file = server.root / path
                if not file.is_file():
                    return self._status(404)
                st = file.stat()
                etag = ("W/" if server.weak_etags else "") + _etag(st)
                if server.preconditions and not _preconditions_hold(self.headers, etag, st.st_mtime):
                    return self._status(412)
                if self.command == "GET":
                    with server.lock:
                        server.ranges.append(self.headers.get("Range"))
                start, stop = 0, st.st_size
                ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                suffix = re.fullmatch(r"bytes=-(\d+)", self.headers.get("Range", ""))
                if suffix and server.suffix_ranges:
                    start = max(st.st_size - int(suffix.group(1)), 0)
                    ranged = suffix
                elif ranged:
                    start = int(ranged.group(1))
                    stop = min(int(ranged.group(2)) + 1 if ranged.group(2) else st.st_size, st.st_size)
                    if start >= st.st_size:
                        return self._status(416)
                data = b""  # a HEAD reads nothing (a sparse 256 GiB object is HEADed too), unless gzip sizes it
                if body or (ranged and server.gzip):
                    with file.open("rb") as f:
                        f.seek(start)
                        data = f.read(stop - start)
                length = stop - start
                extra = max(server.extra, -length) if ranged else 0
                if ranged and server.gzip:
                    data = gzip.compress(data)
                    length = len(data)
                self.send_response(206 if ranged else 200)
                if ranged:
                    self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{st.st_size}")
                if encoding := "gzip" if ranged and server.gzip else server.content_encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Content-Length", str(length + extra))
                self.send_header("Accept-Ranges", "bytes")
                if server.etag:
                    self.send_header("ETag", etag)
                if server.last_modified:
                    self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
                self.end_headers()
                if body:
                    self.wfile.write(data[: len(data) + min(extra, 0)])
                    with contextlib.suppress(OSError):  # the client may stop reading: that is the point
                        for piece in _zeros(extra):
                            self.wfile.write(piece)

            def _list(self, bucket: str, prefix: str, delimited: bool, after: str = "") -> None:
                """One page: delimited by '/', the objects and sub-prefixes directly under prefix; else every
                object below it, in order, those after `after` (start-after). (Prefixes are taken to end at a
                '/', as shardfs's do.)"""
                directory = server.root / bucket / prefix
                entries = []
                if directory.is_dir():
                    entries = sorted(
                        directory.iterdir() if delimited else (p for p in directory.rglob("*") if p.is_file()),
                        key=lambda p: f"{prefix}{p.relative_to(directory)}".encode(),
                    )
                rows = []
                for e in entries:
                    if f"{prefix}{e.relative_to(directory)}".encode() <= after.encode():
                        continue
                    key = escape(f"{prefix}{e.relative_to(directory)}")
                    if e.is_dir():
                        rows.append(f"<CommonPrefixes><Prefix>{key}/</Prefix></CommonPrefixes>")
                        continue
                    st = e.stat()
                    when = datetime.fromtimestamp(st.st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
                    rows.append(
                        f"<Contents><Key>{key}</Key><LastModified>{when}</LastModified>"
                        f"<ETag>{escape(_etag(st))}</ETag><Size>{st.st_size}</Size></Contents>"
                    )
                self._page(bucket, prefix, rows, None)

            def _endless(self, bucket: str, prefix: str) -> None:
                """A page that says more is to come, whatever was asked: new keys, or none."""
                with server.lock:
                    n = server.lists
                rows = []
                if server.endless_listing == "objects":
                    rows = [
                        f"<Contents><Key>{escape(prefix)}{n:09d}-{i:04d}</Key><LastModified>2024-01-01T00:00:00.000Z"
                        f"</LastModified><ETag>&quot;{n}-{i}&quot;</ETag><Size>1</Size></Contents>"
                        for i in range(1000)
                    ]
                self._page(bucket, prefix, rows, f"token-{n}")

            def _page(self, bucket: str, prefix: str, rows: list[str], more: str | None) -> None:
                """One ListObjectsV2 page of rows; more: the token of the next one, if there is one."""
                truncated = "<IsTruncated>false</IsTruncated>"
                if more is not None:
                    truncated = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{more}</NextContinuationToken>"
                body = (
                    f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>{escape(bucket)}</Name>'
                    f"<Prefix>{escape(prefix)}</Prefix><KeyCount>{len(rows)}</KeyCount>{truncated}"
                    + "".join(rows)
                    + "</ListBucketResult>"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _status(self, status: int) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler

    @contextlib.contextmanager
    def running(self) -> Iterator[RangeServer]:
        self._thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


class _Server(ThreadingHTTPServer):
    """A listen backlog for many clients connecting at once (the standard library's 5 drops the rest of a
    burst, and their connections wait a second for the retransmitted SYN)."""

    request_queue_size = 128

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-answer (a reader cancelled, a daemon killed) is what several tests do on
        purpose: not a traceback on the suite's output. Anything else still is one."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _preconditions_hold(headers: Message, etag: str, mtime: float) -> bool:
    """If-Match and If-Unmodified-Since as RFC 9110 has them: If-Match compares strongly (a weak tag never
    matches), a date is to the second, as Last-Modified is."""
    match = headers.get("If-Match")
    if match is not None and (match != etag or etag.startswith("W/")):
        return False
    since = headers.get("If-Unmodified-Since")
    return since is None or int(mtime) <= email.utils.parsedate_to_datetime(since).timestamp()


def _zeros(n: int, step: int = 1 << 20) -> Iterator[bytes]:
    """n zero bytes, a piece at a time."""
    piece = bytes(step)
    for at in range(0, n, step):
        yield piece[: min(step, n - at)]


def _etag(st: os.stat_result) -> str:
    return '"' + hashlib.md5(f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest() + '"'
