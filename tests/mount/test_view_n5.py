"""`--view n5` as N5's viewers read it, through the kernel: every level of a scale pyramid (a precomputed image
and segmentation written by tensorstore, OME-Zarr 0.5 images written by ome-zarr-py) opens as one multiscale
group, at its original's voxel size, by Neuroglancer's n5 source and by n5-viewer, whose rules are encoded
below from their sources; tensorstore's n5 driver reads each level's values, units and resolution. Units are
always stated: a zarr array without any stays unitless, and mixed units get no single-unit `pixelResolution`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr
from ome_zarr.writer import write_image, write_multiscales_metadata

from tests.mount.test_view_readers import write_pyramid
from tests.support.n5_readers import Voxel, attributes, in_si, n5_viewer_reads, neuroglancer_reads, tensorstore_reads
from tests.support.reading import precomputed, ts_read

pytestmark = [pytest.mark.kernel]


def assert_same_size(got: list[Voxel], want: list[Voxel], who: str) -> None:
    assert len(got) == len(want), f"{who}: {len(got)} levels, not {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert [u for _, u in a] == [u for _, u in b], f"{who}, level {i}: units {a} != {b}"
        assert [s for s, _ in a] == pytest.approx([s for s, _ in b], rel=1e-9), f"{who}, level {i}: {a} != {b}"


def assert_one_multiscale(n5: Path, group: str, originals: list[tuple[str, np.ndarray, Voxel]]) -> None:
    """The group at `group` opens whole in both viewers, each level at its original's size; each level `s<i>`
    reads the original's values and size in tensorstore, and is also there under its original name, which no
    listing shows."""
    want = [voxel for _, _, voxel in originals]
    assert_same_size(neuroglancer_reads(n5, group), want, f"Neuroglancer, {group or '.'}")
    assert_same_size(n5_viewer_reads(n5, group), want, f"n5-viewer, {group or '.'}")
    listed = sorted(p.name for p in (n5 / group).iterdir() if p.is_dir())
    for i, (name, values, voxel) in enumerate(originals):
        level = f"{group}/s{i}".lstrip("/")
        assert f"s{i}" in listed
        read, size = tensorstore_reads(n5, level)
        np.testing.assert_array_equal(read, values, err_msg=level)
        assert_same_size([size], [voxel], f"tensorstore, {level}")
        assert_same_size(neuroglancer_reads(n5, level), [voxel], f"Neuroglancer, {level} alone")
        assert_same_size(n5_viewer_reads(n5, level), [voxel], f"n5-viewer, {level} alone")
        original = name.rpartition("/")[2]
        if original != f"s{i}":
            assert original not in listed, f"{original}: listed beside s{i}"
            np.testing.assert_array_equal(ts_read("n5", n5 / group / original), values, err_msg=original)


def precomputed_levels(source: Path) -> list[tuple[str, np.ndarray, Voxel]]:
    """Each scale's key, values (x, y, z) and voxel size in nm as the precomputed original says them."""
    info = json.loads((source / "info").read_text())
    out = []
    for index, scale in enumerate(info["scales"]):
        values = ts.open({**precomputed(source), "scale_index": index}).result().read().result()[..., 0]
        out.append((scale["key"], values, [in_si(r, "nm") for r in scale["resolution"]]))
    return out


@pytest.mark.parametrize(("dtype", "encoding"), [("uint8", "raw"), ("uint64", "compressed_segmentation")])
def test_a_precomputed_pyramid_opens_as_one_multiscale(tmp_path, mount, dtype: str, encoding: str) -> None:
    """An image and a segmentation of three scales (4 x 4 x 40, 8 x 8 x 40 and 16 x 16 x 80 nm). Scales other
    than the first drew at twice their size in Neuroglancer (`resolution` times `downsamplingFactors`), and
    the volume opened only scale by scale."""
    source = tmp_path / "vol"
    write_pyramid(source, dtype, encoding)
    n5 = mount(source, "--view", "n5").path
    levels = precomputed_levels(source)
    assert [key for key, _, _ in levels] == ["4_4_40", "8_8_40", "16_16_80"]
    assert_one_multiscale(n5, "", levels)
    assert sorted(p.name for p in n5.iterdir()) == ["attributes.json", "s0", "s1", "s2"]


def ome_levels(image: Path) -> list[tuple[str, np.ndarray, Voxel]]:
    """Each level's path, values (N5 order) and voxel size as the OME-Zarr 0.5 original says them."""
    multiscale = json.loads((image / "zarr.json").read_text())["attributes"]["ome"]["multiscales"][0]
    units = [in_si(1, {"micrometer": "um", "second": "s"}[a["unit"]]) if "unit" in a else (1, "")
             for a in multiscale["axes"]]  # fmt: skip
    out = []
    for dataset in multiscale["datasets"]:
        (scale,) = (t["scale"] for t in dataset["coordinateTransformations"] if t["type"] == "scale")
        voxel = [(s * factor, unit) for s, (factor, unit) in zip(scale, units, strict=True)]
        out.append((dataset["path"], zarr.open_array(image / dataset["path"], mode="r")[...].T, voxel[::-1]))
    return out


