"""The benchmarks' Python no-op (`scripts/bench.py --serve-noop`) is shardfs's bridge and FUSE session over an
in-memory tree: it stands in for "shardfs if finding a chunk cost nothing", so it must keep mounting as the
bridge's interface changes, and serve the names and sizes it is given, through the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemons import wait_until

pytestmark = [pytest.mark.kernel]

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"


def test_the_python_noop_serves_its_listings_names_and_sizes_as_zeros(tmp_path: Path) -> None:
    sizes = {"1_1_1/0-8_0-8_0-8": 512, "1_1_1/8-16_0-8_0-8": 300, "2_2_2/0-16_0-16_0-16": 4096, "info": 0}
    listing, mountpoint, log = tmp_path / "listing", tmp_path / "m", tmp_path / "noop.log"
    listing.write_text("".join(f"{path} {size}\n" for path, size in sizes.items()))
    mountpoint.mkdir()
    with log.open("w") as stderr:
        served = subprocess.Popen([sys.executable, str(BENCH), "--serve-noop", str(listing), str(mountpoint)],
                                  stderr=stderr, start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: "event=mounted" in log.read_text() or served.poll() is not None)
        assert served.poll() is None, log.read_text()[-2000:]
        found = {
            os.path.relpath(os.path.join(at, name), mountpoint): os.path.getsize(os.path.join(at, name))
            for at, _, names in os.walk(mountpoint)
            for name in names
        }
        assert found == sizes
        assert all((mountpoint / path).read_bytes() == bytes(size) for path, size in sizes.items())
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        served.wait(timeout=30)
    assert served.returncode == 0, log.read_text()[-2000:]
