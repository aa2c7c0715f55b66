"""A remote mount serves many readers at once: each waiting read holds one of the FUSE session's threads for
a network round trip, so a remote source is mounted with more threads than a local one's four (or libfuse's
ten). Counted where it shows, at a loopback server slower than the network: sixteen readers of sixteen chunks
have sixteen requests in flight together, more than ten."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support import peers
from tests.support.http_server import RangeServer
from tests.support.reading import forget_pages

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


LIBFUSE_DEFAULT_THREADS = 10
READERS = 16


class InFlight:
    """An `admit` hook that holds every request for a while and counts how many are held at once."""

    def __init__(self, hold: float) -> None:
        self.hold, self.now, self.most = hold, 0, 0
        self.lock = threading.Lock()

    def __call__(self, auth: str | None) -> bool:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.hold)
        with self.lock:
            self.now -= 1
        return True


def test_sixteen_remote_reads_are_in_flight_at_once(tmp_path, mount) -> None:
    source, twin = tmp_path / "vol", tmp_path / "twin"
    peers.write_tensorstore_volume(source, data_encoding="raw", unsharded_twin=twin, extra_unsharded_scale=False)
    expected = {p.name: p.read_bytes() for p in sorted((twin / "4_4_40").iterdir())[:READERS]}
    assert len(expected) == READERS
    with RangeServer(source).running() as server:
        m = mount(server.url)
        for name in expected:  # indexes fetched and cached: from now on a read is one GET of its chunk
            (m.path / "4_4_40" / name).read_bytes()
        forget_pages(*(m.path / "4_4_40" / name for name in expected))
        server.admit = held = InFlight(hold=1.5)
        with ThreadPoolExecutor(READERS) as pool:
            got = dict(zip(expected, pool.map(lambda n: (m.path / "4_4_40" / n).read_bytes(), expected), strict=True))
    assert got == expected
    assert held.most > LIBFUSE_DEFAULT_THREADS, f"at most {held.most} requests in flight at once"
