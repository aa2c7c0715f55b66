"""A new user's first hour, through the real CLI and the kernel: every mistake is one clear line and the
right exit status, never a traceback, a hang or a silent surprise."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest
import zarr

from shardfs import __version__
from shardfs.cache import entry_cost
from shardfs.files import BytesFile
from shardfs.stores.protocol import Owner
from tests.support import peers
from tests.support.cli import one_line_error, scrape, shardfs

pytestmark = [pytest.mark.kernel, pytest.mark.root]


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes]]:
    root = tmp_path_factory.mktemp("cli") / "kv"
    return root, peers.write_tensorstore_kv(root, {k: bytes([k]) * (k + 1) for k in range(40)})


@pytest.mark.parametrize("where", ["source", "inside", "parent"])
def test_mountpoint_that_is_the_source_inside_it_or_above_it_is_refused(tmp_path, where) -> None:
    """Mounted there, the daemon would read its source through its own mount: `ls` would hang for ever."""
    source = tmp_path / "parent" / "kv"
    peers.write_tensorstore_kv(source, {1: b"one"})
    (source / "mnt").mkdir()
    point = {"source": source, "inside": source / "mnt", "parent": tmp_path / "parent"}[where]
    done = shardfs("mount", source, point, "--allow-non-empty", check=False)
    one_line_error(done, 2, str(point), "the source", "mount it elsewhere")
    assert not os.path.ismount(point)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--log-level", "verbose"], ["--log-level", "DEBUG", "INFO", "WARNING", "ERROR"]),
        (["-o", "log_level=verbose"], ["--log-level", "DEBUG", "ERROR"]),
        (["--view", "bogus"], ["--view", "'bogus'", "native", "n5", "zarr2"]),
        (["--metrics", "nonsense"], ["--metrics", "'nonsense'", "HOST:PORT"]),
        (["--cache-size", "x"], ["--cache-size", "'x'", "512M"]),
        (["--cache-size", "1000"], ["--cache-size", "too small", "64K"]),
        (["--cache-size", "0"], ["--cache-size", "too small", "64K"]),
        (["--cache-size", "-5M"], ["--cache-size", "'-5M'", "512M"]),
        (["--endpoint", "not-a-url"], ["--endpoint", "'not-a-url'", "https://"]),
        (["-o", "view=zarr2", "--view", "n5"], ["--view", "given twice", "'zarr2'", "'n5'"]),
    ],
)
def test_bad_option_is_one_line_naming_the_valid_values(kv, tmp_path, args, words) -> None:
    for form in (["mount", kv[0], tmp_path], [kv[0], tmp_path]):  # the command, and the mount-helper form
        one_line_error(shardfs(*form, *args, check=False), 2, *words)
    assert not os.path.ismount(tmp_path)


def test_remote_options_on_a_local_source_are_named_as_ignored(kv, tmp_path) -> None:
    point = tmp_path / "m"
    point.mkdir()
    done = shardfs("mount", kv[0], point, "--timeout", "5", "--region", "eu-west-1", "--allow-other")
    try:
        assert done.stderr == f"shardfs: --region, --timeout: for remote sources only; ignored for {kv[0]}\n"
        assert "allow_other" in next(ln for ln in Path("/proc/mounts").read_text().splitlines() if str(point) in ln)
        assert (point / "3").read_bytes() == kv[1][3]
    finally:
        shardfs("unmount", point)


@pytest.mark.parametrize("foreground", [False, True])
def test_an_option_the_mount_refuses_is_named_on_the_terminal(kv, tmp_path, foreground) -> None:
    point, log = tmp_path / "m", tmp_path / "log"
    point.mkdir()
    attach = ["-f"] if foreground else ["--log-file", log]
    done = shardfs("mount", kv[0], point, "-o", "bogus_opt", *attach, check=False)
    one_line_error(done, 1, str(point), "mount failed", "unknown option", "bogus_opt")
    assert not os.path.ismount(point)
    if not foreground:
        assert "unknown option" in log.read_text() and "Traceback" not in log.read_text()


def test_non_empty_mountpoint_is_refused_unless_allowed(kv, tmp_path, mount) -> None:
    point = tmp_path / "m"
    point.mkdir()
    (point / "notes.txt").write_text("hidden by a mount")
    one_line_error(shardfs("mount", kv[0], point, check=False), 2, str(point), "not empty", "--allow-non-empty")
    assert not os.path.ismount(point)
    for allow in (["--allow-non-empty"], ["-o", "nonempty"]):  # libfuse3 has no `nonempty`: ours to consume
        shardfs("mount", kv[0], point, *allow)
        assert (point / "3").read_bytes() == kv[1][3]
        shardfs("unmount", point)
    assert (point / "notes.txt").read_text() == "hidden by a mount"


def test_source_and_mountpoint_swapped_are_asked_about_not_mounted_over(tmp_path, mount) -> None:
    """The user's dataset as the mountpoint (here while the first mount is live, as when retyping the command):
    the advice was --allow-non-empty, which would hide the dataset under a mount."""
    source = tmp_path / "img.zarr"
    zarr.create_array(source, shape=(4,), chunks=(2,), dtype="uint8")
    m = mount(source)
    done = shardfs("mount", m.path, source, check=False)
    one_line_error(done, 2, f"{source}: mountpoint is a dataset (it holds zarr.json)", "SOURCE and MOUNTPOINT swapped?")
    assert "--allow-non-empty" not in done.stderr and not os.path.ismount(source)


def test_unmount_and_mount_name_what_is_missing(kv, tmp_path) -> None:
    one_line_error(shardfs("unmount", tmp_path, check=False), 1, str(tmp_path), "not mounted")
    missing = tmp_path / "nowhere"
    one_line_error(shardfs("unmount", missing, check=False), 2, str(missing), "does not exist")
    one_line_error(shardfs("mount", missing, tmp_path, check=False), 2, str(missing), "does not exist")
    one_line_error(shardfs("mount", kv[0], missing, check=False), 2, str(missing), "mountpoint does not exist")


def test_unmount_touches_only_shardfs_unless_told(tmp_path) -> None:
    """Root's `shardfs unmount` of a path where something else is mounted refuses and leaves it mounted."""
    point = tmp_path / "other"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "shardfs-test-tmpfs", point], check=True)
    try:
        (point / "kept").write_text("still here")
        refused = shardfs("unmount", point, check=False)
        one_line_error(refused, 1, str(point), "a tmpfs mount, not shardfs", "--any-type")
        assert os.path.ismount(point) and (point / "kept").read_text() == "still here"
        shardfs("unmount", "--any-type", point)
        assert not os.path.ismount(point)
    finally:
        if os.path.ismount(point):
            subprocess.run(["umount", point], check=False)


