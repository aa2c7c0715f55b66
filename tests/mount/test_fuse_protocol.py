"""The FUSE protocol at its boundaries (issue 33, classes 1 and 3). Over a packet socket pair, playing the kernel:
what each timeout tells it (attr_timeout apart from entry_timeout, fractions as nanoseconds), INIT's reply for
every minor where its layout changes and the oldest one taken, FORGET and BATCH_FORGET of nodes looked up more
than once. Through the kernel: STATFS's fields as `df -i` and `stat -f` show them, and a `/dev/fd/N` that is a
character device other than /dev/fuse. INTERRUPT of a read that waits on a server, and the spare threads that
stand in for the threads that wait."""

from __future__ import annotations

import errno
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from shardfs.fuse import wire
from shardfs.fuse.mount import FuseMountError
from shardfs.fuse.serve import settings_of
from shardfs.service.daemon import fuse_options
from tests.support.cli import SHARDFS, one_line_error
from tests.support.daemons import wait_until
from tests.support.http_server import RangeServer
from tests.support.kernel import EVERYTHING, answer, ask, init, kernel_socket, send

pytestmark = [pytest.mark.kernel]


ROOT = wire.ROOT_ID


def lookup(kernel, name: str, unique: int = 10, parent: int = ROOT) -> tuple[int, bytes]:
    return ask(kernel, wire.Op.LOOKUP, name.encode() + b"\0", unique, parent)


def test_each_timeout_reaches_the_kernel_as_given_to_the_nanosecond(raw_volume) -> None:
    """`-o entry_timeout=2.5,attr_timeout=7.25,negative_timeout=0.5` (as the CLI hands them over, through the
    options' own parser): a LOOKUP's entry says 2 s + 500,000,000 ns for the name and 7 s + 250,000,000 ns for
    the attributes, a GETATTR 7.25 s, an absence 0.5 s. Nothing waits: what the kernel is told is read."""
    options = fuse_options("src", {"entry_timeout": "2.5", "attr_timeout": "7.25", "negative_timeout": "0.5"})
    timeouts = settings_of(options, Path("/m")).timeouts
    with kernel_socket(raw_volume[0], timeouts) as (kernel, _):
        assert init(kernel, 7, 38, EVERYTHING)[0] == 0
        code, reply = lookup(kernel, "info")
        nodeid, _, entry_s, attr_s, entry_ns, attr_ns = wire.ENTRY_OUT.unpack_from(reply)
        assert code == 0 and (entry_s, entry_ns, attr_s, attr_ns) == (2, 500_000_000, 7, 250_000_000)
        code, reply = ask(kernel, wire.Op.GETATTR, bytes(16), 11, nodeid)
        assert code == 0 and wire.ATTR_OUT.unpack_from(reply)[:2] == (7, 250_000_000)
        code, reply = lookup(kernel, "absent", 12)
        assert code == 0 and wire.ENTRY_OUT.unpack_from(reply) == (0, 0, 0, 0, 500_000_000, 0)
    defaults = settings_of(fuse_options("src", {}), Path("/m")).timeouts  # a day each, as the README says
    assert (defaults.entry, defaults.attr, defaults.negative) == (86400, 86400, 86400)


@pytest.mark.parametrize("minor, size", [(12, wire.COMPAT_22_INIT_OUT_SIZE), (22, 24), (23, wire.INIT_OUT.size)])
def test_init_answers_each_minor_in_the_layout_it_reads(raw_volume, minor, size) -> None:
    """7.12 is the oldest minor taken (entry_out and attr_out have had today's sizes since); up to 7.22 init_out
    is 24 bytes, from 7.23 it is 64: each kernel gets its own layout, its own minor, and its readahead back."""
    with kernel_socket(raw_volume[0]) as (kernel, session):
        code, reply = init(kernel, 7, minor, EVERYTHING)
        assert code == 0 and len(reply) == size
        major, got, readahead, _ = wire.INIT_IN.unpack_from(reply)
        assert (major, got, readahead, session.minor) == (7, minor, 1 << 17, minor)
        code, reply = lookup(kernel, "info")  # and it is served in that minor's entry_out and attr
        assert code == 0 and len(reply) == wire.ENTRY_OUT.size + wire.ATTR.size


