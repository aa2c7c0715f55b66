"""Object stores on loopback: moto's S3 (and STS) server, a bucket filled as a writer uploads, a free port, and
the requests tests/support/http_server.py's RangeServer counted."""

from __future__ import annotations

import contextlib
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from moto.server import ThreadedMotoServer

from tests.support.http_server import RangeServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BUCKET = "data"


def upload(client: Any, local: Path, prefix: str) -> None:
    """Every file under local, as it is, to s3://BUCKET/prefix/…, readable by anyone (for --anonymous)."""
    for path in local.rglob("*"):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(local)}"
            client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes(), ACL="public-read")


def counted(server: RangeServer) -> Counter[str]:
    """Requests so far, by method."""
    after: Counter[str] = Counter()
    with server.lock:
        for (method, _), n in server.requests.items():
            after[method] += n
    return after


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's server (S3, STS and the rest of AWS as moto plays it) on a free loopback port, in this process,
    for the block's length; its endpoint."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