def test_cat_of_a_directory_says_it_is_one(kv) -> None:
    one_line_error(shardfs("cat", kv[0], "", check=False), 1, "a directory", "shardfs ls")


def test_decimal_cache_size(kv, mount) -> None:
    m = mount(kv[0], "--cache-size", "1.5G")
    figures = scrape(shardfs("stats", "--prometheus", m.path).stdout)
    assert figures["shardfs_cache_budget_bytes", frozenset()] == 3 << 29


def test_the_smallest_cache_size_is_64k(kv, mount, tmp_path) -> None:
    """64K is the least budget a mount takes (below it a size is a slip such as 512 for 512M); 63K is one
    line naming the bound, and no mount."""
    m = mount(kv[0], "--cache-size", "64K")
    figures = scrape(shardfs("stats", "--prometheus", m.path).stdout)
    assert figures["shardfs_cache_budget_bytes", frozenset()] == 64 << 10
    assert (m.path / "3").read_bytes() == kv[1][3]
    try:
        refused = shardfs("mount", kv[0], tmp_path, "--cache-size", "63K", check=False)
        assert not os.path.ismount(tmp_path)
    finally:
        if os.path.ismount(tmp_path):
            shardfs("unmount", tmp_path)
    one_line_error(refused, 2, "too small", "64K")


def test_version_and_help_with_defaults() -> None:
    assert shardfs("--version").stdout.strip() == f"shardfs {__version__}"
    text = " ".join(shardfs("mount", "--help").stdout.split())
    for said in ("MOUNTPOINT an existing", "(default: 64M)", "at least 64K", "(default: WARNING)"):
        assert said in text