def test_init_of_a_kernel_older_than_7_12_is_refused(raw_volume) -> None:
    with kernel_socket(raw_volume[0]) as (kernel, _):
        assert init(kernel, 7, 11, EVERYTHING)[0] == errno.EPROTO


def forget(kernel, nodeid: int, times: int) -> None:
    kernel.send(
        wire.IN_HEADER.pack(wire.IN_HEADER.size + 8, wire.Op.FORGET, 90, nodeid, 0, 0, 0, 0, 0)
        + wire.FORGET_IN.pack(times)
    )


def batch_forget(kernel, pairs: list[tuple[int, int]]) -> None:
    body = wire.BATCH_FORGET_IN.pack(len(pairs), 0) + b"".join(wire.FORGET_ONE.pack(*pair) for pair in pairs)
    header = wire.IN_HEADER.pack(wire.IN_HEADER.size + len(body), wire.Op.BATCH_FORGET, 91, 0, 0, 0, 0, 0, 0)
    kernel.send(header + body)


def held(kernel, nodeid: int) -> bool:
    """Whether the session still holds nodeid: a GETATTR answered (one thread: it follows any FORGET sent before)."""
    code = ask(kernel, wire.Op.GETATTR, bytes(16), 80, nodeid)[0]
    assert code in (0, errno.ESTALE)
    return code == 0


def test_forget_counts_down_every_lookup_the_kernel_made(raw_volume) -> None:
    """The kernel looked each node up several times and lets go of them in counts above one: a node stays
    until its last lookup is forgotten, by FORGET or BATCH_FORGET alike, then is dropped."""
    with kernel_socket(raw_volume[0]) as (kernel, session):
        assert init(kernel, 7, 38, EVERYTHING)[0] == 0
        ids = {}
        for name in ("info", "8_8_40", "4_4_40"):
            for i in range(3):
                ids[name] = wire.ENTRY_OUT.unpack_from(lookup(kernel, name, 20 + i)[1])[0]
        assert held(kernel, ids["info"])
        forget(kernel, ids["info"], 2)
        assert held(kernel, ids["info"])
        forget(kernel, ids["info"], 1)
        assert not held(kernel, ids["info"])
        batch_forget(kernel, [(ids["8_8_40"], 2), (ids["4_4_40"], 3)])
        assert held(kernel, ids["8_8_40"]) and not held(kernel, ids["4_4_40"])
        batch_forget(kernel, [(ids["4_4_40"], 1), (ids["8_8_40"], 1)])  # a stale id first, then the last lookup
        assert not held(kernel, ids["8_8_40"])
        assert len(session.filesystem.nodes) == 1  # the root alone


def test_df_i_and_stat_f_show_the_sources_files_and_the_mounts_units(raw_volume, mount) -> None:
    """`df -i`: as many inodes as the source holds files, all used, none free; `stat -f`: a name of at most
    255 bytes, 512-byte fundamental blocks (so `df` is exact to half a KiB), 1 MiB I/O blocks."""
    source = raw_volume[0]
    files = sum(1 for p in source.rglob("*") if p.is_file() and not p.is_symlink())
    m = mount(source)
    df = ["df", "--output=itotal,iused,iavail", m.path]  # the columns of `df -i`
    wait_until(lambda: subprocess.run(df, capture_output=True, text=True).stdout.split()[-3] == str(files), 60)
    assert subprocess.run(df, capture_output=True, text=True, check=True).stdout.split()[-3:] == [
        str(files),
        str(files),
        "0",
    ]
    units = subprocess.run(["stat", "-f", "-c", "%l %S %s", m.path], capture_output=True, text=True, check=True)
    assert units.stdout.split() == ["255", "512", str(1 << 20)]


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero", "/dev/urandom"])
def test_dev_fd_n_of_another_character_device_is_refused_in_one_line(raw_volume, device) -> None:
    """A character device is not /dev/fuse for being one: the mount is refused, exit 2, nothing read from it."""
    with open(device, "rb") as fd:
        handed = f"/dev/fd/{fd.fileno()}"
        command = [*SHARDFS, "mount", str(raw_volume[0]), handed]
        done = subprocess.run(command, pass_fds=[fd.fileno()], capture_output=True, text=True, timeout=60)
    one_line_error(done, 2, handed, "not a /dev/fuse descriptor")


