"""The views as bioimaging readers read them, through the kernel. OME-Zarr 0.5 images written sharded by
ome-zarr-py are read level by level through `--view zarr2` by ome-zarr-py 0.9 on zarr-python 2.18 (in
.venv-zarr2: the OME-Zarr 0.4 reader many pipelines pin, which opens every array with `/` chunk keys), and
natively by the current ome-zarr-py; a precomputed pyramid's voxels are placed through each view as
cloud-volume places them in the original; axis names reach xarray (`_ARRAY_DIMENSIONS`) and tensorstore's
n5 driver (`axes`, `units`, `resolution`)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr

from tests.support import peers
from tests.support.n5_readers import neuroglancer_reads
from tests.support.reading import precomputed
from tests.support.zarr2 import run

pytestmark = [pytest.mark.kernel]

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
from ome_zarr.reader import Label, Multiscales, Plate, Reader, Well
out, images = sys.argv[1], sys.argv[2:]
levels, kinds = {}, {}
for image in images:
    for node in Reader(parse_url(image))():
        name = node.zarr.path[len(image):].strip("/")
        for kind, spec in (("plate", Plate), ("well", Well), ("label", Label), ("image", Multiscales)):
            if spec.matches(node.zarr):
                kinds[f"{image}|{name}"] = kind
                break
        if kinds.get(f"{image}|{name}") in ("label", "image"):
            for i, level in enumerate(node.data):
                levels[f"{image}|{name}|{i}"] = np.asarray(level)
np.savez(out, **levels)
print(json.dumps(kinds))
"""


