"""Remote sources at their edges (issue 33, class 4), against tests/support/http_server.py's RangeServer on loopback:
401 as well as 403; a password made of URL-special characters, in every place a secret could show; the GETs a
key costs where its minishard is empty; the order of a listing over many shards, stable and the local one."""

from __future__ import annotations

import base64
import errno
import json
import struct
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

from shardfs.shards.listing import LISTING_BLOCK, LISTING_BUDGET
from tests.support import peers
from tests.support.cli import shardfs
from tests.support.cloud import counted
from tests.support.datasets import home
from tests.support.http_server import RangeServer
from tests.support.peers import write_cloudvolume_kv
from tests.support.reading import read_errno

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes], dict]:
    """A cloud-volume key-value dataset of 16 shards of 8 minishards holding 40 keys: most minishards empty."""
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=3, shard_bits=4, data_encoding="raw")
    items = {key: f"value of {key}".encode() for key in range(1, 41)}
    root = tmp_path_factory.mktemp("edges") / "kv"
    write_cloudvolume_kv(root, spec, items)
    return root, items, spec


@pytest.mark.parametrize("status", [401, 403])
def test_a_refusal_is_eacces_whether_unauthenticated_or_forbidden(kv, mount, status) -> None:
    """401 (no or wrong credentials) and 403 (not allowed) are both EACCES, with a log line saying the server
    denied access; neither is taken for an absent object (ENOENT) or a failure (EIO)."""
    root, items, _ = kv
    with RangeServer(root).running() as server:
        m = mount(server.url)
        server.always = status
        assert read_errno(m.path / "1") == errno.EACCES
        server.always = None
        assert (m.path / "2").read_bytes() == items[2]
    assert "access denied by the server" in m.log_text()
    with RangeServer(root).running() as server:
        server.always = status
        refused = shardfs("ls", server.url, check=False)  # sent unsigned: said so, and where to look
        signed = shardfs("ls", server.url.replace("://", "://reader:pw@"), check=False)  # sent with credentials
    assert refused.returncode != 0 and "refuses unsigned requests, and no credentials were found" in refused.stderr
    assert signed.returncode != 0 and "refused these credentials" in signed.stderr, signed.stderr


# Every character a URL's userinfo must escape, and '%' itself, written escaped as a user must; and a password
# with '@' and the other characters a URL parser takes as they are, typed unescaped (the last '@' ends it).
PASSWORDS = {"escaped": "p@ss:w/rd?#[]%20 !$&'()*+,;=x", "as typed": "p@ss:w@rd!$&'()*+,;=x"}


@pytest.mark.parametrize("typed", PASSWORDS)
def test_a_password_of_url_special_characters_shows_nowhere(kv, mount, typed) -> None:
    """The password signs each request (Basic auth, the server refuses anything else), and neither it, its
    escaped spelling nor a piece of it after an '@' is in /proc/mounts, mountinfo, the DEBUG log,
    `shardfs list`, `shardfs stats` (text and Prometheus), `shardfs info` or any error the CLI prints."""
    root, items, _ = kv
    password = PASSWORDS[typed]
    written = quote(password, safe="") if typed == "escaped" else password
    basic = "Basic " + base64.b64encode(f"reader:{password}".encode()).decode()
    with RangeServer(root).running() as server:
        server.admit = lambda auth: auth == basic
        url = server.url.replace("http://", f"http://reader:{written}@")
        m = mount(url, "--log-level", "DEBUG")
        assert (m.path / "3").read_bytes() == items[3]
        said = [
            Path("/proc/mounts").read_text(),
            Path("/proc/self/mountinfo").read_text(),
            m.log_text(),
            shardfs("list").stdout,
            shardfs("stats", m.path).stdout,
            shardfs("stats", "--prometheus", m.path).stdout,
            shardfs("info", url).stdout,
        ]
        for failed in (shardfs("ls", f"{url}/nothing", check=False), shardfs("cat", url, "99999", check=False)):
            assert failed.returncode != 0, failed
            said.append(failed.stdout + failed.stderr)
        server.admit = lambda auth: False
        refused = shardfs("ls", url, "--log-level", "DEBUG", check=False)
        said.append(refused.stdout + refused.stderr)
    assert f"{server.url.replace('http://', 'http://***@')} {m.path} fuse.shardfs" in said[0]
    for text in said:
        for secret in (password, written, "ss:w", "w@rd", "rd!$", "p%40ss"):
            assert secret not in text, text


