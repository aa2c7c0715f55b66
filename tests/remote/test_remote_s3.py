"""Sources in an S3 bucket: moto's S3 server on loopback, datasets written by zarr-python and tensorstore and
uploaded as they are, mounted with --endpoint, read back through the kernel by the same peers and compared
with the source; listing from delimited S3 listings; both views; `shardfs check`; credentials."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest
import tensorstore as ts
import zarr
from cloudvolume import CloudVolume

from tests.support import peers
from tests.support.cli import shardfs
from tests.support.cloud import BUCKET, moto_server, upload
from tests.support.daemons import wait_until
from tests.support.peers import write_zarr_python

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}  # moto takes any


def credentials() -> dict[str, str]:
    return {k.lower(): v for k, v in KEYS.items()}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    """(endpoint, what was written): a zarr hierarchy at brain.zarr/ and a precomputed volume at vol/."""
    with moto_server() as endpoint:
        root = tmp_path_factory.mktemp("s3")
        # boto3, moto's own client, writes the bucket: shardfs only ever reads.
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **credentials())
        client.create_bucket(Bucket=BUCKET, ACL="public-read")
        contents = write_zarr_python(root / "brain.zarr")
        upload(client, root / "brain.zarr", "brain.zarr")
        expected = peers.write_tensorstore_volume(root / "vol", unsharded_twin=root / "twin")
        upload(client, root / "vol", "vol")
        yield endpoint, {"zarr": contents, "volume": expected, "twin": root / "twin", "zarr_root": root / "brain.zarr"}


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)


def test_zarr_hierarchy_over_s3_read_by_zarr_python_and_tensorstore(s3, keys, mount) -> None:
    endpoint, written = s3
    m = mount(f"s3://{BUCKET}/brain.zarr", "--endpoint", endpoint)
    group = zarr.open_group(m.path, mode="r")
    assert group.attrs["note"] == "kept"
    for name, expected in written["zarr"].items():
        assert group[name].shards is None, name
        assert np.array_equal(group[name][...], expected), name
        array = ts.open({"driver": "zarr3", "kvstore": f"file://{m.path / name}"}).result()
        assert np.array_equal(array.read().result(), expected), name
    # Listing comes from S3's delimited listings, exactly as the local mount lists it.
    assert sorted(os.listdir(m.path / "gzip" / "c"), key=int) == [str(i) for i in range(9)]
    assert sum(len(files) for _, _, files in os.walk(m.path / "nested")) == 1 + 6 * 6
    assert "zarr.json" in os.listdir(m.path) and "deep" in os.listdir(m.path)


def test_precomputed_over_s3_anonymous(s3, mount) -> None:
    endpoint, written = s3
    twin = written["twin"]
    m = mount(f"precomputed://s3://{BUCKET}/vol", "--endpoint", endpoint, "--anonymous")
    assert sorted(os.listdir(m.path / "4_4_40")) == sorted(os.listdir(twin / "4_4_40"))
    for name in os.listdir(twin / "4_4_40"):
        assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
    assert json.loads((m.path / "info").read_text()) == json.loads((twin / "info").read_text())
    assert sorted(os.listdir(m.path / "8_8_40")) == sorted(os.listdir(twin / "8_8_40"))  # unsharded: passes through
    cv = CloudVolume(f"file://{m.path}", mip=0, fill_missing=True, progress=False)
    assert np.array_equal(np.asarray(cv[cv.bounds]), written["volume"])


def test_df_over_s3_shows_the_bytes_under_the_prefix(s3, mount) -> None:
    """`df`'s size is the objects' bytes under the source's prefix (not the bucket's), from S3's listing."""
    endpoint, written = s3
    files = [p for p in (written["twin"].parent / "vol").rglob("*") if p.is_file()]
    stored = -(-sum(p.stat().st_size for p in files) // 512) * 512
    m = mount(f"precomputed://s3://{BUCKET}/vol", "--endpoint", endpoint, "--anonymous")
    wait_until(lambda: os.statvfs(m.path).f_files >= len(files))
    st = os.statvfs(m.path)
    assert (st.f_blocks * st.f_frsize, st.f_files) == (stored, len(files))


@pytest.mark.parametrize("view", ["n5", "zarr2"])
def test_views_over_s3(s3, keys, mount, view) -> None:
    endpoint, written = s3
    m = mount(f"s3://{BUCKET}/brain.zarr", "--endpoint", endpoint, "--view", view)
    for name in ("gzip", "raw", "nested"):
        expected = written["zarr"][name]
        if view == "n5":
            got = ts.open({"driver": "n5", "kvstore": f"file://{m.path / name}"}).result().read().result()
            assert np.array_equal(np.asarray(got).transpose(), expected), name  # N5 lists dimensions fastest first
        else:
            got = zarr.open_array(m.path / name, mode="r", zarr_format=2)[...]
            assert np.array_equal(got, expected), name
    vol = mount(f"s3://{BUCKET}/vol", "--endpoint", endpoint, "--view", view)
    assert any(vol.path.iterdir())


def test_check_and_info_over_s3(s3, keys) -> None:
    endpoint, _ = s3
    r = shardfs("check", f"s3://{BUCKET}/brain.zarr", "--endpoint", endpoint, check=False)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("OK:"), r.stdout + r.stderr
    r = shardfs("check", f"s3://{BUCKET}/vol", "--endpoint", endpoint, check=False)
    assert r.returncode == 0 and "4 shard files" in r.stdout, r.stdout + r.stderr
    r = shardfs("info", f"s3://{BUCKET}/vol", "--endpoint", endpoint)
    assert r.stdout.startswith(f"source: s3://{BUCKET}/vol")


def test_unsigned_without_credentials_and_with_anonymous(s3, monkeypatch) -> None:
    endpoint, _ = s3
    for k in KEYS:
        monkeypatch.delenv(k, raising=False)
    r = shardfs("ls", f"s3://{BUCKET}/vol", "--endpoint", endpoint, "--log-level", "INFO")
    assert "no credentials found; requests are sent unsigned" in r.stderr and "info" in r.stdout.split()
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    r = shardfs("ls", f"s3://{BUCKET}/vol", "--endpoint", endpoint, "--log-level", "INFO")
    assert "unsigned" not in r.stderr and "info" in r.stdout.split()
    r = shardfs("ls", f"s3://{BUCKET}/nothing/here", "--endpoint", endpoint, check=False)
    assert r.returncode == 2 and f"s3://{BUCKET}/nothing/here" in r.stderr


def requests_made(mountpoint: Path) -> Counter[str]:
    """The requests the daemon has sent, by kind (head, get, list), from its own figures."""
    figures = shardfs("stats", mountpoint, "--prometheus").stdout
    found = re.findall(r'^shardfs_remote_request_seconds_count\{request="(\w+)"\} (\S+)$', figures, re.MULTILINE)
    return Counter({kind: int(float(n)) for kind, n in found})


def test_a_cold_zarr_chunk_over_s3_costs_two_gets_and_no_head(s3, keys, mount) -> None:
    """On S3 (moto), as on the loopback web server: a fresh mount reads a sharded array's first inner chunk
    with a suffix GET of its shard's index and a GET of the chunk, no HEAD; the bytes are zarr-python's."""
    endpoint, written = s3
    m = mount(f"s3://{BUCKET}/brain.zarr", "--endpoint", endpoint)
    before = requests_made(m.path)
    assert (m.path / "raw" / "c" / "0" / "0").read_bytes() == written["zarr"]["raw"][:5, :6].tobytes()
    assert requests_made(m.path) - before == Counter({"get": 2})