def test_only_requests_the_kernel_marks_resent_are_counted_resent(raw_volume) -> None:
    """FUSE_NOTIFY_RESEND puts each request read and not answered back in the queue with FUSE_UNIQUE_RESEND set in
    its unique: those, and no other, are what shardfs_fuse_resent_requests counts; each is answered under the
    unique as it was read."""
    with kernel_socket(raw_volume[0]) as (kernel, session):
        assert init(kernel, 7, 40, EVERYTHING, wire.InitFlag2.HAS_RESEND)[0] == 0
        resent = wire.UNIQUE_RESEND
        for n, unique in enumerate([2, resent | 3, 4, 5, resent | 6, 1 << 62 | 7, resent | 8]):
            assert ask(kernel, wire.Op.GETATTR, bytes(16), unique, ROOT)[0] == 0  # ask() checks the unique echoed
            counted = session.metrics.registry.get_sample_value("shardfs_fuse_resent_requests_total")
            assert counted == [0, 1, 1, 1, 2, 2, 3][n], (n, counted)


FUSE_H = Path("/usr/include/linux/fuse.h")  # the kernel's own header (linux-libc-dev, with gcc)


def _fuse_h() -> str:
    assert FUSE_H.exists(), f"{FUSE_H} is missing: scripts/setup installs gcc, which brings it"
    return FUSE_H.read_text()


def test_init_flags_and_opcodes_are_the_bits_and_numbers_of_linux_fuse_h() -> None:
    """Each INIT flag bit by bit, and each opcode, against the header the kernel is built from: a flag one bit off
    asks the kernel for something else (WRITEBACK_CACHE for NO_OPEN_SUPPORT), or misreads what it offers. The
    header of this machine may predate 7.40: what it does not define yet (FUSE_HAS_RESEND, FUSE_STATX) is taken
    from 7.40's, quoted here."""
    header = _fuse_h()
    defined = {name: int(shift) for name, shift in re.findall(r"#define FUSE_(\w+)\s+\(1(?:ULL)? << (\d+)\)", header)}
    # Every name, aliases included: a flag moved onto another's bit becomes that one's alias, which iteration skips.
    for name, flag in wire.InitFlag.__members__.items():
        assert 1 << defined[name] == flag.value, name
    fuse_7_40 = {"HAS_RESEND": 39}  # linux/fuse.h 7.40: #define FUSE_HAS_RESEND (1ULL << 39)
    for name, flag in wire.InitFlag2.__members__.items():
        assert 1 << defined.get(name, fuse_7_40[name]) == flag.value << 32, name
    opcodes = {name: int(number) for name, number in re.findall(r"\bFUSE_(\w+)\s*=\s*(\d+),", header)}
    opcodes.setdefault("STATX", 52)  # 7.39
    for name, op in wire.Op.__members__.items():
        assert opcodes[name] == op.value, name
    assert opcodes.get("NOTIFY_RESEND", 7) == wire.Notify.RESEND  # enum fuse_notify_code, 7.40
    assert wire.UNIQUE_RESEND == 1 << 63  # 7.40: #define FUSE_UNIQUE_RESEND (1ULL << 63)


def test_names_of_254_and_255_bytes_are_looked_up_and_256_is_absent_unasked(raw_volume, tmp_path) -> None:
    """NAME_MAX at its value, one below and one above: files of 254 and 255 bytes' names (the longest Linux
    holds) are found; a name of 256 is absent, without asking the source (which would answer ENAMETOOLONG, and
    count it an error: any user could fill the log with that)."""
    source = tmp_path / "src"
    shutil.copytree(raw_volume[0], source)
    for size in (254, 255):
        (source / ("n" * size)).write_bytes(b"x" * size)
    with kernel_socket(source) as (kernel, session):
        assert init(kernel, 7, 40, EVERYTHING)[0] == 0
        for size in (254, 255):
            code, reply = lookup(kernel, "n" * size)
            assert code == 0 and wire.ATTR.unpack_from(reply, wire.ENTRY_OUT.size)[1] == size, size
        code, reply = lookup(kernel, "n" * 256)
        assert code == 0 and wire.ENTRY_OUT.unpack_from(reply)[0] == 0  # node id 0: absent, for the negative timeout
        errors = [s for s in session.metrics.registry.collect() if s.name == "shardfs_errors"]
        assert not any(sample.value for family in errors for sample in family.samples), errors


