"""A new user's first hour, through the real CLI and the kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import peers
from tests.conftest import shardfs


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes]]:
    root = tmp_path_factory.mktemp("cli") / "kv"
    return root, peers.write_tensorstore_kv(root, {k: bytes([k]) * (k + 1) for k in range(40)})


def test_stats_is_a_short_summary_by_default(kv, mount) -> None:
    m = mount(kv[0])
    served = sum(len((m.path / str(k)).read_bytes()) for k in range(10))
    lines = shardfs("stats", m.path).stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["uptime", "operations", "served", "cache", "errors"]
    assert int(lines[1].split()[1]) >= 10 and "/s)" in lines[1]
    assert lines[2].split()[1:] == [str(served), "B"]
    assert "hit rate" in lines[3] and "held of 64.0 MiB" in lines[3]
    assert lines[4].split()[1] == "0;"
    uptime = lines[0].split()[1:]
    assert uptime[0] == "0m" and int(uptime[1].rstrip("s")) < 60
