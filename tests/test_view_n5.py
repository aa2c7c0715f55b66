"""`--view n5` as N5's viewers read it, through the kernel: every level of a scale pyramid (a precomputed image
and segmentation written by tensorstore, OME-Zarr 0.5 images written by ome-zarr-py) opens as one multiscale
group, at its original's voxel size, by Neuroglancer's n5 source and by n5-viewer, whose rules are encoded
below from their sources; tensorstore's n5 driver reads each level's values, units and resolution. Units are
always stated: a zarr array without any stays unitless, and mixed units get no single-unit `pixelResolution`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr
from ome_zarr.writer import write_image, write_multiscales_metadata

from tests.helpers import precomputed, ts_read
from tests.test_view_readers import write_pyramid

PREFIXES = {"Y": 24, "Z": 21, "E": 18, "P": 15, "T": 12, "G": 9, "M": 6, "k": 3, "h": 2, "da": 1, "": 0, "d": -1,
            "c": -2, "m": -3, "u": -6, "µ": -6, "n": -9, "p": -12, "f": -15, "a": -18, "z": -21, "y": -24}  # fmt: skip
Voxel = list[tuple[float, str]]  # a voxel's size along each axis, N5 order, in SI base units: (4e-9, "m")


def in_si(size: float, unit: str) -> tuple[float, str]:
    """A size in a unit Neuroglancer knows (src/util/si_units.ts: an SI prefix on m, s, Hz or rad/s, or ''),
    in the base unit: (8, 'nm') is (8e-9, 'm'). ValueError for any other unit, as Neuroglancer refuses it."""
    for base in ("rad/s", "Hz", "m", "s"):
        if unit.endswith(base) and unit[: -len(base)] in PREFIXES:
            return size * 10.0 ** PREFIXES[unit[: -len(base)]], base
    if unit:
        raise ValueError(f"not a unit Neuroglancer knows: {unit!r}")
    return size, ""


def attributes(n5: Path, path: str) -> dict:
    file = n5 / path / "attributes.json"
    return json.loads(file.read_text()) if file.exists() else {}


def neuroglancer_reads(n5: Path, path: str) -> list[Voxel]:
    """The voxel size of every scale Neuroglancer's n5 source opens at path (google/neuroglancer,
    src/datasource/n5/frontend.ts: getAttributes, getMultiscaleMetadata, MultiscaleVolumeChunkSource).
    Attributes are those of path merged over those of every directory above it. A dataset (`dimensions`) is
    one scale: `resolution`, or `pixelResolution`'s `dimensions` where given, times its `downsamplingFactors`.
    A group is a multiscale only with `scales`: level i is the dataset `s<i>`, its size the group's times
    scales[i]. Units: `units`, else `pixelResolution`'s unit on every axis, else nanometres. Every list has
    one entry per dimension, every level the first's data type, or it refuses the source."""
    merged: dict = {}
    parts = path.split("/") if path else []
    for depth in range(len(parts) + 1):
        merged.update(attributes(n5, "/".join(parts[:depth])))
    pixel = merged.get("pixelResolution", {})
    lists = [merged.get(key) for key in ("resolution", "axes", "units", "dimensions")] + [pixel.get("dimensions")]
    rank = {len(x) for x in [*lists, *merged.get("scales", [])] if x is not None}
    assert len(rank) == 1, f"{path}: lists of several lengths {merged}"
    (rank,) = rank
    units = merged.get("units") or [pixel.get("unit", "nm")] * rank
    size = pixel.get("dimensions") or merged.get("resolution") or [1] * rank
    if "dimensions" in merged:
        all_factors = [merged.get("downsamplingFactors", [1] * rank)]
    else:
        all_factors = merged["scales"]
        types = {attributes(n5, f"{path}/s{i}".lstrip("/"))["dataType"] for i in range(len(all_factors))}
        assert len(types) == 1, f"{path}: levels of several data types"
    assert all(len(f) == rank for f in all_factors)
    return [[in_si(s * f, u) for s, f, u in zip(size, factors, units, strict=True)] for factors in all_factors]


SCALE_LEVEL = re.compile(r"^s\d+$")


def n5_viewer_reads(n5: Path, path: str) -> list[Voxel]:
    """The voxel size of every scale n5-viewer opens at path (saalfeldlab/n5-universe, metadata/
    N5SingleScaleMetadataParser.java and N5ViewerMultiscaleMetadataParser.java). A dataset reads its own
    attributes, none inherited: `pixelResolution` {unit, dimensions} (the base resolution) times
    `downsamplingFactors`, which, missing, are 2^i on every axis for a dataset named s<i>, else 1. A group is
    a multiscale of its child datasets named s<i>, in order."""

    def level(name: str) -> Voxel:
        attrs = attributes(n5, name)
        pixel = attrs["pixelResolution"]  # buildTransform needs it
        index = re.fullmatch(r"s(\d+)", name.rpartition("/")[2])
        default = [2 ** int(index[1]) if index else 1] * len(pixel["dimensions"])
        factors = attrs.get("downsamplingFactors", default)
        return [in_si(s * f, pixel["unit"]) for s, f in zip(pixel["dimensions"], factors, strict=True)]

    if "dimensions" in attributes(n5, path):
        return [level(path)]
    found = sorted((int(p.name[1:]), p.name) for p in (n5 / path).iterdir() if SCALE_LEVEL.match(p.name))
    assert [i for i, _ in found] == list(range(len(found))), f"{path}: levels {found}"
    return [level(f"{path}/{name}".lstrip("/")) for _, name in found]


def tensorstore_reads(n5: Path, path: str) -> tuple[np.ndarray, Voxel]:
    """A dataset's values and voxel size as tensorstore's n5 driver reads them (`units` and `resolution`,
    tensorstore/driver/n5/metadata.cc); an axis without units is unitless, of size 1."""
    store = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(n5 / path)}}).result()
    units = [(u.multiplier, u.base_unit) if u is not None else (1, "") for u in store.dimension_units]
    return store.read().result(), [in_si(m, u) for m, u in units]


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
