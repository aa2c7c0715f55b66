"""What the CLI says on a fresh trial (the frictions of issue 31): each one a user met, through the real CLI in a
subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.support import peers
from tests.support.cli import SHARDFS, one_line_error, shardfs
from tests.support.cloud import moto_server
from tests.support.http_server import RangeServer

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes]]:
    root = tmp_path_factory.mktemp("first") / "kv"
    return root, peers.write_tensorstore_kv(root, {k: bytes([k]) * (k + 1) for k in range(40)})


BLOCK_CRC32C = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):  # as if only shardfs's own dependencies were installed
    def find_spec(self, name, path=None, target=None):
        if name == "crc32c":
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Refuse())
import pkgutil, shardfs

for module in pkgutil.walk_packages(shardfs.__path__, "shardfs."):
    if module.name != "shardfs.__main__":
        importlib.import_module(module.name)
"""


def test_no_deprecation_warning_on_import() -> None:
    """numcodecs warns on import when the old `crc32c` package is what it finds; shardfs needs only
    google-crc32c, which numcodecs takes without a word. Every module imports with warnings as errors."""
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", BLOCK_CRC32C], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_mistyped_command_or_option_is_told_the_nearest(kv) -> None:
    for typo in ("mout", "mnt"):  # "mnt" with two operands once read as the fstab form, "unrecognized arguments"
        one_line_error(shardfs(typo, kv[0], "/mnt", check=False), 2, "did you mean 'mount'?")
    one_line_error(shardfs("ls", kv[0], "--cach-size", "1G", check=False), 2, "did you mean '--cache-size'?")
    one_line_error(shardfs("ls", kv[0], "--frobnicate", check=False), 2, "unrecognized arguments: --frobnicate")


def test_ls_long_shows_the_sizes_the_mount_shows(kv, mount) -> None:
    root, values = kv
    m = mount(root)
    lines = shardfs("ls", "-l", root).stdout.splitlines()
    assert len(lines) == len(os.listdir(m.path))
    for line in lines:
        size, name = line.split()
        shown = os.stat(m.path / name.rstrip("/"))
        assert size == ("-" if name.endswith("/") else str(shown.st_size)), line
    assert f"{len(values[7]):>12} 7" in lines


def test_cat_of_a_missing_path_names_it_whole(kv) -> None:
    done = shardfs("cat", kv[0], "no/such/chunk", check=False)
    one_line_error(done, 1, "no/such/chunk: not in the virtual tree of", str(kv[0]))


def test_unmount_of_a_busy_mount_names_what_holds_it_and_lazy_detaches(kv, mount) -> None:
    m = mount(kv[0])
    holder = subprocess.Popen(["sleep", "600"], cwd=m.path)
    try:
        refused = shardfs("unmount", m.path, check=False)
        one_line_error(refused, 1, f"pid {holder.pid} (sleep: working directory)", "--lazy")
        assert os.path.ismount(m.path)
        shardfs("unmount", "--lazy", m.path)
        assert not os.path.ismount(m.path)
    finally:
        holder.kill()
        holder.wait()


def test_anonymous_refused_says_to_drop_it(kv) -> None:
    with RangeServer(kv[0]).running() as server:
        server.always = 403
        done = shardfs("ls", server.url, "--anonymous", check=False)
    one_line_error(done, 2, "cannot be reached", "drop --anonymous")


def test_a_missing_bucket_is_said_in_those_words(monkeypatch, tmp_path) -> None:
    """It was named inside some 300 characters of object_store's request, retry and XML internals."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_server() as endpoint:
        said = [
            shardfs(*command, "s3://nosuchbucket/vol", *where, "--endpoint", endpoint, check=False)
            for command, where in ((["ls"], []), (["mount"], [tmp_path]))
        ]
    for done in said:
        assert done.returncode == 2, done.stderr
        assert (
            done.stderr == f"shardfs: s3://nosuchbucket/vol: bucket 'nosuchbucket' does not exist (at {endpoint});"
            " check the bucket's name\n"
        )
    assert not os.path.ismount(tmp_path)


def test_info_over_http_does_not_call_unlisted_shards_missing(tmp_path) -> None:
    """A web server cannot list: `info` says so, not "0 present" of shards that are all there."""
    root = tmp_path / "a.zarr"
    array = peers.create_tensorstore_zarr3(root, [40, 36], "uint16", [20, 18], [5, 6])
    array.write(np.ones((40, 36), np.uint16)).result()
    with RangeServer(root, suffix_ranges=True).running() as server:
        said = shardfs("info", f"zarr3://{server.url}").stdout
    assert "shard files: 4 in the grid; not counted (the server cannot list them)" in said, said
    assert "0 present" not in said


def test_a_url_missing_a_slash_says_so(kv, tmp_path) -> None:
    """`s3:/bucket/x` was read as a relative path: an --endpoint "ignored" line, then "does not exist"."""
    for source, meant in (("s3:/bucket/x", "s3://bucket/x"), ("https:host/x", "https://host/x")):
        for command in (["mount", source, tmp_path, "--endpoint", "http://127.0.0.1:9"], ["ls", source]):
            done = shardfs(*command, check=False)
            one_line_error(done, 2, f"{source}: looks like a URL without '://'", f"write {meant},", f"./{source}")
    (tmp_path / "s3:").symlink_to(kv[0].parent)  # a local path so named is still reached, as the message says
    done = subprocess.run([*SHARDFS, "ls", f"./s3:/{kv[0].name}"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "7\n" in done.stdout, done.stderr


def test_a_directory_holding_datasets_is_shown_whole(kv, tmp_path, monkeypatch) -> None:
    """/data holding /data/a.zarr and /data/vol/info is no dataset itself, and was refused; now it is shown as
    stored, each dataset in it unsharded, locally and in a bucket (the loopback server as GCS), as the
    Neuroglancer URL users paste names it too."""
    data = tmp_path / "bkt" / "data"
    zarr.create_array(data / "a.zarr", shape=(4,), chunks=(2,), dtype="uint8")
    shutil.copytree(kv[0], data / "vol")
    (data / "notes").mkdir()
    (data / "notes" / "a.txt").write_text("not a dataset")
    (data / "README").write_text("")
    for name in ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    with RangeServer(tmp_path).running() as server:
        for source in (data, "gs://bkt/data", "precomputed://gs://bkt/data"):
            remote = ["--endpoint", server.url] if "gs:" in str(source) else []
            assert sorted(shardfs("ls", source, *remote).stdout.split()) == ["README", "a.zarr/", "notes/", "vol/"]
            listed = shardfs("ls", source, "vol", *remote).stdout.split()
            assert sorted(listed) == sorted([*map(str, range(40)), "info"])
            assert shardfs("cat", source, "notes/a.txt", *remote).stdout == "not a dataset"
