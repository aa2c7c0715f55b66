"""Running as a service, through the real tools: systemd's unit checker and notify protocol, fstab through
`mount` and `mount.fuse3`, Prometheus scrapes, `shardfs stats`, signals and the structured log."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from shardfs.cli import mount_argv, parser
from shardfs.logs import BURST
from shardfs.service import daemon as daemon_module
from shardfs.service import lifecycle, stats_socket
from shardfs.service.handover import FUSE_NAME, HANDED_OVER, RECORD_NAME
from shardfs.service.rundir import runtime_dir
from tests.support import peers
from tests.support.cli import SHARDFS, scrape, shardfs
from tests.support.cloud import free_port
from tests.support.daemons import REPO, daemon_of, machine_lock, wait_for, wait_until
from tests.support.http_server import RangeServer
from tests.support.reading import assert_eio

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.loopback]

UNIT = REPO / "systemd" / "shardfs@.service"
INSTALLED = "/usr/local/bin/shardfs"  # where the unit expects the console script
CONSOLE_SCRIPT = Path(sys.prefix, "bin", "shardfs")
# Keys spread predictably: even keys in 0.shard, odd keys in 1.shard.
SHARDING = peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=0, shard_bits=1)


def values(seed: int) -> dict[int, bytes]:
    rng = np.random.default_rng(seed)
    return {k: rng.bytes(int(rng.integers(1, 400))) for k in range(200)}


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes]]:
    root = tmp_path_factory.mktemp("service") / "kv"
    return root, peers.write_tensorstore_kv(root, values(0), sharding=SHARDING)


# --- systemd ---------------------------------------------------------------------------------------


def test_systemd_unit_verifies(tmp_path) -> None:
    unit = UNIT.read_text()
    assert INSTALLED in unit
    (tmp_path / UNIT.name).write_text(unit.replace(INSTALLED, str(CONSOLE_SCRIPT)))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / "shardfs@fafb.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def exec_start(conf: dict[str, str]) -> list[str]:
    """The unit's ExecStart as systemd runs it: ${VAR} from the EnvironmentFile, each one word."""
    line = next(ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart="))
    words = shlex.split(line.removeprefix("ExecStart="))
    words = [conf.get(w[2:-1], "") if w.startswith("${") else w for w in words]
    assert words[0] == INSTALLED
    return [str(CONSOLE_SCRIPT), *words[1:]]


def unit_line(key: str, conf: dict[str, str]) -> list[str]:
    """A command line of the unit as systemd runs it: `-` (failure ignored) dropped, `$$` a literal `$`, ${VAR}
    from the EnvironmentFile (one word each)."""
    line = next(ln for ln in UNIT.read_text().splitlines() if ln.startswith(f"{key}="))
    words = shlex.split(line.removeprefix(f"{key}=").removeprefix("-"))
    return [conf.get(w[2:-1], "") if w.startswith("${") else w.replace("$$", "$") for w in words]


def test_the_unit_keeps_the_mount_across_restarts_and_stop_post_clears_only_a_timed_out_stop(kv, mount) -> None:
    """The fd store is on, a hand-over (exit 75) restarts the unit, and ExecStopPost, which runs after every
    end of the daemon, restarts included, unmounts only after a stop that timed out (SIGKILL: nobody else
    would): after a crash or a hand-over the next daemon takes the mount up."""
    unit = UNIT.read_text().splitlines()
    assert "FileDescriptorStoreMax=2" in unit and "Restart=on-failure" in unit
    assert f"RestartForceExitStatus={HANDED_OVER}" in unit and f"SuccessExitStatus={HANDED_OVER}" in unit
    m = mount(kv[0])
    stop_post = unit_line("ExecStopPost", {"MOUNTPOINT": str(m.path)})
    for result in ("success", "exit-code", "signal", "core-dump", "watchdog"):
        done = subprocess.run(stop_post, env={**os.environ, "SERVICE_RESULT": result}, timeout=60)
        assert done.returncode == 0 and os.path.ismount(m.path), result
    subprocess.run(stop_post, env={**os.environ, "SERVICE_RESULT": "timeout"}, timeout=60, check=True)
    assert not os.path.ismount(m.path)


def test_type_notify_ready_once_live_and_stopping_on_sigterm(kv, tmp_path) -> None:
    source, stored = kv
    point = tmp_path / "m"
    point.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify"))
        notify.settimeout(60)
        conf = {"SOURCE": str(source), "MOUNTPOINT": str(point), "OPTIONS": "cache_size=8M"}
        env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")}
        proc = subprocess.Popen(exec_start(conf), env=env, stderr=subprocess.PIPE, text=True)
        try:
            pushed = [notify.recv(4096).decode() for _ in range(4)]  # the descriptors for its fd store first
            # what an earlier connection left under both names removed first, then both stored
            assert [m.splitlines()[0] for m in pushed] == ["FDSTOREREMOVE=1"] * 2 + ["FDSTORE=1"] * 2, pushed
            message = notify.recv(4096).decode()
            live_when_ready = os.path.ismount(point)
            assert "READY=1" in message.splitlines() and live_when_ready
            assert (point / "7").read_bytes() == stored[7]
            proc.send_signal(signal.SIGTERM)  # a stop (no systemd to say it is a restart): the store emptied
            removed = [notify.recv(4096).decode().splitlines() for _ in range(2)]
            assert sorted(m[1] for m in removed if m[0] == "FDSTOREREMOVE=1") == [
                f"FDNAME={FUSE_NAME}",
                f"FDNAME={RECORD_NAME}",
            ], removed
            assert "STOPPING=1" in notify.recv(4096).decode().splitlines()
            assert proc.wait(timeout=30) == 0
            assert proc.stderr is not None and "could not tell systemd" not in proc.stderr.read()  # it did
            assert not os.path.ismount(point)
        finally:
            if proc.poll() is None:
                proc.kill()


def test_example_config_options_become_cli_options() -> None:
    conf = dict(
        line.split("=", 1)
        for line in (REPO / "systemd" / "example.conf").read_text().splitlines()
        if line and not line.startswith("#")
    )
    p, commands = parser()
    args = p.parse_args(mount_argv([conf["SOURCE"], conf["MOUNTPOINT"], "-o", conf["OPTIONS"]], commands))
    assert args.command == "mount" and args.cache_size == 1 << 30 and args.metrics == ("127.0.0.1", 9477)
    assert args.allow_other and args.options == []
    fstab_words = mount_argv(["s", "m", "-o", "rw,defaults,comment=x,x-systemd.automount,dev,log-level=info"], commands)
    assert fstab_words == ["mount", "s", "m", "--log-level=info", "-o", "dev"]


# --- fstab and mount -t, through util-linux mount and libfuse's mount.fuse3 -------------------------


@pytest.fixture
def helper_on_default_path() -> Iterator[None]:
    """`shardfs` where mount.fuse3's shell finds it with no PATH set, as a system install puts it."""
    link = Path("/usr/local/sbin/shardfs")
    with machine_lock(link):  # a suite run at once from another copy of the tree puts its own there
        if link.is_symlink() or link.exists():
            assert link.resolve() == CONSOLE_SCRIPT.resolve(), f"{link} is another shardfs; move it to run this test"
            yield
            return
        link.symlink_to(CONSOLE_SCRIPT)
        try:
            yield
        finally:
            link.unlink()


@pytest.mark.parametrize("how", ["fstab", "mount -t"])
def test_mount_helper_without_home_or_path(kv, tmp_path, helper_on_default_path, how) -> None:
    source, stored = kv
    point, log = tmp_path / "m", tmp_path / "daemon.log"
    point.mkdir()
    options = f"ro,allow_other,view=native,cache_size=3M,log_file={log},log_level=info,_netdev,nofail"
    if how == "fstab":
        (tmp_path / "fstab").write_text(f"{source} {point} fuse.shardfs {options} 0 0\n")
        command = ["/usr/bin/mount", "-T", str(tmp_path / "fstab"), str(point)]
    else:
        command = ["/usr/bin/mount", "-t", "fuse.shardfs", str(source), str(point), "-o", options]
    done = subprocess.run(command, env={}, capture_output=True, text=True, timeout=60)  # no HOME, no PATH
    try:
        assert done.returncode == 0, done.stderr
        assert os.path.ismount(point)
        assert all((point / str(k)).read_bytes() == stored[k] for k in (0, 1, 42, 199))
        figures = scrape(shardfs("stats", "--prometheus", point).stdout)
        assert figures["shardfs_cache_budget_bytes", frozenset()] == 3 << 20  # cache_size=3M reached us
        assert "level=info event=mounted" in log.read_text()  # and so did log_file and log_level
        line = next(ln for ln in Path("/proc/mounts").read_text().splitlines() if f" {point} " in ln)
        assert line.split()[2] == "fuse.shardfs"  # and nosuid,nodev, though mount.fuse3 adds suid,dev for root:
        assert {"ro", "nosuid", "nodev", "allow_other"} <= set(line.split()[3].split(","))
    finally:
        subprocess.run(["/usr/bin/umount", str(point)], env={}, capture_output=True, timeout=60)
    assert not os.path.ismount(point)


# --- metrics and stats -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def half_broken(kv, tmp_path_factory) -> Path:
    """The kv with 1.shard cut short: odd keys are EIO, even keys healthy."""
    root = tmp_path_factory.mktemp("broken") / "kv"
    shutil.copytree(kv[0], root)
    (root / "1.shard").write_bytes((root / "1.shard").read_bytes()[:40])
    return root


def test_metrics_and_stats_count_what_was_read(kv, half_broken, mount) -> None:
    stored = kv[1]
    port = free_port()
    m = mount(half_broken, "--metrics", f"{port}")  # localhost by default

    def metrics() -> dict[tuple[str, frozenset], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
            return scrape(reply.read().decode())

    before = metrics()
    even = list(range(0, 60, 2))
    served = sum(len((m.path / str(k)).read_bytes()) for k in even)
    assert served == sum(len(stored[k]) for k in even)
    assert_eio(m.path / "13")
    after = metrics()

    def moved(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after.get(key, 0) - before.get(key, 0)

    assert moved("shardfs_served_bytes_total") == served
    assert len(even) <= moved("shardfs_fuse_op_seconds_count", op="read") <= 2 * len(even)
    assert moved("shardfs_fuse_op_seconds_count", op="lookup") >= len(even) + 1
    assert moved("shardfs_store_reads_total") >= len(even)
    assert moved("shardfs_store_read_bytes_total") >= served
    assert moved("shardfs_cache_misses_total") >= len(even)
    assert moved("shardfs_decode_errors_total") >= 1
    assert moved("shardfs_errors_total", errno="EIO") == moved("shardfs_decode_errors_total")
    assert after["shardfs_cache_bytes", frozenset()] > 0

    line = next(ln for ln in m.log_text().splitlines() if "event=eio" in ln)
    assert "level=error" in line and "shard=1.shard" in line and "key=13" in line and "path=/13" in line

    stats = scrape(shardfs("stats", "--prometheus", m.path).stdout)  # the same figures, without a Prometheus server
    assert stats["shardfs_served_bytes_total", frozenset()] == after["shardfs_served_bytes_total", frozenset()]


def test_stats_without_a_daemon_says_so(tmp_path) -> None:
    done = shardfs("stats", tmp_path, check=False)
    assert done.returncode == 1 and "no shardfs daemon serves this mountpoint" in done.stderr


def test_another_user_can_neither_block_a_mount_nor_fake_its_stats(kv, other_user, public_tmp) -> None:
    source, stored = kv
    point = public_tmp / "m"
    point.mkdir()
    old_name = "@shardfs-stats-" + hashlib.sha256(os.fsencode(point)).hexdigest()[:32]  # the abstract socket
    new_name = stats_socket.socket_path(runtime_dir(0), point)
    squatter = subprocess.Popen(
        [*other_user, "tests.support.squatter", old_name, str(new_name)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert squatter.stdout is not None and int(squatter.stdout.readline()) >= 1  # the old name, at least
        shardfs("mount", source, point, "--log-file", public_tmp / "log")
        assert os.path.ismount(point)
        served = sum(len((point / str(k)).read_bytes()) for k in (2, 4, 6))
        assert served == sum(len(stored[k]) for k in (2, 4, 6))
        for command in (SHARDFS, [*other_user, "shardfs.cli"]):
            done = subprocess.run([*command, "stats", "--prometheus", str(point)], capture_output=True,
                                  text=True, timeout=60, cwd=REPO)  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert scrape(done.stdout)["shardfs_served_bytes_total", frozenset()] == served
        assert new_name.stat().st_uid == 0
        shardfs("unmount", point)
        assert wait_for(lambda: not new_name.exists())  # removed on a clean exit: the daemon's last act
    finally:
        squatter.kill()
        squatter.wait()
        if os.path.ismount(point):
            shardfs("unmount", point)


TRUST_CHECKS = """
import json, os, subprocess, sys
from shardfs.service import stats_socket
from shardfs.service.handover import HANDED_OVER
from shardfs.service.rundir import runtime_dir
source, point, log, *other_user = sys.argv[1:]
shardfs = [sys.executable, "-m", "shardfs"]
stats = lambda: subprocess.run([*shardfs, "stats", point], capture_output=True, text=True, timeout=60)
subprocess.run([*shardfs, "mount", source, point, "--log-file", log], check=True)
try:
    directory = runtime_dir(0)
    trusted = stats().returncode
    directory.chmod(0o777)
    open_dir = stats()
    path = stats_socket.socket_path(directory, point)
    path.unlink()  # the daemon's socket gone, a stranger's in its place
    squatter = subprocess.Popen([*other_user, "tests.support.squatter", str(path)], stdout=subprocess.PIPE, text=True)
    taken = int(squatter.stdout.readline())
    directory.chmod(0o755)
    faked = stats()
    squatter.kill()
finally:
    subprocess.run([*shardfs, "unmount", point])
answers = [[done.returncode, done.stderr + done.stdout] for done in (open_dir, faked)]
print(json.dumps([trusted, taken, *answers]))
"""


def test_stats_trusts_only_the_mounts_own_user(kv, other_user, public_tmp) -> None:
    """What root alone could set up, as the checks' own test: an open directory, then a stranger's socket. Run
    in a mount namespace of its own, with a fresh /run: root's /run/shardfs serves every other daemon."""
    point = public_tmp / "m"
    point.mkdir()
    private = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none /run && exec "$@"']
    script = [sys.executable, "-c", TRUST_CHECKS, str(kv[0]), str(point), str(public_tmp / "log"), *other_user]
    done = subprocess.run([*private, "-", *script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    trusted, taken, open_dir, faked = json.loads(done.stdout)
    assert trusted == 0 and taken == 1
    why = "/run/shardfs: not a directory of uid 0 closed to others; its stats are not trusted\n"
    assert open_dir == [1, f"shardfs: {why}"]
    assert faked[0] == 1 and "answered by uid" in faked[1] and "999999" not in faked[1]
    assert not os.path.ismount(point)


def test_a_flood_of_stats_requests_costs_the_daemon_little(kv, other_user, public_tmp) -> None:
    """Another user connecting to the stats socket as fast as it can gets at most one answer per
    ANSWER_INTERVAL, so the daemon spends a small share of a core on it (before, all of one, under the GIL
    the readers need)."""
    point = public_tmp / "m"
    point.mkdir()
    shardfs("mount", kv[0], point, "--log-file", public_tmp / "log")
    try:
        daemon = daemon_of(point)
        path = stats_socket.socket_path(runtime_dir(0), point)
        busy = sum(daemon.cpu_times()[:2])
        flood = subprocess.run([*other_user, "tests.support.flooder", str(path), "2"], capture_output=True, text=True,
                               timeout=60, cwd=REPO, check=True)  # fmt: skip
        busy = sum(daemon.cpu_times()[:2]) - busy
        assert 0 < int(flood.stdout) <= 2 / lifecycle.ANSWER_INTERVAL + 20, flood.stdout
        assert busy < 0.5, f"the daemon spent {busy:.2f} s of CPU answering a 2 s flood"
        assert scrape(shardfs("stats", "--prometheus", point).stdout)["shardfs_served_bytes_total", frozenset()] == 0
    finally:
        shardfs("unmount", point)


def test_idle_metrics_connections_time_out_and_are_bounded(kv, mount) -> None:
    """Connections to --metrics that never send a request are dropped after IDLE_TIMEOUT, and never more than
    METRICS_CONNECTIONS are served at once (a thread each, holding its connection): the rest are closed at once.
    Counted in connections the daemon holds, not in its threads, which a loaded machine starts when it can."""
    port = free_port()
    m = mount(kv[0], "--metrics", str(port))
    daemon = daemon_of(m.path)

    def held() -> int:
        return sum(c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED for c in daemon.net_connections())

    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    try:
        wait_until(lambda: sum(map(closed, idle)) == len(idle) - lifecycle.METRICS_CONNECTIONS)
        assert held() == lifecycle.METRICS_CONNECTIONS
        idle[0].settimeout(60)  # a ceiling only a connection kept for ever reaches (IDLE_TIMEOUT is 5 s)
        assert idle[0].recv(1) == b""  # closed by the daemon
        wait_until(lambda: all(map(closed, idle)) and held() == 0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
            assert ("shardfs_served_bytes_total", frozenset()) in scrape(reply.read().decode())
    finally:
        for conn in idle:
            conn.close()


def closed(conn: socket.socket) -> bool:
    """Whether the other end closed conn (it sent nothing else)."""
    try:
        return conn.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False


def test_repeated_errors_are_rate_limited(half_broken, mount) -> None:
    m = mount(half_broken)
    for key in range(1, 200, 2):  # 100 distinct corrupt chunks, each an error line today
        assert_eio(m.path / str(key))
    assert m.log_text().count("event=eio") == BURST


def test_metrics_port_in_use_refuses_the_mount(kv, tmp_path) -> None:
    point = tmp_path / "m"
    point.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done = shardfs("mount", kv[0], point, "--metrics", str(busy.getsockname()[1]), check=False)
    assert done.returncode == 1 and "cannot listen" in done.stderr and not os.path.ismount(point)


# --- signals ---------------------------------------------------------------------------------------


def test_sighup_drops_caches_so_a_rewritten_source_is_read_afresh(kv, tmp_path, mount) -> None:
    source = tmp_path / "kv"
    shutil.copytree(kv[0], source)
    rewritten = peers.write_tensorstore_kv(tmp_path / "new", values(1), sharding=SHARDING)
    m = mount(source)
    assert (m.path / "2").read_bytes() == kv[1][2]  # shard and minishard indexes now cached
    for shard in ("0.shard", "1.shard"):  # rewritten in place: same files, new bytes
        (source / shard).write_bytes((tmp_path / "new" / shard).read_bytes())
    daemon = daemon_of(m.path)
    daemon.send_signal(signal.SIGHUP)
    wait_until(lambda: "event=caches_dropped" in m.log_text())
    assert scrape(shardfs("stats", "--prometheus", m.path).stdout)["shardfs_cache_entries", frozenset()] == 0
    assert (m.path / "4").read_bytes() == rewritten[4]  # not yet looked up, so read afresh
    assert daemon.is_running() and os.path.ismount(m.path)


def test_sigusr1_toggles_debug_logging(kv, mount) -> None:
    m = mount(kv[0])
    daemon = daemon_of(m.path)
    daemon.send_signal(signal.SIGUSR1)
    wait_until(lambda: 'msg="SIGUSR1: log level DEBUG"' in m.log_text())
    daemon.send_signal(signal.SIGUSR1)
    wait_until(lambda: 'msg="SIGUSR1: log level WARNING"' in m.log_text())
    assert daemon.is_running() and (m.path / "3").read_bytes() == kv[1][3]


def test_sighup_and_sigusr1_keep_a_remote_mount(kv, mount) -> None:
    """A remote source starts obstore's runtime threads while it is opened, before the FUSE loop: they must
    leave SIGHUP and SIGUSR1 to the daemon's one signal thread too, or either signal ends the daemon."""
    with RangeServer(kv[0]).running() as server:
        m = mount(server.url)
        assert (m.path / "2").read_bytes() == kv[1][2]
        daemon = daemon_of(m.path)
        for sig, event in ((signal.SIGUSR1, "event=log_level"), (signal.SIGHUP, "event=caches_dropped")) * 3:
            before = m.log_text().count(event)
            daemon.send_signal(sig)
            wait_until(lambda event=event, before=before: m.log_text().count(event) > before)
        assert daemon.is_running() and os.path.ismount(m.path)
        assert (m.path / "4").read_bytes() == kv[1][4]


SWEEP = """
import json, os, socket, subprocess, sys, time
from pathlib import Path
from shardfs.service import stats_socket
from shardfs.service.rundir import own_dir, runtime_dir

source, tmp = sys.argv[1:]
directory = own_dir(runtime_dir(0), 0o755)
dead = stats_socket.socket_path(directory, Path(tmp) / "gone")
young = dead.with_name("0" * 32 + ".sock")
for path in (dead, young):
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # bound, never listening, then closed: what a killed daemon leaves
os.utime(dead, (time.time() - 120, time.time() - 120))
point = Path(tmp) / "m"
point.mkdir()
shardfs = [sys.executable, "-m", "shardfs"]
subprocess.run([*shardfs, "mount", source, point, "--log-file", Path(tmp) / "log"], check=True)
subprocess.run([*shardfs, "unmount", point], check=True)
print(json.dumps([dead.exists(), young.exists()]))
"""


def test_a_killed_daemons_stats_socket_is_swept_by_the_next_mount(kv, tmp_path) -> None:
    """kill -9 leaves a daemon's socket behind; the next mount removes every socket no one answers (once a
    minute old, so that a daemon starting alongside is never swept). In a mount namespace of its own, with a
    fresh /run: root's /run/shardfs holds the sockets of every other daemon on the machine."""
    private = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none /run && exec "$@"']
    script = [sys.executable, "-c", SWEEP, str(kv[0]), str(tmp_path)]
    done = subprocess.run([*private, "-", *script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, True]  # the dead one swept, the young one left


def test_the_default_log_is_kept_only_when_something_was_said(kv, tmp_path) -> None:
    """A clean unmount removes the default log file ($TMPDIR/shardfs-UID/<mountpoint>.log) if the daemon
    logged nothing; one with something in it is kept for the operator. Files do not pile up per mountpoint."""
    point = tmp_path / "quiet"
    point.mkdir()
    log = daemon_module.default_log_file(point)
    for level, kept in (("warning", False), ("info", True)):
        log.unlink(missing_ok=True)
        shardfs("mount", kv[0], point, "--log-level", level)
        daemon = daemon_of(point)
        assert log.exists()
        shardfs("unmount", point)
        daemon.wait(timeout=60)
        assert log.exists() == kept, level
    assert "event=mounted" in log.read_text()
    log.unlink()


@pytest.mark.parametrize(
    "options", [(), ("-o", "attr_timeout=0,entry_timeout=0")], ids=["root cached", "root asked for"]
)
def test_a_stopped_daemon_blocks_neither_stats_nor_list(kv, mount, options) -> None:
    """A daemon that accepts but never answers (stopped, wedged) costs `stats` and `list` ASK_TIMEOUT, then a
    line naming it: before, both waited for ever (`shardfs()` gives up at 60 s). With attr_timeout=0 the kernel
    keeps no attributes of the mount's root, so a look at the mountpoint would ask the stopped daemon: `list`
    (which asks every shardfs mount on the machine) and `stats` must not look."""
    m = mount(kv[0], *options)
    daemon = daemon_of(m.path)
    daemon.suspend()
    try:
        done = shardfs("stats", m.path, check=False)
        assert done.returncode == 1 and f"its daemon (pid {daemon.pid}) did not answer in" in done.stderr
        listed = shardfs("list", check=False)
        assert listed.returncode == 0 and any(
            line.split()[:1] == [str(m.path)] and line.split()[2:] == ["-"] * 3 for line in listed.stdout.splitlines()
        ), listed.stdout
    finally:
        daemon.resume()
