"""Other presentations of a source's arrays (`--view`): what a format planned, translated to N5 or zarr v2."""

from __future__ import annotations

from shardfs.errors import SourceError
from shardfs.formats.plan import Category, Finding, Plan
from shardfs.views.chunks import nbytes
from shardfs.views.n5 import n5_view
from shardfs.views.zarr2 import zarr2_view

VIEWS = {"n5": n5_view, "zarr2": zarr2_view}


def view_of(plan: Plan, view: str) -> Plan:
    """The plan of a view of the source; SourceError, in one sentence, if the view has nothing to show."""
    root = plan.store.where("")
    if plan.format not in ("zarr", "precomputed"):
        raise SourceError(f"{root}: --view {view} shows zarr v3 and precomputed volumes, not a {plan.format}")
    for path, array in list(plan.arrays.items()):  # a chunk decoded must fit one file's cap
        if (size := nbytes(array.chunks, array.dtype)) > plan.cache.max_value:
            plan.report.append(
                Finding(f"{path or '.'}: chunks of {size} bytes exceed --max-file-size", Category.NOT_IN_VIEWS)
            )
            del plan.arrays[path]
    if not plan.arrays:
        raise SourceError(f"{root}: holds no array that --view {view} can show ({'; '.join(map(str, plan.report))})")
    return VIEWS[view](plan)
