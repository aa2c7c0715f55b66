"""What the views carry of an array's axes: names, units and the size of a voxel along each, gathered from
what the source says of them (zarr v3 `dimension_names`, the OME-Zarr `multiscales` of the group above, a
precomputed scale's resolution in nm). Everything is in C order, slowest dimension first."""

from __future__ import annotations

import math
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shardfs.formats.plan import Plan

# OME-Zarr names its units in words; N5 readers (Neuroglancer, tensorstore) take SI symbols.
PREFIXES = {
    "yocto": "y", "zepto": "z", "atto": "a", "femto": "f", "pico": "p", "nano": "n", "micro": "u", "milli": "m",
    "centi": "c", "deci": "d", "": "", "deca": "da", "hecto": "h", "kilo": "k", "mega": "M", "giga": "G",
    "tera": "T", "peta": "P", "exa": "E", "zetta": "Z", "yotta": "Y",
}  # fmt: skip
OTHER_UNITS = {  # OME-Zarr's units that are not an SI prefix on metre or second: (factor, SI unit)
    "angstrom": (0.1, "nm"), "inch": (0.0254, "m"), "foot": (0.3048, "m"), "yard": (0.9144, "m"),
    "mile": (1609.344, "m"), "parsec": (3.0856775814913673e16, "m"), "minute": (60, "s"), "hour": (3600, "s"),
    "day": (86400, "s"),
}  # fmt: skip


@dataclass(frozen=True)
class Axes:
    """One array's axes, as much of them as the source says."""

    names: tuple[str | None, ...]  # None where the source names no axis
    units: tuple[str | None, ...]  # in OME-Zarr's words ('nanometer'); None: none (a channel) or not said
    scale: tuple[float, ...] | None  # a voxel's size along each axis in those units, if the source says

    def labels(self) -> list[str] | None:
        """The names, if every axis has one of its own (what `_ARRAY_DIMENSIONS` and N5's `axes` need)."""
        if not all(self.names) or len(set(self.names)) != len(self.names):
            return None
        return [str(name) for name in self.names]

    def si(self) -> tuple[list[str], list[float]] | None:
        """(units as SI symbols, '' for none, and the voxel size in them), if the scale and every unit are
        known: N5 readers take both or neither."""
        if self.scale is None:
            return None
        units, sizes = [], []
        for unit, size in zip(self.units, self.scale, strict=True):
            factor, symbol = si_unit(unit)
            if symbol is None or not math.isfinite(size * factor):
                return None
            units.append(symbol)
            sizes.append(size * factor)
        return units, sizes


def si_unit(unit: str | None) -> tuple[float, str | None]:
    """(factor, SI symbol) of an OME-Zarr unit: 'micrometer' is (1, 'um'); (1, None) if it is not one."""
    if unit is None:
        return 1, ""
    if unit in OTHER_UNITS:
        return OTHER_UNITS[unit]
    for base, symbol in (("meter", "m"), ("second", "s")):
        prefix = unit.removesuffix(base)
        if unit.endswith(base) and prefix in PREFIXES:
            return 1, PREFIXES[prefix] + symbol
    return 1, None


def axes_of(plan: Plan) -> dict[str, Axes]:
    """The axes of each array of the plan that the source says anything of, by array path."""
    found: dict[str, Axes] = {}
    if plan.format == "precomputed":
        for path, array in plan.arrays.items():
            lead = len(array.shape) - 3  # the channel, if there are several
            resolution = [float(r) for r in array.multiscale["resolution"][::-1]]
            found[path] = Axes(("c",) * lead + ("z", "y", "x"), (None,) * lead + ("nanometer",) * 3,
                               (1.0,) * lead + tuple(resolution))  # fmt: skip
        return found
    for _, levels in _ome_multiscales(plan.groups):
        for path, axes in levels:
            if path in plan.arrays and len(axes.names) == len(plan.arrays[path].shape):
                found[path] = axes
    for path, array in plan.arrays.items():  # zarr's own names first, unless they leave out what OME-Zarr names
        names = array.dimension_names
        if names and any(names) and (all(names) or path not in found):
            ome = found.get(path)
            found[path] = Axes(names, ome.units if ome else (None,) * len(names), ome.scale if ome else None)
    return found


def pyramids(plan: Plan) -> dict[str, list[str]]:
    """The array paths of each scale pyramid, finest first, by the group that holds it: a precomputed
    volume's scales, and each OME-Zarr image's levels."""
    if plan.format == "precomputed":
        return {"": list(plan.arrays)}
    return {group: [path for path, _ in levels] for group, levels in _ome_multiscales(plan.groups) if levels}


def _ome_multiscales(groups: dict[str, dict[str, Any]]) -> Iterator[tuple[str, list[tuple[str, Axes]]]]:
    """(group, [(array path, axes)]) of every OME-Zarr multiscale (0.5 under `ome`, or 0.4), its datasets
    in order, each with the scale of its transforms composed with those of the multiscale itself."""
    for group, attributes in groups.items():
        ome = attributes.get("ome") if isinstance(attributes.get("ome"), dict) else attributes
        for multiscale in _objects(ome.get("multiscales")):
            axes = [a if isinstance(a, dict) else {"name": a} for a in _list(multiscale.get("axes"))]
            names = tuple(a.get("name") if isinstance(a.get("name"), str) else None for a in axes)
            units = tuple(a.get("unit") if isinstance(a.get("unit"), str) else None for a in axes)
            common = _scale(multiscale.get("coordinateTransformations"), len(axes)) or (1.0,) * len(axes)
            levels = []
            for dataset in _objects(multiscale.get("datasets")):
                own = _scale(dataset.get("coordinateTransformations"), len(axes))
                scale = None if own is None else tuple(a * b for a, b in zip(own, common, strict=True))
                if isinstance(dataset.get("path"), str):
                    path = posixpath.normpath(posixpath.join(group, dataset["path"]))
                    levels.append(("" if path == "." else path, Axes(names, units, scale)))
            yield group, levels


def _scale(transforms: Any, ndim: int) -> tuple[float, ...] | None:
    """The product of the `scale` transforms of a list (translations do not change a voxel's size)."""
    found = None
    for t in _objects(transforms):
        scale = t.get("scale")
        if t.get("type") == "scale" and isinstance(scale, list) and len(scale) == ndim:
            if not all(isinstance(s, int | float) and not isinstance(s, bool) and 0 < s < 1e300 for s in scale):
                return None  # what no reader can use (and what float() and JSON cannot hold) names no size
            found = tuple(float(s) * f for s, f in zip(scale, found or (1.0,) * ndim, strict=True))
    return found


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _objects(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON list (metadata is the source's: anything else in it is passed over)."""
    return [v for v in _list(value) if isinstance(v, dict)]
