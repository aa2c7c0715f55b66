"""Sources built to hurt: a gzip bomb, an absurd minishard_bits, a FIFO or a directory where a shard should
be, links that lead out of the source, and a caller that holds extra descriptors. Each must give a prompt
error for that file alone; the daemon must stay small and keep serving.

The shards here are crafted byte by byte (the corruption needs that control); peer-written datasets are
the proof of correctness elsewhere."""

from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest

from tests.support.cli import SHARDFS, scrape, shardfs
from tests.support.daemons import wait_for
from tests.support.peers import kv_dataset
from tests.support.reading import assert_eio

pytestmark = [pytest.mark.kernel]


def test_the_crafted_writer_round_trips(tmp_path, mount) -> None:
    values = {1: b"one", 2: b"", 5: b"five" * 100, 2**64 - 1: b"max"}
    m = mount(kv_dataset(tmp_path / "kv", values, minishard_bits=2))
    assert {int(n) for n in os.listdir(m.path) if n != "info"} == set(values)
    assert all((m.path / str(k)).read_bytes() == v for k, v in values.items())


def test_absurd_minishard_bits_lists_promptly(tmp_path, mount) -> None:
    root = kv_dataset(tmp_path / "kv", {1: b"x"})
    info = json.loads((root / "info").read_text())
    info["sharding"]["minishard_bits"] = 40  # a shard index of 16 TiB, in a 41-byte file
    (root / "info").write_text(json.dumps(info))
    (root / "0.shard").write_bytes(bytes(41))
    m = mount(root)
    before = scrape(shardfs("stats", "--prometheus", m.path).stdout)
    listed = subprocess.run(["ls", m.path], capture_output=True, text=True, timeout=60)  # a hang fails, not stalls
    assert listed.stdout.split() == ["info"]
    after = scrape(shardfs("stats", "--prometheus", m.path).stdout)
    read_bytes = ("shardfs_store_read_bytes_total", frozenset())
    assert after[read_bytes] - before[read_bytes] <= 41  # the work counted: no more than the file holds
    assert_eio(m.path / "1")
    assert m.log_text().count("shorter than its") <= 3  # one line per request, not per minishard


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_special_file_where_a_shard_should_be(tmp_path, mount, kind) -> None:
    root = kv_dataset(tmp_path / "kv", {1: b"x"})
    (root / "0.shard").unlink()
    os.mkfifo(root / "0.shard") if kind == "fifo" else (root / "0.shard").mkdir()
    m = mount(root)
    done = subprocess.run(["cat", m.path / "1"], capture_output=True, timeout=60)  # must not hang
    assert done.returncode != 0
    assert sorted(os.listdir(m.path)) == ["info"]
    cli = subprocess.run([*SHARDFS, "ls", root], capture_output=True, text=True, timeout=30)
    assert cli.stdout.split() == ["info"]


def test_links_out_of_the_source_are_not_followed(tmp_path, mount) -> None:
    root = kv_dataset(tmp_path / "kv", {1: b"x"})
    (root / "passwd").symlink_to("/etc/passwd")
    (root / "loop").symlink_to(".")
    (root / "extra").mkdir()
    (root / "extra" / "readme.txt").write_text("kept")
    m = mount(root)
    assert sorted(os.listdir(m.path)) == ["1", "extra", "info"]
    for name in ("passwd", "loop"):
        assert not (m.path / name).exists()
    assert shardfs("cat", root, "passwd", check=False).returncode == 1
    assert os.listdir(m.path / "extra") == ["readme.txt"]  # a subdirectory of a sharded directory: its own files
    assert (m.path / "extra" / "readme.txt").read_text() == "kept"


def test_inherited_descriptors_do_not_keep_the_caller_waiting(tmp_path) -> None:
    root = kv_dataset(tmp_path / "kv", {1: b"x"})
    point = tmp_path / "m"
    point.mkdir()
    script = f"( {' '.join(SHARDFS)} mount {root} {point} --log-file {tmp_path}/log 7>&1 ) | cat; echo done"
    try:
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() == "done"
    finally:
        shardfs("unmount", point, check=False)

    def daemons() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline", "status"]) if str(point) in (p.info["cmdline"] or [])
                and p.info["status"] != psutil.STATUS_ZOMBIE]  # fmt: skip

    # the daemon ends with its mount: waited for (it may take a moment on a loaded machine), never left running
    assert wait_for(lambda: not daemons(), 60), daemons()


def test_self_referencing_metadata_refuses_in_one_line(tmp_path) -> None:
    root = tmp_path / "vol"
    root.mkdir()
    info = {"@type": "neuroglancer_multiscale_volume", "data_type": "uint8", "num_channels": 1, "mesh": "."}
    info["scales"] = [{"key": "s0", "size": [1, 1, 1], "chunk_sizes": [[1, 1, 1]], "encoding": "raw"}]
    (root / "info").write_text(json.dumps(info))
    assert shardfs("info", root).returncode == 0  # mesh pointing back at the volume is planned once
    (root / "info").write_text(json.dumps({"@type": "neuroglancer_annotations_v1", "relationships": 5}))
    refused = shardfs("info", root, check=False)
    assert refused.returncode == 2 and "field 'relationships' must be a list" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
