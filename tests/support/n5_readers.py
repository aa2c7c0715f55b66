"""The rules N5's viewers read a dataset's or a multiscale group's attributes by, from their sources, and what
tensorstore's n5 driver reads: each gives the voxel size of every scale it opens, in SI base units, so that a
test compares them with the original's. A rule broken is an assertion or a KeyError, as the viewer refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import tensorstore as ts

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


ENCODINGS = {"raw", "gzip", "blosc"}  # Neuroglancer's VolumeChunkEncoding (src/datasource/n5/base.ts)


def merged_attributes(n5: Path, path: str) -> dict:
    """attributes.json of path merged over those of every directory above it, as Neuroglancer reads them
    (src/datasource/n5/frontend.ts, getAttributes)."""
    merged: dict = {}
    parts = path.split("/") if path else []
    for depth in range(len(parts) + 1):
        merged.update(attributes(n5, "/".join(parts[:depth])))
    return merged


def neuroglancer_reads(n5: Path, path: str) -> list[Voxel]:
    """The voxel size of every scale Neuroglancer's n5 source opens at path (google/neuroglancer,
    src/datasource/n5/frontend.ts: getMultiscaleMetadata, ScaleMetadata, MultiscaleVolumeChunkSource), on
    attributes merged from the root down. A dataset (`dimensions`) is one scale: `resolution`, or
    `pixelResolution`'s `dimensions` where given, times its `downsamplingFactors`. A group is a multiscale
    only with `scales`: level i is the dataset `s<i>`, its size the group's times scales[i]. Units: `units`,
    else `pixelResolution`'s unit on every axis, else nanometres. Every list has one entry per dimension,
    every level the first's data type and a compression it decodes, or it refuses the source."""
    merged = merged_attributes(n5, path)
    pixel = merged.get("pixelResolution", {})
    lists = [merged.get(key) for key in ("resolution", "axes", "units", "dimensions")] + [pixel.get("dimensions")]
    rank = {len(x) for x in [*lists, *merged.get("scales", [])] if x is not None}
    assert len(rank) == 1, f"{path}: lists of several lengths {merged}"
    (rank,) = rank
    if pixel:
        in_si(1, pixel["unit"])  # parsed, and refused if unknown, whether or not `units` overrides it
    units = merged.get("units") or [pixel.get("unit", "nm")] * rank
    size = pixel.get("dimensions") or merged.get("resolution") or [1] * rank
    if "dimensions" in merged:
        all_factors, levels = [merged.get("downsamplingFactors", [1] * rank)], [merged]
    else:
        all_factors = merged["scales"]
        levels = [merged_attributes(n5, f"{path}/s{i}".lstrip("/")) for i in range(len(all_factors))]
    assert len({level["dataType"] for level in levels}) == 1, f"{path}: levels of several data types"
    assert all(level["compression"]["type"] in ENCODINGS for level in levels), f"{path}: {levels}"
    assert all(len(level["dimensions"]) == len(f) == rank for level, f in zip(levels, all_factors, strict=True))
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
