"""What the views make of any OME-Zarr axes and transforms and any `dimension_names` a source may hold:
served (the metadata the views write strict JSON, every chunk readable) or refused in one line, never a
crash; and the SI symbols N5 readers take for OME-Zarr's unit names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardfs.views.axes import si_unit
from tests.support.fuzzing import FUZZ, open_or_refuse, walk

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# Sizes that are no size (0, negative, NaN, infinite, a bool, a string) or past what a float holds.
SIZE = st.sampled_from([0.5, 4, 1, 0, -1, 2**1100, 1e308, float("inf"), float("nan"), True, "1"])
NUMBERS = st.lists(SIZE, min_size=2, max_size=2) | st.lists(SIZE, max_size=3)
AXIS = st.fixed_dictionaries(
    {"name": st.sampled_from(["y", "x", "y", None, 3]), "unit": st.sampled_from(["micrometer", "parsec", "gallon", 7])}
)
AXES_YX = [{"name": "y", "unit": "micrometer"}, {"name": "x", "unit": "micrometer"}]
PARSECS = [{"name": "y", "unit": "parsec"}, {"name": "x", "unit": "parsec"}]  # 1e299 of them is no float of metres
AXIS_KEYS = {"_ARRAY_DIMENSIONS", "axes", "units", "resolution", "pixelResolution", "downsamplingFactors"}
TRANSFORMS = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["scale", "translation"]), "scale": NUMBERS}))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("axes") / "image.zarr"
    group = zarr.open_group(root, mode="w")
    group.create_array("s0", shape=(9, 7), dtype="uint16", chunks=(4, 4), shards=(8, 8))[...] = np.arange(63).reshape(
        9, 7
    )
    return root


@settings(FUZZ, max_examples=150)
@given(
    axes=st.lists(AXIS, min_size=2, max_size=2) | st.lists(AXIS, max_size=3) | ANY_JSON,
    own=TRANSFORMS | ANY_JSON,
    common=TRANSFORMS | ANY_JSON,
    names=st.lists(st.sampled_from(["y", "x", "y", None]), min_size=2, max_size=2) | ANY_JSON,
    view=st.sampled_from(["n5", "zarr2"]),
)
@example(axes=AXES_YX, own=[{"type": "scale", "scale": [2**1100, 1]}], common=[], names=None, view="n5")
@example(axes=AXES_YX, own=[], common=[{"type": "scale", "scale": [float("inf"), 1]}], names=None, view="n5")
@example(axes=AXES_YX, own=[{"type": "scale", "scale": [float("nan"), 1]}], common=[], names=["y", "y"], view="zarr2")
@example(axes=PARSECS, own=[{"type": "scale", "scale": [1e299, 1]}], common=[], names=None, view="n5")
def test_any_axes_are_served_or_refused(source: Path, axes, own, common, names, view: str) -> None:
    group, array = json.loads((source / "zarr.json").read_text()), json.loads((source / "s0" / "zarr.json").read_text())
    multiscale = {"axes": axes, "datasets": [{"path": "s0", "coordinateTransformations": own}],
                  "coordinateTransformations": common}  # fmt: skip
    try:
        (source / "zarr.json").write_text(json.dumps({**group, "attributes": {"ome": {"multiscales": [multiscale]}}}))
        (source / "s0" / "zarr.json").write_text(json.dumps({**array, "dimension_names": names}))
        opened = open_or_refuse(source, view)
        if opened is None:
            return
        written = {p: d for p, d in walk(opened.tree).items() if p.endswith((".zattrs", ".zarray", "attributes.json"))}
        assert written
        for path, data in written.items():
            assert isinstance(data, bytes), path
            said = {k: v for k, v in json.loads(data).items() if k in AXIS_KEYS}  # the rest is the source's own
            json.dumps(said, allow_nan=False)  # strict JSON: no NaN or Infinity
    finally:
        (source / "zarr.json").write_text(json.dumps(group))
        (source / "s0" / "zarr.json").write_text(json.dumps(array))


@pytest.mark.parametrize(
    ("unit", "si"),
    [("nanometer", (1, "nm")), ("micrometer", (1, "um")), ("meter", (1, "m")), ("millisecond", (1, "ms")),
     ("angstrom", (0.1, "nm")), ("hour", (3600, "s")), (None, (1, "")), ("gallon", (1, None)),
     ("nanoparsec", (1, None))],
)  # fmt: skip
def test_ome_units_as_si_symbols(unit, si) -> None:
    assert si_unit(unit) == si