def test_stats_says_what_is_held_beyond_the_budget(tmp_path, mount) -> None:
    """One file larger than --cache-size is kept (so a reader's 128 KiB pieces decode it once): the summary
    says so rather than show more held than the budget allows."""
    big = np.random.default_rng(1).bytes(300 << 10)
    peers.write_tensorstore_kv(tmp_path / "kv", {1: big})
    m = mount(tmp_path / "kv", "--cache-size", "128K")
    assert (m.path / "1").read_bytes() == big
    cache = next(line for line in shardfs("stats", m.path).stdout.splitlines() if line.startswith("cache"))
    held = cache.split("; ")[1]
    counted = entry_cost(("node", "1"), BytesFile(big, Owner(0, 0, 0))) / 1024  # the file, its node and key
    assert held.endswith(f"held of 128.0 KiB (and one file larger than that budget: {counted:.1f} KiB)"), cache


def test_stats_is_a_short_summary_by_default(kv, mount) -> None:
    m = mount(kv[0])
    served = sum(len((m.path / str(k)).read_bytes()) for k in range(10))
    lines = shardfs("stats", m.path).stdout.splitlines()
    heads = ["mount", "uptime", "operations", "served", "store", "read-ahead", "cache", "errors"]
    assert [line.split()[0] for line in lines] == heads
    assert lines.pop(0) == f"mount       {kv[0]} at {m.path}, view native"
    assert lines[2].split()[1:] == [str(served), "B"]
    figures = scrape(shardfs("stats", m.path, "--prometheus").stdout)
    reads = figures[("shardfs_store_reads_total", frozenset())]
    stored = figures[("shardfs_store_read_bytes_total", frozenset())]
    assert figures[("shardfs_files_read_total", frozenset())] == 10 and reads > 0
    assert lines[3] == (
        f"store       {reads:,.0f} reads ({reads / 10:,.2f} a file read), {stored:.0f} B read for {served} B served"
        f" ({stored / served:,.2f} a byte)"
    )
    assert lines[4] == "read-ahead  nothing fetched ahead"  # a local source: nothing waits on a network
    assert lines[6].split()[1] == "0;"
    uptime = lines[0].split()[1:]
    assert uptime[0] == "0m" and int(uptime[1].rstrip("s")) < 60


def test_info_names_every_scale_in_order(tmp_path) -> None:
    """`shardfs info` names unsharded scales too (they pass through), and lists what was found by path."""
    peers.write_tensorstore_volume(tmp_path / "v")
    found = [line.strip() for line in shardfs("info", tmp_path / "v").stdout.splitlines()[1:3]]
    assert found == [".: neuroglancer_multiscale_volume", "8_8_40: volume scale, unsharded (passes through)"]


def test_list_shows_every_mount_with_its_daemon(kv, mount, tmp_path) -> None:
    """`shardfs list`: each shardfs mount (and nothing else mounted) with its source, view, pid and uptime."""
    peers.write_tensorstore_volume(tmp_path / "v")
    native, n5 = mount(kv[0]), mount(tmp_path / "v", "--view", "n5")
    rows = {line.split()[0]: line.split() for line in shardfs("list").stdout.splitlines()[1:]}
    for m, source, view in ((native, kv[0], "native"), (n5, tmp_path / "v", "n5")):
        _, shown_source, shown_view, pid, *uptime = rows[str(m.path)]
        assert (shown_source, shown_view) == (str(source), view) and int(pid) > 1 and uptime[0] == "0m"
        assert any(str(m.path) in arg for arg in psutil.Process(int(pid)).cmdline())
    assert "/" not in rows and "/proc" not in rows


def test_a_mistyped_option_is_named_with_what_was_meant(kv, tmp_path) -> None:
    point = tmp_path / "m"
    point.mkdir()
    done = shardfs("mount", kv[0], point, "-o", "allow_others", "--log-file", tmp_path / "log", check=False)
    one_line_error(done, 1, "unknown option(s): -o allow_others (did you mean allow_other?)")
    assert "`" not in done.stderr and not os.path.ismount(point)


def test_the_csi_help_states_each_default_once() -> None:
    out = " ".join(shardfs("csi", "--help").stdout.split())  # as one line: help text wraps anywhere
    said = out.split("--daemon-user FIRST-LAST:GID", 2)[-1].split("--node-identity")[0]
    assert said.count("(default:") == 1 and "(default: 2147418112-2147483646:65534)" in said, said
