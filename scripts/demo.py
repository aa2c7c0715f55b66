"""Build a small sharded segmentation dataset (volume, skeletons, meshes), mount it with shardfs, and
read it back through the mount as the unsharded dataset: a chunk, a skeleton and a mesh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorstore as ts
from cloudvolume import CloudVolume

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support import peers  # the same peer writers the tests use

SHARDFS = [sys.executable, "-m", "shardfs"]


def build(root: Path, scratch: Path) -> np.ndarray:
    """A segmentation volume sharded by tensorstore, plus skeletons and multi-resolution meshes
    sharded by cloud-volume, linked from the root info as a real segmentation layer links them."""
    labels = peers.write_tensorstore_volume(
        root, dtype="uint64", encoding="compressed_segmentation", extra_unsharded_scale=False
    )
    peers.write_cloudvolume_skeletons(scratch / "skel")
    peers.write_cloudvolume_multires_meshes(scratch / "mesh")
    shutil.move(scratch / "skel" / "skeletons", root / "skeletons")
    shutil.move(scratch / "mesh" / "mesh", root / "mesh")
    info = json.loads((root / "info").read_text())
    info.update(type="segmentation", skeletons="skeletons", mesh="mesh")
    (root / "info").write_text(json.dumps(info))
    return labels


def show(title: str, command: list[str]) -> str:
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    print(f"$ {' '.join(map(str, command))}   # {title}\n{out.rstrip()}\n")
    return out


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="shardfs-demo-"))
    source, mountpoint = work / "fafb_seg", work / "mnt"
    mountpoint.mkdir()
    labels = build(source, work)
    show("the source: shard files", ["find", source, "-name", "*.shard"])
    show("what shardfs detects", [*SHARDFS, "info", source])
    show("mount; returns once the mount is live", [*SHARDFS, "mount", source, mountpoint])
    try:
        show("the unsharded layout", ["ls", mountpoint, mountpoint / "skeletons", mountpoint / "mesh"])
        chunks = sorted(os.listdir(mountpoint / "4_4_40"))
        print(f"4_4_40/ holds {len(chunks)} chunk files, e.g. {chunks[:3]}")
        with open(mountpoint / "4_4_40" / chunks[0], "rb") as f:
            print(f"plain open() of 4_4_40/{chunks[0]}: {len(f.read())} bytes of compressed_segmentation\n")

        mounted = ts.open({"driver": "neuroglancer_precomputed", "kvstore": f"file://{mountpoint}"}).result()
        same = np.array_equal(mounted.read().result(), labels)
        print(f"tensorstore reads the mount as an unsharded volume; equal to the sharded source: {same}")
        cv = CloudVolume(f"file://{mountpoint}", progress=False)
        segid = peers.SKELETON_IDS[3]
        skeleton = cv.skeleton.get(segid)
        print(f"cloud-volume reads skeleton {segid}: {len(skeleton.vertices)} vertices, {len(skeleton.edges)} edges")
        segid = peers.MESH_IDS[1]
        mesh = cv.mesh.get(segid, lod=0)[segid]
        print(f"cloud-volume reads mesh {segid} (lod 0): {len(mesh.vertices)} vertices, {len(mesh.faces)} faces")
        print(f"cloud-volume took the unsharded path for meshes: {not cv.mesh.meta.is_sharded()}")
        if not same:
            raise SystemExit("demo: the mount disagrees with the source")
    finally:
        show("unmount", [*SHARDFS, "unmount", mountpoint])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
