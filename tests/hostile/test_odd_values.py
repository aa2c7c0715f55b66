"""Odd values through the mount (issue 33, class 5): fill values that are not finite numbers (NaN, +Infinity,
-Infinity, and -0.0, which equals 0 but is not its bytes) through `--view zarr2` and `--view n5`, read by
tensorstore and compared bit for bit with the source as zarr-python reads it; and `df` over a source holding
links, a FIFO, a socket and a device beside its files, each of which it must neither follow nor count."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.support import peers
from tests.support.daemons import wait_until
from tests.support.reading import ts_read

pytestmark = [pytest.mark.kernel]


FILLS = {"nan": float("nan"), "inf": float("inf"), "minus_inf": float("-inf"), "minus_zero": -0.0}
SPELLED = {"nan": "NaN", "inf": "Infinity", "minus_inf": "-Infinity", "minus_zero": -0.0}  # zarr v2's JSON


@pytest.fixture(scope="module")
def odd_fills(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """A zarr v3 hierarchy (zarr-python) of float32 and float64 arrays, each with one odd fill value and only
    its first rows written: the rest of each array is its fill value, in shards and chunks never written and at
    the padded edge."""
    root = tmp_path_factory.mktemp("odd") / "odd.zarr"
    g = zarr.open_group(root, mode="w")
    rng = np.random.default_rng(3)
    contents = {}
    for name, fill in FILLS.items():
        for dtype in ("float32", "float64"):
            array = g.create_array(f"{name}_{dtype}", shape=(13, 11), dtype=dtype, fill_value=fill, chunks=(3, 4),
                                   shards=(6, 8))  # fmt: skip
            array[:4] = rng.random((4, 11)).astype(dtype)
            contents[f"{name}_{dtype}"] = array[...]
    return root, contents


def same_bits(got: np.ndarray, expected: np.ndarray) -> bool:
    """Equal value for value, NaN for NaN and -0.0 for -0.0 (np.array_equal takes -0.0 for 0.0)."""
    return got.shape == expected.shape and got.astype(expected.dtype).tobytes() == expected.tobytes()


def test_non_finite_and_negative_zero_fills_through_zarr2(odd_fills, mount) -> None:
    """`.zarray` spells the fill value as zarr v2 does (NaN and the infinities as strings), and tensorstore's
    zarr driver reads every array, never-written chunks and padded edges included, bit for bit."""
    source, contents = odd_fills
    mnt = mount(source, "--view", "zarr2").path
    for name, expected in contents.items():
        zarray = json.loads((mnt / name / ".zarray").read_text())
        fill = zarray["fill_value"]
        wanted = SPELLED[name.rsplit("_", 1)[0]]
        assert fill == wanted and (not isinstance(wanted, float) or np.signbit(fill) == np.signbit(wanted)), name
        assert same_bits(ts_read("zarr", mnt / name), expected), name


def test_non_finite_and_negative_zero_fills_through_n5(odd_fills, mount) -> None:
    """N5 has no fill value: a reader takes a missing block for zeros, so every block of an array whose fill is
    not zero (its bytes, not its value: -0.0 too) is shown, made of the fill value; tensorstore's n5 driver
    reads each array bit for bit."""
    source, contents = odd_fills
    mnt = mount(source, "--view", "n5").path
    for name, expected in contents.items():
        assert (mnt / name / "2" / "4").exists(), name  # the last block (x 2, y 4): its shard never written
        assert same_bits(ts_read("n5", mnt / name), expected.T), name


@pytest.fixture
def odd_source(tmp_path: Path) -> Path:
    """A key-value dataset with, beside its files: links to a large file and a directory outside it, a link to
    one of its own shards, a FIFO nobody writes, a listening socket and a character device."""
    root = tmp_path / "kv"
    peers.write_tensorstore_kv(root, {k: bytes([k]) * 1000 for k in range(1, 20)})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(bytes(5 << 20))
    (root / "to-big").symlink_to(outside / "big")
    (root / "to-dir").symlink_to(outside)
    (root / "to-shard").symlink_to(next(root.glob("*.shard")))
    os.mkfifo(root / "fifo")
    os.mknod(root / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return root


def test_df_counts_only_the_sources_regular_files(odd_source, mount) -> None:
    """`df` shows the bytes and files of the regular files under the source: no link followed (the 5 MiB
    outside stays out, a shard linked twice counts once), no FIFO opened (its count would block for ever), no
    socket or device counted."""
    files = [p for p in odd_source.rglob("*") if p.is_file() and not p.is_symlink()]
    stored = -(-sum(p.stat().st_size for p in files) // 512) * 512
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(odd_source / "socket"))
        listening.listen()
        m = mount(odd_source)
        df = ["df", "-B1", "--output=size,used,avail,itotal,iused,iavail", m.path]
        wait_until(lambda: os.statvfs(m.path).f_files >= len(files))
        shown = subprocess.run(df, capture_output=True, text=True, check=True).stdout.split()[-6:]
    assert shown == [str(stored), str(stored), "0", str(len(files)), str(len(files)), "0"], (shown, len(files))
