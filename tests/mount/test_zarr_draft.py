"""The 2022 sharding storage transformer draft, written and read back by zarr-python 2.18, which conflicts
with zarr-python 3 and so runs from its own virtual environment (.venv-zarr2, made by scripts/setup)."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.cli import shardfs
from tests.support.zarr2 import run

pytestmark = [pytest.mark.kernel]

WRITE = """
import sys, numpy as np, zarr
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer as T
root, out = sys.argv[1], sys.argv[2]
store = zarr.DirectoryStoreV3(root)
rng = np.random.default_rng(0)
cases = {
    "grp/arr": ((20, 25), "i4", (4, 5), (2, 3), "/", None),
    "grp/deeper/blosc": ((33, 17, 5), "f8", (4, 4, 5), (2, 2, 1), ".", "default"),
    "plain": ((10, 10), "u1", (5, 5), None, "/", "default"),
}
saved = {}
for name, (shape, dtype, chunks, per_shard, sep, compressor) in cases.items():
    kw = {} if compressor == "default" else {"compressor": None}
    transformers = [T("indexed", chunks_per_shard=per_shard)] if per_shard else []
    z = zarr.create(shape, chunks=chunks, dtype=dtype, store=store, path=name, zarr_version=3, fill_value=0,
                    storage_transformers=transformers, dimension_separator=sep, **kw)
    data = (rng.random(shape) * 100).astype(dtype)
    part = tuple(slice(0, s * 2 // 3) for s in shape)
    z[part] = data[part]
    saved[name.replace("/", "__")] = z[...]
np.savez(out, **saved)
"""

READ = """
import sys, json, numpy as np, zarr

root, expected = sys.argv[1], np.load(sys.argv[2])
store = zarr.DirectoryStoreV3(root)
report = {}
for key in expected.files:
    z = zarr.open_array(store, path=key.replace("__", "/"), mode="r", zarr_version=3)
    report[key] = {"equal": bool(np.array_equal(z[...], expected[key])), "chunks": list(z.chunks),
                   "transformers": len(getattr(z, "_storage_transformers", None) or [])}
print(json.dumps(report))
"""


def test_zarr_python_2_reads_the_draft_unsharded(tmp_path, mount) -> None:
    root, expected = tmp_path / "draft", tmp_path / "expected.npz"
    run(WRITE, root, expected)
    assert (root / "data/root/grp/arr/c0/0").is_file()  # shards in the draft's own layout
    m = mount(root)

    report = json.loads(run(READ, m.path, expected))
    assert report == {
        "grp__arr": {"equal": True, "chunks": [4, 5], "transformers": 0},
        "grp__deeper__blosc": {"equal": True, "chunks": [4, 4, 5], "transformers": 0},
        "plain": {"equal": True, "chunks": [5, 5], "transformers": 0},
    }
    meta = json.loads((m.path / "meta/root/grp/arr.array.json").read_text())
    assert "storage_transformers" not in meta and meta["chunk_grid"]["chunk_shape"] == [4, 5]
    # [:13, :16] written in (4, 5) chunks: rows 0-3, columns 0-3, as c<i>/<j> with global inner indices.
    arr = m.path / "data/root/grp/arr"
    assert sorted(os.listdir(arr)) == ["c0", "c1", "c2", "c3"]
    assert sorted(os.listdir(arr / "c3")) == ["0", "1", "2", "3"]
    assert (arr / "c3" / "3").stat().st_size == 4 * 5 * 4  # uncompressed int32 chunk
    flat = sorted(os.listdir(m.path / "data/root/grp/deeper/blosc"))
    assert flat == sorted(f"c{i}.{j}.0" for i in range(6) for j in range(3))  # separator "." from chunk_grid


@pytest.mark.parametrize("view", ["n5", "zarr2"])
def test_views_refuse_the_draft_in_one_line(tmp_path, view) -> None:
    """The views show zarr v3 and precomputed arrays; a draft source is refused, exit 2, nothing mounted."""
    root = tmp_path / "draft"
    run(WRITE, root, tmp_path / "expected.npz")
    (tmp_path / "m").mkdir()
    refused = shardfs("mount", root, tmp_path / "m", "--view", view, check=False)
    assert refused.returncode == 2 and not os.path.ismount(tmp_path / "m")
    assert refused.stderr == f"shardfs: {root}: --view {view} shows zarr v3 and precomputed volumes, not a zarr draft\n"