@pytest.mark.parametrize(
    ("value", "taken"),
    [("18446744073709549568", True), ("18446744073709551616", False), ("18446744073709555712", False)],
    ids=["the largest below 2^64", "2^64", "the next above"],
)
def test_the_largest_timeout_is_the_last_below_2_to_the_64(raw_volume, value, taken) -> None:
    """A timeout is a u64 of seconds to the kernel: 2^64 - 2048 (the largest double below 2^64) is taken and
    told to the kernel as those seconds; 2^64, and the next double above it, are refused naming the option."""
    options = fuse_options("src", {"attr_timeout": value})
    if not taken:
        with pytest.raises(FuseMountError, match=f"invalid value attr_timeout={value}"):
            settings_of(options, Path("/m"))
        return
    with kernel_socket(raw_volume[0], settings_of(options, Path("/m")).timeouts) as (kernel, _):
        assert init(kernel, 7, 40, EVERYTHING)[0] == 0
        code, reply = ask(kernel, wire.Op.GETATTR, bytes(16), 2, ROOT)
        assert code == 0 and wire.ATTR_OUT.unpack_from(reply)[:2] == (int(value), 0)


def session_threads(earlier: frozenset[threading.Thread]) -> int:
    """The threads serving sessions in this process (fuse-N, fuse-spare), but for those of earlier sessions (an
    ended session's threads may still be ending: counted, they would end during the count)."""
    return sum(thread.name.startswith("fuse-") and thread not in earlier for thread in threading.enumerate())


def test_a_read_interrupted_while_it_waits_on_the_server_is_answered_at_once_and_a_spare_stands_in(
    raw_volume,
) -> None:
    """Two session threads, over a server that then takes a minute; three chunks looked up and read once (their
    indexes cached: a read is one GET). Each is read again and interrupted while its GET waits: each READ is
    answered EINTR at once, and a spare thread stands in for the first two waiting threads (no more spares than
    threads: the third gets none, and one thread serves on). Once the server answers, each waiting thread
    answers its READ again, too late (the kernel drops such answers), and the two spares' worth of threads end."""
    source, twin, _ = raw_volume
    names = sorted(p.name for p in (twin / "4_4_40").iterdir())[:3]
    read_all = wire.READ_IN.pack(0, 0, 1 << 20, 0, 0, 0, 0)
    earlier = frozenset(threading.enumerate())
    with RangeServer(source).running() as server, kernel_socket(server.url, threads=2) as (kernel, _):
        assert init(kernel, 7, 38, EVERYTHING)[0] == 0
        threads = session_threads(earlier)
        scale = wire.ENTRY_OUT.unpack_from(lookup(kernel, "4_4_40", 2)[1])[0]
        nodes = [wire.ENTRY_OUT.unpack_from(lookup(kernel, name, 3 + i, scale)[1])[0] for i, name in enumerate(names)]
        for i, (node, name) in enumerate(zip(nodes, names, strict=True)):
            assert ask(kernel, wire.Op.READ, read_all, 10 + i, node) == (0, (twin / "4_4_40" / name).read_bytes())
        wait_until(lambda: server.in_flight == 0, 30)  # the answers above counted out (after they were sent)
        server.latency = 60.0
        for i, node in enumerate(nodes):
            send(kernel, wire.Op.READ, read_all, 20 + i, node)
            wait_until(lambda i=i: server.in_flight == i + 1, 30)
            send(kernel, wire.Op.INTERRUPT, wire.INTERRUPT_IN.pack(20 + i), 30 + i)
            assert answer(kernel) == (20 + i, errno.EINTR, b"")
            wait_until(lambda i=i: session_threads(earlier) == threads + min(i + 1, 2), 30)
        assert ask(kernel, wire.Op.GETATTR, bytes(16), 40, ROOT)[0] == 0
        assert session_threads(earlier) == threads + 2 and server.in_flight == 3
        server.latency = 0
        server.release()
        assert sorted(answer(kernel)[:2] for _ in nodes) == [(20, errno.EINTR), (21, errno.EINTR), (22, errno.EINTR)]
        wait_until(lambda: session_threads(earlier) == threads, 30)