def test_an_ome_zarr_image_opens_as_one_multiscale(tmp_path, mount) -> None:
    """A 3-D image in micrometres written sharded by ome-zarr-py (levels s0, s1, s2, anisotropic), with its
    labels: each group opens whole in both viewers, every level at the size the image's transforms give."""
    image = tmp_path / "zyx.zarr"
    rng = np.random.default_rng(5)
    um = dict.fromkeys("zyx", "micrometer")
    write_image(rng.integers(0, 60000, (37, 45, 51), dtype="uint16"), str(image), scale_factors=[2, 4], axes="zyx",
                scale={"z": 2.0, "y": 0.5, "x": 0.5}, axes_units=um,
                storage_options={"chunks": (8, 16, 16), "shards": (16, 32, 32)})  # fmt: skip
    n5 = mount(image, "--view", "n5").path
    assert_one_multiscale(n5, "", ome_levels(image))


def test_mixed_units_give_no_single_unit_and_levels_keep_their_size(tmp_path, mount) -> None:
    """A time series in seconds of a 3-D image in micrometres, levels named 0, 1, 2 (as ome-zarr-py 0.9 and
    older writers name them). N5's `pixelResolution` has one unit, so none is stated; without it to state the
    first level's size, `downsamplingFactors` would multiply `resolution` in Neuroglancer, so levels carry
    none either: the group's `scales` has them. The levels show as s0, s1, s2; 0, 1, 2 open too."""
    image = tmp_path / "tzyx.zarr"
    group = zarr.open_group(image, mode="w")
    rng = np.random.default_rng(2)
    datasets = []
    for level in range(3):
        shape = (3, 9, -(-30 // 2**level), -(-41 // 2**level))
        array = group.create_array(str(level), shape=shape, dtype="uint16", chunks=(1, 4, 8, 8), shards=(1, 8, 16, 16))
        array[...] = rng.integers(0, 4000, shape, dtype="uint16")
        scale = [0.5, 2.0, 0.25 * 2**level, 0.25 * 2**level]
        datasets.append({"path": str(level), "coordinateTransformations": [{"type": "scale", "scale": scale}]})
    units = {"t": "second", **dict.fromkeys("zyx", "micrometer")}
    write_multiscales_metadata(group, datasets, axes="tzyx", axes_units=units)
    n5 = mount(image, "--view", "n5").path
    for path in ("", "s0", "s1", "s2"):
        attrs = attributes(n5, path)
        assert attrs["units"] == ["um", "um", "um", "s"] and "pixelResolution" not in attrs, path
    assert_same_size(neuroglancer_reads(n5, ""), [voxel for _, _, voxel in ome_levels(image)], "Neuroglancer")
    for i, (_, values, voxel) in enumerate(ome_levels(image)):
        read, size = tensorstore_reads(n5, f"s{i}")
        np.testing.assert_array_equal(read, values)
        assert_same_size([size], [voxel], f"tensorstore, s{i}")
        assert_same_size(neuroglancer_reads(n5, f"s{i}"), [voxel], f"Neuroglancer, s{i} alone")
        np.testing.assert_array_equal(ts_read("n5", n5 / str(i)), values)
    assert sorted(p.name for p in n5.iterdir()) == ["attributes.json", "s0", "s1", "s2"]


def test_a_unitless_zarr_array_stays_unitless(tmp_path, mount) -> None:
    """A zarr v3 array says nothing of units or voxel sizes. Without `units`, Neuroglancer's n5 source takes
    nanometres and the view lands in another coordinate space than the original; stated unitless, of size 1,
    it lands on the original, and tensorstore reads it unitless too."""
    source = tmp_path / "plain.zarr"
    data = np.arange(12 * 10, dtype="int16").reshape(12, 10)
    zarr.create_array(source, shape=data.shape, dtype="int16", chunks=(4, 5), shards=(8, 10))[...] = data
    n5 = mount(source, "--view", "n5").path
    attrs = attributes(n5, "")
    assert attrs["units"] == ["", ""] and attrs["resolution"] == [1, 1]
    read, size = tensorstore_reads(n5, "")
    np.testing.assert_array_equal(read, data.T)
    assert size == [(1, ""), (1, "")] == neuroglancer_reads(n5, "")[0] == n5_viewer_reads(n5, "")[0]


def test_a_pyramid_whose_level_names_are_taken_keeps_its_names(tmp_path) -> None:
    """An OME-Zarr image of levels 0 and 1 beside another array named s1: no level is renamed and the group
    states no `scales` (a reader would open the other array as level 1); `shardfs info` says so, and each
    level still reads at its own size under its own name."""
    from shardfs.source import open_source

    image = tmp_path / "taken.zarr"
    group = zarr.open_group(image, mode="w")
    datasets = []
    for level in range(2):
        group.create_array(str(level), shape=(8 >> level, 8 >> level), dtype="uint8", chunks=(2, 2), shards=(4, 4))
        datasets.append({"path": str(level), "coordinateTransformations": [{"type": "scale", "scale": [2**level] * 2}]})
    group.create_array("s1", shape=(3, 3), dtype="uint8", chunks=(3, 3))
    write_multiscales_metadata(group, datasets, axes="yx", axes_units=dict.fromkeys("yx", "micrometer"))
    source = open_source(image, 64 << 20, "n5")
    assert ".: not an N5 multiscale: its levels cannot be named s0, s1, ... there" in map(str, source.report)
    assert sorted(name for name, _ in source.tree.listdir("")) == ["0", "1", "attributes.json", "s1"]
    read = lambda path: json.loads(source.tree.lookup(f"{path}/attributes.json".lstrip("/")).read(0, 1 << 16))  # noqa: E731
    assert "scales" not in read("")
    assert read("1")["dimensions"] == [4, 4] and read("1")["resolution"] == [2, 2]
    assert read("1")["pixelResolution"] == {"unit": "um", "dimensions": [1, 1]} and read("1")[
        "downsamplingFactors"
    ] == [2, 2]
