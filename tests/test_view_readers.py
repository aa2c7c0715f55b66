"""The views as bioimaging readers read them, through the kernel. OME-Zarr 0.5 images written sharded by
ome-zarr-py are read level by level through `--view zarr2` by ome-zarr-py 0.9 on zarr-python 2.18 (in
.venv-zarr2: the OME-Zarr 0.4 reader many pipelines pin, which opens every array with `/` chunk keys), and
natively by the current ome-zarr-py; a precomputed pyramid's voxels are placed through each view as
cloud-volume places them in the original; axis names reach xarray (`_ARRAY_DIMENSIONS`) and tensorstore's
n5 driver (`axes`, `units`, `resolution`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr

from tests.test_zarr_draft import run

SHAPE_3D, SHAPE_4D = (37, 45, 51), (3, 19, 40, 33)  # no axis a multiple of the chunk
STORAGE = {"chunks": (8, 16, 16), "shards": (16, 32, 32)}
STORAGE_4D = {"chunks": (1, 8, 16, 16), "shards": (1, 16, 32, 32)}
LEVELS = ["s0", "s1", "s2"]


def write_ome_images(root: Path) -> dict[str, np.ndarray]:
    """Sharded OME-Zarr 0.5 images written by ome-zarr-py, three levels each: a 3-D uint16 image (z, y, x)
    in micrometres with a labels group, and a 4-D uint8 image with a channel axis. Returns every level's
    array, by its path, as zarr-python reads the source."""
    from ome_zarr.writer import write_image, write_labels

    rng = np.random.default_rng(5)
    um = {"z": "micrometer", "y": "micrometer", "x": "micrometer"}
    write_image(rng.integers(0, 60000, SHAPE_3D, dtype="uint16"), str(root / "zyx.zarr"), scale_factors=[2, 4],
                axes="zyx", scale={"z": 2.0, "y": 0.5, "x": 0.5}, axes_units=um, storage_options=STORAGE)  # fmt: skip
    labels = rng.integers(0, 5, SHAPE_3D, dtype="uint32")
    write_labels(labels, zarr.open_group(root / "zyx.zarr", mode="a"), name="cells", scale_factors=[2, 4],
                 axes="zyx", storage_options=STORAGE)  # fmt: skip
    write_image(rng.integers(0, 255, SHAPE_4D, dtype="uint8"), str(root / "czyx.zarr"), scale_factors=[2, 4],
                axes="czyx", storage_options=STORAGE_4D)  # fmt: skip
    levels = {}
    for image in ("zyx.zarr", "czyx.zarr", "zyx.zarr/labels/cells"):
        for level in LEVELS:
            array = zarr.open_array(root / image / level, mode="r")
            assert array.shards is not None, "ome-zarr-py no longer shards; this test needs another writer"
            levels[f"{image}/{level}"] = array[...]
    return levels


@pytest.fixture(scope="module")
def ome_images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("ome")
    return root, write_ome_images(root)


READ_WITH_OME_ZARR = """
import json, sys, numpy as np
from ome_zarr.io import parse_url
from ome_zarr.reader import Label, Multiscales, Reader
out, images = sys.argv[1], sys.argv[2:]
levels, kinds = {}, {}
for image in images:
    for node in Reader(parse_url(image))():
        if Multiscales.matches(node.zarr):
            name = node.zarr.path[len(image):].strip("/")
            kinds[name or "."] = "label" if Label.matches(node.zarr) else "image"
            for i, level in enumerate(node.data):
                levels[f"{image}|{name}|{i}"] = np.asarray(level)
np.savez(out, **levels)
print(json.dumps(kinds))
"""


def ome_zarr_read(python: str, images: list[Path], out: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """What an ome-zarr-py Reader finds below each image (image or label, by path) and reads of every level,
    as {"<image>|<node path>|<level>": array}."""
    args = [out, *images]
    if python == "0.9":
        kinds = json.loads(run(READ_WITH_OME_ZARR, *args))
    else:
        import subprocess
        import sys
        import textwrap

        done = subprocess.run([sys.executable, "-c", textwrap.dedent(READ_WITH_OME_ZARR), *map(str, args)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        kinds = json.loads(done.stdout)
    with np.load(out) as saved:
        return kinds, {key: saved[key] for key in saved.files}


def assert_every_level(read: dict[str, np.ndarray], root: Path, mounted: dict[str, Path], levels) -> None:
    for path, expected in levels.items():
        image, _, level = path.rpartition("/")
        top = image.split("/")[0]
        node = image[len(top) :].strip("/")
        key = f"{mounted[top]}|{node}|{LEVELS.index(level)}"
        assert key in read, f"{path}: the reader found no such level (found {sorted(read)})"
        np.testing.assert_array_equal(read[key], expected, err_msg=path)


def test_ome_zarr_py_09_reads_every_level_of_the_zarr2_view(ome_images, mount, tmp_path) -> None:
    """ome-zarr-py 0.9 read all zeros from `.` chunk keys, with no error: now `/`, and every level, labels
    included, reads back equal to the sharded source."""
    root, levels = ome_images
    mounted = {name: mount(root / name, "--view", "zarr2").path for name in ("zyx.zarr", "czyx.zarr")}
    kinds, read = ome_zarr_read("0.9", list(mounted.values()), tmp_path / "read.npz")
    assert kinds == {".": "image", "labels/cells": "label"}
    assert_every_level(read, root, mounted, levels)
    z2 = mounted["zyx.zarr"]
    assert json.loads((z2 / "s0" / ".zarray").read_text())["dimension_separator"] == "/"
    assert (z2 / "s0" / "4" / "2" / "3").is_file() and not (z2 / "s0" / "4.2.3").exists()
    assert json.loads((z2 / "labels" / ".zattrs").read_text()) == {"labels": ["cells"]}
    assert json.loads((z2 / "labels" / "cells" / ".zattrs").read_text())["image-label"]["version"] == "0.4"


def test_current_ome_zarr_py_reads_the_native_view(ome_images, mount, tmp_path) -> None:
    root, levels = ome_images
    mounted = {name: mount(root / name).path for name in ("zyx.zarr", "czyx.zarr")}
    kinds, read = ome_zarr_read("current", list(mounted.values()), tmp_path / "read.npz")
    assert kinds == {".": "image", "labels/cells": "label"}
    assert_every_level(read, root, mounted, levels)
