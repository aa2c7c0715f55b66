"""The daemon's memory stays within its budget: --cache-size plus a fixed overhead, whatever it has listed and read.

Memory is not time: a loaded machine makes a daemon slower, not larger, so these bounds hold under any load
(scripts/bench_memory.py gives the figures on larger volumes and two cache sizes)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.support import peers
from tests.support.daemons import cache_held, daemon_of

pytestmark = [pytest.mark.kernel]


OVERHEAD_MIB = 40  # the README's promise beyond --cache-size (the interpreter, its libraries, the threads)


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """The volume of issue 32: uint8 400³ in 8³ chunks, 125,000 of them in one directory, gzip, identity hash,
    8 shards, written by tensorstore."""
    root = tmp_path_factory.mktemp("vol") / "src"
    sharding = peers.sharding_spec(hash="identity", preshift_bits=9, minishard_bits=6, shard_bits=3)
    return root, peers.write_tensorstore_scale(root, 400, 8, sharding)


def status_kib(pid: int, field: str) -> int:
    """A figure of /proc/PID/status, in KiB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status[field].split()[0])


def peak_mib(pid: int) -> int:
    """The process's peak resident memory over its life (VmHWM)."""
    return status_kib(pid, "VmHWM") >> 10


def test_listing_125000_chunks_grows_the_daemon_by_what_its_cache_counts(volume, mount) -> None:
    """A listing is kept, counted, in the cache; while it is made its names are held packed, so the daemon's
    own memory (anonymous: libraries' code paged in on first use is not the daemon's growth) grows by what the
    cache holds and a few MiB. When each name was gathered as a bytes object the daemon kept 9.5 MiB beyond
    its cache: the allocator could not give back memory freed among objects that lived on."""
    m = mount(volume[0])
    pid = daemon_of(m.path).pid
    before = status_kib(pid, "RssAnon") << 10
    assert len(os.listdir(m.path / "s0")) == 125_000
    grown = (status_kib(pid, "RssAnon") << 10) - before
    held = cache_held(m.path)
    assert grown <= held + (4 << 20), f"grew {grown >> 10} KiB, the cache holds {held >> 10} KiB"


def test_listing_and_reading_125000_chunks_stays_within_the_cache_size_and_40_mib(volume, mount) -> None:
    """`ls -l` of 125,000 chunks then a read of every one, through the kernel: the daemon's peak memory stays
    within the default --cache-size (64 MiB) + 40 MiB (it was 184 MiB when a looked-up chunk node cost twice
    what the cache counted). Every byte read is the voxels tensorstore wrote."""
    source, data = volume
    m = mount(source)
    pid = daemon_of(m.path).pid
    scale = m.path / "s0"
    listed = [(entry.path, entry.stat().st_size) for entry in os.scandir(scale)]
    assert len(listed) == 125_000 and {size for _, size in listed} == {512}
    for path, _ in listed:
        (x0, x1), (y0, y1), (z0, z1) = (map(int, bounds.split("-")) for bounds in Path(path).name.split("_"))
        assert Path(path).read_bytes() == data[x0:x1, y0:y1, z0:z1, 0].tobytes(order="F"), path
    peak = peak_mib(pid)
    assert peak <= 64 + OVERHEAD_MIB, f"peak {peak} MiB"