def ome_zarr_read(python: str, images: list[Path], out: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """What an ome-zarr-py Reader finds below each path given (plate, well, image or label, as
    {"<path>|<node path>": kind}) and reads of every level of each image and label, as
    {"<path>|<node path>|<level>": array}."""
    args = [out, *images]
    if python == "0.9":
        kinds = json.loads(run(READ_WITH_OME_ZARR, *args))
    else:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(READ_WITH_OME_ZARR), *map(str, args)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        kinds = json.loads(done.stdout)
    with np.load(out) as saved:
        return kinds, {key: saved[key] for key in saved.files}


def found_nodes(mounted: dict[str, Path]) -> dict[str, str]:
    """What a reader must find below each image: the image, and the labels of the 3-D one."""
    return {f"{mounted['zyx.zarr']}|": "image", f"{mounted['zyx.zarr']}|labels/cells": "label",
            f"{mounted['czyx.zarr']}|": "image"}  # fmt: skip


def assert_every_level(read: dict[str, np.ndarray], mounted: dict[str, Path], levels: dict[str, np.ndarray]) -> None:
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
    assert kinds == found_nodes(mounted)
    assert_every_level(read, mounted, levels)
    z2 = mounted["zyx.zarr"]
    assert json.loads((z2 / "s0" / ".zarray").read_text())["dimension_separator"] == "/"
    assert (z2 / "s0" / "4" / "2" / "3").is_file() and not (z2 / "s0" / "4.2.3").exists()
    assert json.loads((z2 / "labels" / ".zattrs").read_text()) == {"labels": ["cells"]}
    assert json.loads((z2 / "labels" / "cells" / ".zattrs").read_text())["image-label"]["version"] == "0.4"


def test_current_ome_zarr_py_reads_the_native_view(ome_images, mount, tmp_path) -> None:
    root, levels = ome_images
    mounted = {name: mount(root / name).path for name in ("zyx.zarr", "czyx.zarr")}
    kinds, read = ome_zarr_read("current", list(mounted.values()), tmp_path / "read.npz")
    assert kinds == found_nodes(mounted)
    assert_every_level(read, mounted, levels)


# ---------------------------------------------------------------------------------------------------------------------
# Where a voxel is


def write_pyramid(root: Path, dtype: str = "uint8", encoding: str = "raw") -> None:
    """A precomputed image (or, compressed_segmentation, a segmentation) of three scales written by
    tensorstore, whose voxel_offsets are not multiples of the downsampling: (-5, 3, 7) at 4 x 4 x 40 nm
    (sharded), then as tensorstore downsamples it by 2 x 2 x 1 (8_8_40) and by 4 x 4 x 2 (16_16_80, at
    (-2, 0, 3))."""
    peers.write_tensorstore_volume(root, dtype=dtype, encoding=encoding, data_encoding="raw")
    base = ts.open({**precomputed(root), "scale_index": 0}).result()
    method = "mode" if encoding == "compressed_segmentation" else "mean"
    down = ts.downsample(base, [4, 4, 2, 1], method=method)
    scale = {"resolution": [16, 16, 80], "size": list(down.shape[:3]), "voxel_offset": list(down.origin[:3]),
             "chunk_size": [16, 16, 8], "encoding": encoding}  # fmt: skip
    if encoding == "compressed_segmentation":
        scale["compressed_segmentation_block_size"] = [8, 8, 4]
    ts.open({**precomputed(root), "scale_metadata": scale, "open": True, "create": True}).result().write(down).result()


def test_a_voxel_is_where_cloud_volume_places_it_through_every_view(tmp_path, mount) -> None:
    """Precomputed places voxel i of a scale from (voxel_offset + i) x resolution to one voxel on (cloud-volume's
    bounding box); OME-Zarr places a voxel's centre. ngff-zarr, reading the zarr2 view, places the voxel at
    each corner of every scale at its centre as cloud-volume does in the original, and reads there what
    cloud-volume reads; cloud-volume reads the native view's bounds as the original's. N5 has no origin:
    tensorstore's n5 driver takes the axis names and the resolution of the original."""
    import ngff_zarr
    from cloudvolume import CloudVolume

    source = tmp_path / "vol"
    write_pyramid(source)
    native, z2, n5 = (mount(source, "--view", view).path for view in ("native", "zarr2", "n5"))
    images = ngff_zarr.from_ngff_zarr(str(z2)).images
    assert len(images) == 3
    for mip, image in enumerate(images):
        original = CloudVolume(f"file://{source}", mip=mip, progress=False, fill_missing=True)
        through_native = CloudVolume(f"file://{native}", mip=mip, progress=False, fill_missing=True)
        assert through_native.bounds == original.bounds and list(through_native.resolution) == list(original.resolution)
        low, high = np.array(original.bounds.minpt), np.array(original.bounds.maxpt)
        resolution = np.array(original.resolution, dtype=float)
        assert image.dims == ("c", "z", "y", "x") and image.data.shape[1:] == tuple((high - low)[::-1])
        assert {image.axes_units[a] for a in "zyx"} == {"nanometer"}
        for corner in itertools.product(*((0, n - 1) for n in high - low)):  # (x, y, z) from the volume's corner
            centre = (low + corner + 0.5) * resolution
            placed = [image.translation[a] + i * image.scale[a] for a, i in zip("xyz", corner, strict=True)]
            np.testing.assert_allclose(placed, centre, err_msg=f"scale {mip}, voxel {corner}")
            x, y, z = low + corner
            expected = original[x : x + 1, y : y + 1, z : z + 1][0, 0, 0, 0]
            assert np.asarray(image.data[0, corner[2], corner[1], corner[0]]) == expected, (mip, corner)
        n5_scale = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(n5 / original.key)}}).result()
        assert n5_scale.domain.labels == ("x", "y", "z")
        assert [(u.multiplier, u.base_unit) for u in n5_scale.dimension_units] == [(r, "nm") for r in resolution]
    import xarray as xr

    keys = [p.name for p in z2.iterdir() if p.is_dir()]
    one = xr.open_zarr(z2, zarr_format=2, consolidated=False, drop_variables=keys[1:])  # the scales' sizes differ
    assert one[keys[0]].dims == ("c", "z", "y", "x")


