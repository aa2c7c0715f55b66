"""A reader killed while its read waits on a slow server: the kernel sends INTERRUPT, and the daemon answers that
request at once (EINTR), while its thread waits out the server and drops its answer. A killed process whose FUSE
request was read by the daemon waits, unkillable, for the daemon's answer: without this, it would wait for the
server. Meanwhile a spare thread serves in place of the waiting one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.support import peers
from tests.support.cli import scrape, shardfs
from tests.support.daemons import wait_until
from tests.support.http_server import RangeServer

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]

SLOW = 60.0  # seconds the server takes to answer: far longer than the test waits for anything
# A reader whose READ is a request it waits for itself: a buffered read's READs are the kernel's readahead, sent
# in the background and never interrupted (a killed reader stops waiting for them, the daemon does not); an
# O_DIRECT read waits for its READ, which a signal interrupts.
READER = (
    "import mmap, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT); os.readv(fd, [mmap.mmap(-1, 4096)])"
)


def counted(point: object, name: str, wanted: dict[str, str]) -> float:
    """The sum of `shardfs stats`' samples of name with those labels."""
    found = scrape(shardfs("stats", point, "--prometheus").stdout)
    return sum(v for (n, labels), v in found.items() if n.startswith(name) and wanted.items() <= dict(labels).items())


def answered_eintr(point: object) -> float:
    """Requests the mount answered EINTR."""
    return counted(point, "shardfs_errors", {"errno": "EINTR"})


def interrupted_gets(point: object) -> float:
    """Remote GETs whose answers the mount dropped because the kernel interrupted their request."""
    return counted(point, "shardfs_remote_requests", {"request": "get", "outcome": "interrupted"})


def test_a_killed_readers_request_is_answered_at_once_and_a_spare_thread_serves_meanwhile(tmp_path, mount) -> None:
    """Two session threads (`max_threads=2`: one waits for a read, the other reads the INTERRUPT), two chunks
    looked up (their indexes cached: a read is one GET of the chunk). A reader of the first blocks on a server
    that takes a minute; killed, it is gone within seconds, its request answered EINTR. A second slow reader then
    holds a second thread: a spare serves in place of the first's, and answers a `stat -f` at once. Killed too,
    the second reader's request is the second answered EINTR. Both GETs still wait on the server; once it
    answers, both are counted interrupted (their answers dropped), and the mount reads on."""
    source, twin = tmp_path / "vol", tmp_path / "twin"
    peers.write_tensorstore_volume(source, data_encoding="raw", unsharded_twin=twin, extra_unsharded_scale=False)
    first, second = sorted((twin / "4_4_40").iterdir())[:2]
    with RangeServer(source).running() as server:
        m = mount(server.url, "-o", "max_threads=2", "--timeout", str(4 * SLOW))
        for chunk in (first, second):
            assert (m.path / "4_4_40" / chunk.name).stat().st_size == chunk.stat().st_size
        # The server counts an answer out only after sending it: until then, in_flight would count it as a read's.
        wait_until(lambda: server.in_flight == 0, 30)
        server.latency = SLOW
        for n, chunk in enumerate((first, second), 1):
            reader = subprocess.Popen([sys.executable, "-c", READER, m.path / "4_4_40" / chunk.name])
            try:
                wait_until(lambda n=n: server.in_flight >= n, 30)  # the server still answers those before
                if n == 2:  # two threads wait for reads: the spare answers
                    subprocess.run(["stat", "-f", m.path], check=True, capture_output=True, timeout=SLOW / 4)
                killed = time.monotonic()
                reader.kill()
                assert reader.wait(timeout=SLOW / 4) == -signal.SIGKILL
            finally:
                reader.kill()
            assert time.monotonic() - killed < SLOW / 4
            wait_until(lambda n=n: answered_eintr(m.path) == n, 30)
        assert server.in_flight == 2
        assert interrupted_gets(m.path) == 0
        server.latency = 0
        server.release()
        wait_until(lambda: interrupted_gets(m.path) == 2, 30)
        done = subprocess.run(["cat", m.path / "4_4_40" / second.name], capture_output=True, timeout=SLOW / 4)
        assert done.stdout == second.read_bytes()