def test_a_key_whose_minishard_is_empty_costs_the_shard_index_alone(kv, mount) -> None:
    """A key in a minishard that holds nothing (the shard index says so: its range is empty) is absent after
    one GET, the shard's index, and is never asked for again; a key in the same shard's non-empty minishard
    then costs its minishard index and itself."""
    root, items, spec = kv
    homes = {home(spec, key) for key in items}
    shards = {shard for shard, _ in homes}
    absent = next(key for key in range(100, 10_000) if home(spec, key) not in homes and home(spec, key)[0] in shards)
    shard = home(spec, absent)[0]
    present = next(key for key in items if home(spec, key)[0] == shard)
    with RangeServer(root).running() as server:
        m = mount(server.url)
        before = counted(server)
        assert read_errno(m.path / str(absent)) == errno.ENOENT
        assert counted(server) - before == Counter({"GET": 1})
        before = counted(server)
        assert read_errno(m.path / str(absent)) == errno.ENOENT
        assert (m.path / str(present)).read_bytes() == items[present]
        assert counted(server) - before == Counter({"GET": 2})


def unsorted_listing(path: Path) -> list[str]:
    """The names in the order the mount gives them (`ls -f`: no sorting)."""
    done = subprocess.run(["ls", "-f", "-1", path], capture_output=True, text=True, check=True)
    return [name for name in done.stdout.splitlines() if name not in (".", "..")]


def test_a_remote_listing_over_many_shards_is_in_the_local_order_and_stable(kv, mount) -> None:
    """Over HTTP (shards found by probing each number) and from a bucket (listed by key, so `10.shard` before
    `2.shard`), the shards read many at a time and answered in any order: the names come in the order of a local
    mount of the same files (whose directory lists in its own hashed order), the same again and after a
    remount, so `ls -f`, rsync and tar see one tree."""
    root, items, _ = kv
    local = unsorted_listing(mount(root).path)
    assert sorted(local) == sorted([*map(str, items), "info"])
    listings = []
    with RangeServer(root, latency=0.01).running() as server:
        first = mount(server.url)
        listings += [
            unsorted_listing(first.path),
            unsorted_listing(first.path),
            unsorted_listing(mount(server.url).path),
        ]
    with RangeServer(root.parent.parent, latency=0.01).running() as server:
        bucket = mount(f"gs://{root.parent.name}/kv", "--endpoint", server.url, "--anonymous")
        listings.append(unsorted_listing(bucket.path))
    assert all(listing == local for listing in listings), (local, listings)


def write_paired_kv(root: Path, per_minishard: int) -> set[int]:
    """A one-shard key-value dataset (identity hash, minishard_bits 23: a 128 MiB shard index, on disk a hole
    the server streams as zeros), written by the spec's layout: 256 non-empty minishards in each 1 MiB block of
    the index, each holding per_minishard keys (minishard m: m, m + 2^23, ...), its values then its minishard
    index after them. Its keys."""
    bits = 23
    spec = peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=bits, shard_bits=0,
                               minishard_index_encoding="raw", data_encoding="raw")  # fmt: skip
    root.mkdir(parents=True)
    (root / "info").write_text(json.dumps({"sharding": spec}))
    index_size, per_block = 16 << bits, LISTING_BLOCK // 16
    keys: set[int] = set()
    body, entries, at = bytearray(), [], 0
    for m in (
        block * per_block + i * (per_block // 256) for block in range(index_size // LISTING_BLOCK) for i in range(256)
    ):
        held = [m + (j << bits) for j in range(per_minishard)]
        first = at
        for key in held:
            body += key.to_bytes(8, "little")
        at += 8 * len(held)
        rows = np.array([np.diff([0, *held]), [first] + [0] * (len(held) - 1), [8] * len(held)], "<u8").tobytes()
        entries.append((m, at, at + len(rows)))
        body += rows
        at += len(rows)
        keys.update(held)
    with (root / "0.shard").open("wb") as f:
        for m, start, stop in entries:
            f.seek(16 * m)
            f.write(struct.pack("<QQ", start, stop))
        f.seek(index_size)
        f.write(body)
    return keys


@pytest.mark.parametrize("per_minishard", [1, 2])
def test_a_listing_spends_its_budget_and_each_name_gives_some_back(tmp_path, mount, per_minishard) -> None:
    """Over HTTP a 128 MiB shard index is read whole (no holes can be seen), 1 MiB a block: twice the 64 MiB a
    listing may read without listing a name. Each minishard index read costs at least 4 KiB and each name
    listed gives 4 KiB back. With one key a minishard the names only pay for their own reads: the listing
    stops once the blocks have spent the budget, with the names of those blocks and one warning. With two,
    each minishard gives back 4 KiB more than it cost, 1 MiB a block: the listing is whole."""
    keys = write_paired_kv(tmp_path / "kv", per_minishard)
    with RangeServer(tmp_path / "kv").running() as server:
        m = mount(server.url)
        listed = set(subprocess.run(["ls", "-f", m.path], capture_output=True, text=True, timeout=600).stdout.split())
    names = {str(key) for key in keys}
    assert listed - {".", "..", "info"} <= names
    if per_minishard == 2:
        assert listed >= names and "event=listing_budget" not in m.log_text()
        return
    paid = LISTING_BUDGET // LISTING_BLOCK * 256  # the names of the blocks the budget pays for
    assert paid * 0.9 <= len(listed - {".", "..", "info"}) <= paid, len(listed)
    assert m.log_text().count("event=listing_budget") == 1
