"""One chunk, one name: the names a mount shows are exactly those a peer writes unsharded (tensorstore for
volumes, cloud-volume for meshes), each reads the peer's bytes through the kernel, and every other spelling
of the same cell (a leading zero or plus sign, a clipped edge written unclipped, a misaligned or shifted
bound, a cell one past the grid, a mesh manifest under another extension) is ENOENT, never an alias.

Volumes are checked twice: a small grid, whose names are looked up by table, and one longer than
TABLE_CELLS along x, whose names are parsed."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

from shardfs.formats.precomputed_names import TABLE_CELLS
from tests.support import peers
from tests.support.reading import errno_of

pytestmark = [pytest.mark.kernel]


SCALE = "4_4_40"


def write_long_volume(root: Path, twin: Path) -> tuple[list[int], list[int], list[int]]:
    """A raw uint8 volume longer than TABLE_CELLS cells along x, clipped in every dimension, written by
    tensorstore sharded at root and unsharded at twin: its first and last two cells along x. Returns
    (size, chunk, offset)."""
    size, chunk, offset = [2 * TABLE_CELLS + 15, 7, 4], [2, 5, 3], [-3, 2, 9]
    data = np.random.default_rng(7).integers(0, 256, (*size, 1), dtype=np.uint8)
    for path, sharding in ((root, peers.sharding_spec(data_encoding="raw")), (twin, None)):
        scale = {"size": size, "voxel_offset": offset, "chunk_size": chunk, "resolution": [4, 4, 40], "encoding": "raw"}
        array = ts.open({
            "driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(path)},
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": {**scale, **({"sharding": sharding} if sharding else {})}, "create": True,
        }).result().translate_to[0, 0, 0, 0]  # fmt: skip
        for xs in (slice(0, 4), slice(size[0] - 3, size[0])):
            array[xs].write(data[xs]).result()
    return size, chunk, offset


@pytest.fixture(scope="module", params=["by table", "parsed"])
def volume(request, tmp_path_factory) -> tuple[Path, Path, list[int], list[int], list[int]]:
    """(source, unsharded twin, size, chunk, offset)."""
    where = tmp_path_factory.mktemp("names")
    source, twin = where / "vol", where / "twin"
    if request.param == "parsed":
        return source, twin, *write_long_volume(source, twin)
    peers.write_tensorstore_volume(source, data_encoding="raw", extra_unsharded_scale=False, unsharded_twin=twin)
    return source, twin, [70, 50, 33], [16, 16, 8], [-5, 3, 7]


def spellings(number: int) -> list[str]:
    """Other ways to write an integer that int() would take."""
    digits = str(abs(number))
    sign = "-" if number < 0 else ""
    return [f"{sign}0{digits}", f"{sign}00{digits}", *([f"+{digits}"] if number >= 0 else ["-0"] * (number == 0))]


def aliases(name: str, chunk: list[int], offset: list[int], size: list[int]) -> list[str]:
    """Names that spell the cell of name another way, or name a neighbour off the grid's alignment."""
    axes = [tuple(map(int, re.fullmatch(r"(-?\d+)-(-?\d+)", part).groups())) for part in name.split("_")]
    out = []
    for d, (lo, hi) in enumerate(axes):
        assert hi == min(lo + chunk[d], offset[d] + size[d])
        bounds = [(s, hi) for s in spellings(lo)] + [(lo, s) for s in spellings(hi)]
        bounds += [(lo + 1, hi + 1), (lo - 1, hi - 1), (lo, hi + 1)]
        if hi - lo < chunk[d]:  # a clipped edge, written as if it were not
            bounds.append((lo, lo + chunk[d]))
        out += ["_".join(f"{a}-{b}" for a, b in (*axes[:d], bound, *axes[d + 1 :])) for bound in bounds]
    return out


def test_names_are_the_twins_and_no_other_spelling_is_a_file(volume, mount) -> None:
    source, twin, size, chunk, offset = volume
    m = mount(source)
    names = sorted(os.listdir(twin / SCALE))
    assert sorted(os.listdir(m.path / SCALE)) == names and len(names) >= 8
    for name in names:
        assert (m.path / SCALE / name).read_bytes() == (twin / SCALE / name).read_bytes(), name
        for alias in aliases(name, chunk, offset, size):
            assert alias not in names and errno_of(m.path / SCALE / alias) == errno.ENOENT, (name, alias)


def test_the_last_cell_along_each_axis_is_there_and_the_next_is_not(volume, mount) -> None:
    """The grid ends where the size does: the last cell along each axis (clipped) is a file, and a cell one
    past it, however its upper bound is written, is ENOENT."""
    source, twin, size, chunk, offset = volume
    m = mount(source)
    grid = [-(-s // c) for s, c in zip(size, chunk, strict=True)]
    last = [(o + (n - 1) * c, o + s) for o, n, c, s in zip(offset, grid, chunk, size, strict=True)]
    name = "_".join(f"{lo}-{hi}" for lo, hi in last)
    assert (twin / SCALE / name).is_file()
    assert (m.path / SCALE / name).read_bytes() == (twin / SCALE / name).read_bytes()
    for d in range(3):
        lo = offset[d] + grid[d] * chunk[d]
        for hi in (lo + chunk[d], offset[d] + size[d], lo + 1):
            past = "_".join(f"{lo}-{hi}" if e == d else f"{a}-{b}" for e, (a, b) in enumerate(last))
            assert errno_of(m.path / SCALE / past) == errno.ENOENT, past


def test_mesh_names_are_the_writers_and_no_other_extension(tmp_path, mount) -> None:
    """`<id>` and `<id>.index`, as written; `<id>:0` (the legacy manifest), `<id>.idx`, `<id>.index.index`
    and the like are ENOENT."""
    expected = peers.write_cloudvolume_multires_meshes(tmp_path / "seg")
    m = mount(tmp_path / "seg")
    assert sorted(os.listdir(m.path / "mesh")) == sorted([*expected, "info"])
    for name, value in expected.items():
        assert (m.path / "mesh" / name).read_bytes() == value, name
    for segid in (n for n in expected if "." not in n):
        for other in (":0", ".idx", ".index.index", ".Index", ".", ".gz", ".index ", ".0", ".frag"):
            assert errno_of(m.path / "mesh" / f"{segid}{other}") == errno.ENOENT, f"{segid}{other}"