# ---------------------------------------------------------------------------------------------------------------------
# Axis names, units and resolution


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """A zarr v3 hierarchy with `dimension_names`, written sharded by zarr-python 3: a data variable and
    its coordinates, as xarray writes them in zarr v3."""
    root = tmp_path_factory.mktemp("named") / "climate.zarr"
    group = zarr.open_group(root, mode="w")
    rng = np.random.default_rng(9)
    arrays = {
        "temperature": (("time", "lat", "lon"), rng.random((5, 18, 36)).astype("float32"), (1, 6, 12), (5, 6, 36)),
        "time": (("time",), np.arange(5, dtype="int64"), (5,), None),
        "lat": (("lat",), np.linspace(-85, 85, 18), (6,), (18,)),
        "lon": (("lon",), np.linspace(-175, 175, 36), (12,), (36,)),
    }
    for name, (dims, data, chunks, shards) in arrays.items():
        group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=chunks, shards=shards,
                           dimension_names=dims)[...] = data  # fmt: skip
    return root, {name: case[1] for name, case in arrays.items()}


def test_xarray_opens_the_zarr2_view_with_the_dimension_names(named, ome_images, mount) -> None:
    import xarray as xr

    root, contents = named
    z2 = mount(root, "--view", "zarr2").path
    # mask_and_scale=False: xarray takes a zarr v2 fill_value (here zarr v3's default 0) for a CF _FillValue
    # and shows it as NaN; the source read by xarray through zarr v3 does not.
    dataset = xr.open_zarr(z2, zarr_format=2, consolidated=False, mask_and_scale=False)
    assert dataset["temperature"].dims == ("time", "lat", "lon")
    assert set(dataset.coords) == {"time", "lat", "lon"}
    for name, data in contents.items():
        np.testing.assert_array_equal(dataset[name].values, data, err_msg=name)
    # An OME-Zarr image's arrays are named by its axes; a precomputed volume's are c, z, y, x.
    images, _ = ome_images
    ome = mount(images / "czyx.zarr", "--view", "zarr2").path
    one = xr.open_zarr(ome, zarr_format=2, consolidated=False, drop_variables=["s0", "s2"])  # levels' sizes differ
    assert one["s1"].dims == ("c", "z", "y", "x")


def test_tensorstore_n5_and_the_n5_attributes_agree_on_axes_and_resolution(named, ome_images, mount) -> None:
    root, _ = named
    n5 = mount(root, "--view", "n5").path
    temperature = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(n5 / "temperature")}}).result()
    attributes = json.loads((n5 / "temperature" / "attributes.json").read_text())
    assert temperature.domain.labels == ("lon", "lat", "time") == tuple(attributes["axes"])
    # zarr v3 names axes but gives them no units or size: unitless, as Neuroglancer would take nanometres.
    assert attributes["units"] == ["", "", ""] and attributes["resolution"] == [1, 1, 1]
    # OME-Zarr: names, units and voxel sizes from the image's multiscale, as the writer put them.
    images, _ = ome_images
    n5 = mount(images / "zyx.zarr", "--view", "n5").path
    multiscale = json.loads((images / "zyx.zarr" / "zarr.json").read_text())["attributes"]["ome"]["multiscales"][0]
    factors = []
    for dataset in multiscale["datasets"]:
        (scale,) = (t["scale"] for t in dataset["coordinateTransformations"] if t["type"] == "scale")
        level = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(n5 / dataset["path"])}}).result()
        attributes = json.loads((n5 / dataset["path"] / "attributes.json").read_text())
        assert level.domain.labels == ("x", "y", "z") == tuple(attributes["axes"])
        units = [(u.multiplier, u.base_unit) for u in level.dimension_units]
        said = list(zip(attributes["resolution"], attributes["units"], strict=True))
        assert units == [(s, "um") for s in scale[::-1]] == said
        base = multiscale["datasets"][0]["coordinateTransformations"][0]["scale"]
        # The first level's: Neuroglancer and n5-viewer multiply it by downsamplingFactors.
        assert attributes["pixelResolution"] == {"unit": "um", "dimensions": base[::-1]}
        factors.append([pytest.approx(s / b) for s, b in zip(scale[::-1], base[::-1], strict=True)])
        assert attributes["downsamplingFactors"] == factors[-1]
    # The image group is a pyramid as n5-viewer and Neuroglancer open one: `scales`, and its first level's axes.
    group = json.loads((n5 / "attributes.json").read_text())
    assert group["scales"] == factors and group["axes"] == ["x", "y", "z"] and group["units"] == ["um"] * 3


def test_a_plate_converts_as_images_do(tmp_path, mount) -> None:
    """A sharded OME-Zarr 0.5 plate of two wells, metadata written by ome-zarr-py: through the zarr2 view,
    ome-zarr-py 0.9 finds the plate and its wells as 0.4, stitches the plate and reads every level of it.
    (0.9 reads a well's levels at paths `0`, `1`, ..., where current writers of images put `s0`: the
    levels are written by zarr-python, sharded, at those paths.)"""
    from ome_zarr.writer import write_multiscales_metadata, write_plate_metadata, write_well_metadata

    source = tmp_path / "plate.zarr"
    plate = zarr.open_group(source, mode="w")
    write_plate_metadata(plate, ["A"], ["1", "2"], ["A/1", "A/2"])
    rng = np.random.default_rng(3)
    wells = {}
    for well in ("A/1", "A/2"):
        write_well_metadata(plate.require_group(well), ["0"])
        field = plate.require_group(f"{well}/0")
        datasets, wells[well] = [], []
        for level in range(3):
            shape = (2, -(-30 // 2**level), -(-41 // 2**level))
            data = rng.integers(0, 4000, shape, dtype="uint16")
            field.create_array(str(level), shape=shape, dtype="uint16", chunks=(1, 4, 8), shards=(1, 8, 16))[...] = data
            datasets.append(
                {"path": str(level), "coordinateTransformations": [{"type": "scale", "scale": [1, 2**level, 2**level]}]}
            )
            wells[well].append(data)
        write_multiscales_metadata(field, datasets, axes="cyx")
    z2 = mount(source, "--view", "zarr2").path
    kinds, read = ome_zarr_read("0.9", [z2, z2 / "A" / "1" / "0"], tmp_path / "read.npz")
    assert kinds == {f"{z2}|": "plate", f"{z2 / 'A' / '1' / '0'}|": "image"}
    for level in range(3):
        np.testing.assert_array_equal(read[f"{z2 / 'A' / '1' / '0'}||{level}"], wells["A/1"][level])
    stitched = run(STITCH, z2)
    for level, (shape, total) in enumerate(json.loads(stitched)):
        expected = np.concatenate([wells["A/1"][level], wells["A/2"][level]], axis=-1)
        assert shape == list(expected.shape) and total == int(expected.astype("int64").sum()), level
    assert json.loads((z2 / ".zattrs").read_text())["plate"]["version"] == "0.4"
    assert json.loads((z2 / "A" / "1" / ".zattrs").read_text())["well"]["version"] == "0.4"


STITCH = """
import json, sys, numpy as np
from ome_zarr.io import parse_url
from ome_zarr.reader import Plate, Reader

(plate,) = [n for n in Reader(parse_url(sys.argv[1]))() if Plate.matches(n.zarr)]
print(json.dumps([[list(level.shape), int(np.asarray(level).astype("int64").sum())] for level in plate.data]))
"""


def test_the_n5_view_meets_neuroglancers_n5_rules(ome_images, tmp_path, mount) -> None:
    """A multi-channel precomputed volume (its lists were one entry short: Neuroglancer refused them), and
    OME-Zarr images with labels, under zarr-python 3's default zstd (which Neuroglancer's n5 source cannot
    decode): every dataset, and every multiscale group opened whole."""
    volume = tmp_path / "vol"
    peers.write_tensorstore_volume(volume, dtype="uint16", data_encoding="raw", num_channels=2)
    images, _ = ome_images
    for source in (volume, images / "zyx.zarr", images / "czyx.zarr"):
        n5 = mount(source, "--view", "n5").path
        for dataset in (p.parent.relative_to(n5) for p in n5.rglob("attributes.json")):
            if {"dimensions", "scales"} & json.loads((n5 / dataset / "attributes.json").read_text()).keys():
                neuroglancer_reads(n5, "" if str(dataset) == "." else str(dataset))
