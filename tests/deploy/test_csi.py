"""`shardfs csi`, called over its unix socket as kubelet calls it: the CSI sanity suite's node-plugin cases
(missing fields, idempotent publish and unpublish, capabilities and info), then real publishes of a remote
dataset on a loopback server, served by a daemon running as a uid of its own with no capabilities and read through
the target path by tensorstore, cloud-volume and another user; an unpublish whose daemon hangs; the publish
secret nowhere but the daemon's memory; two volumes served by one daemon, each with its own figures."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tensorstore as ts
from cloudvolume import CloudVolume

from shardfs.csi import DAEMON_UIDS, DRIVER
from shardfs.csi import csi_pb2 as pb
from shardfs.csi import csi_pb2_grpc as rpc
from shardfs.csi import server as csi_server
from shardfs.csi.server import NodeService
from shardfs.csi.volume import volume_of
from shardfs.fuse.mount import MountOptions, connection_of, mount, unmount
from shardfs.host import handoff, publisher, supervisor
from shardfs.host.errors import PublishError
from shardfs.host.publisher import Publisher
from shardfs.service import mountinfo, stats_socket
from tests.support.cli import scrape
from tests.support.daemons import wait_for
from tests.support.http_server import RangeServer
from tests.support.users import as_user

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.loopback]


PATIENCE = 120.0  # seconds: only a hang waits this long
NODE_ID = "node-under-test"
MOUNT = pb.VolumeCapability(
    mount=pb.VolumeCapability.MountVolume(),
    access_mode=pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY),
)


@dataclass
class Plugin:
    process: subprocess.Popen[bytes]
    log: Path
    identity: rpc.IdentityStub
    node: rpc.NodeStub
    channel: grpc.Channel
    pods: Path  # where targets go, as under /var/lib/kubelet/pods

    def daemons(self) -> list[psutil.Process]:
        """The volumes' daemons alive now (one killed is a zombie until the plugin reaps it)."""
        found = []
        for child in psutil.Process(self.process.pid).children():
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE and "shardfs.host.daemon" in child.cmdline():
                    found.append(child)
        return found


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plugin]:
    root = tmp_path_factory.mktemp("csi")
    sock, log = root / "plugin" / "csi.sock", root / "plugin.log"
    pods = Path(tempfile.mkdtemp(prefix="shardfs-csi-pods-", dir="/tmp"))  # where a pod's user can reach
    pods.chmod(0o755)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "shardfs", "csi", f"--endpoint=unix://{sock}", f"--node-id={NODE_ID}",
             f"--run-dir={root / 'run'}", f"--kubelet-dir={pods}"], stdout=out, stderr=out,
        )  # fmt: skip
    channel = grpc.insecure_channel(f"unix://{sock}")
    grpc.channel_ready_future(channel).result(timeout=PATIENCE)
    yield Plugin(process, log, rpc.IdentityStub(channel), rpc.NodeStub(channel), channel, pods)
    for point, _ in mountinfo.shardfs_mounts():  # what a failed test left published
        if point.startswith(str(pods)):
            plugin_unpublish(channel, point)
    process.send_signal(signal.SIGTERM)
    process.wait(PATIENCE)
    channel.close()
    shutil.rmtree(pods)


def plugin_unpublish(channel: grpc.Channel, target: str) -> None:
    rpc.NodeStub(channel).NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="left", target_path=target))


@pytest.fixture(scope="module")
def server(raw_volume) -> Iterator[RangeServer]:
    with RangeServer(raw_volume[0]).running() as s:
        yield s


def publish(
    plugin: Plugin, target: Path, attributes: dict[str, str], volume_id: str = "vol-1", **fields: object
) -> pb.NodePublishVolumeResponse:
    request = pb.NodePublishVolumeRequest(
        volume_id=volume_id, target_path=str(target), volume_capability=MOUNT, readonly=True,
        volume_context=attributes, **fields,
    )  # fmt: skip
    return plugin.node.NodePublishVolume(request, timeout=PATIENCE)


def unpublish(plugin: Plugin, target: Path, volume_id: str = "vol-1") -> None:
    request = pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target))
    plugin.node.NodeUnpublishVolume(request, timeout=PATIENCE)


def refusal(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()  # type: ignore[operator]
    return e.value.code(), e.value.details()


def test_identity_and_node_info(plugin: Plugin) -> None:
    info = plugin.identity.GetPluginInfo(pb.GetPluginInfoRequest())
    assert info.name == DRIVER and info.vendor_version
    assert not plugin.identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest()).capabilities  # no controller
    assert plugin.identity.Probe(pb.ProbeRequest()).ready.value is True
    assert plugin.node.NodeGetInfo(pb.NodeGetInfoRequest()).node_id == NODE_ID
    assert not plugin.node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest()).capabilities  # no staging


@pytest.mark.parametrize(
    "method", ["/csi.v1.Node/NodeStageVolume", "/csi.v1.Node/NodeGetVolumeStats", "/csi.v1.Controller/CreateVolume"]
)
def test_what_a_node_plugin_does_not_do_is_unimplemented(plugin: Plugin, method: str) -> None:
    call = plugin.channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
    assert refusal(lambda: call(b"", timeout=PATIENCE))[0] == grpc.StatusCode.UNIMPLEMENTED


def test_missing_fields_are_invalid_arguments(plugin: Plugin) -> None:
    """As csi-sanity's node cases: no volume id, no target path, no capability: INVALID_ARGUMENT, naming it."""
    target = str(plugin.pods / "never")
    requests = {
        "volume_id": pb.NodePublishVolumeRequest(target_path=target, volume_capability=MOUNT),
        "target_path": pb.NodePublishVolumeRequest(volume_id="v", volume_capability=MOUNT),
        "volume_capability": pb.NodePublishVolumeRequest(volume_id="v", target_path=target),
    }
    for field, request in requests.items():
        code, details = refusal(lambda r=request: plugin.node.NodePublishVolume(r))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details
    for field, request in {
        "volume_id": pb.NodeUnpublishVolumeRequest(target_path=target),
        "target_path": pb.NodeUnpublishVolumeRequest(volume_id="v"),
    }.items():
        code, details = refusal(lambda r=request: plugin.node.NodeUnpublishVolume(r))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details
    assert not os.path.lexists(target)


@pytest.mark.parametrize(
    ("attributes", "flags", "secrets", "named"),
    [
        ({}, [], {}, "source"),
        ({"source": "https://example.org/x", "cachesize": "1G"}, [], {}, "cachesize"),
        ({"source": "https://user:pw@example.org/x"}, [], {}, "source: holds a user:password@"),
        ({"source": "s3://b/x", "endpoint": "http://user:pw@127.0.0.1:9000"}, [], {}, "endpoint: holds a user"),
        ({"source": "https://example.org/x", "cacheSize": "12"}, [], {}, "cacheSize"),
        ({"source": "https://example.org/x", "view": "n6"}, [], {}, "view"),
        ({"source": "https://example.org/x", "anonymous": "yes"}, [], {}, "anonymous: 'yes' is not true or false"),
        ({"source": "https://example.org/x", "requesterPays": "1"}, [], {}, "requesterPays: '1' is not true or"),
        ({"source": "https://example.org/x"}, ["no_such_option"], {}, "no_such_option"),
        ({"source": "https://example.org/x"}, ["noexec,subtype=other"], {}, "subtype is the plugin's"),
        ({"source": "https://example.org/x"}, ["auto_unmount"], {}, "auto_unmount"),
        ({"source": "https://example.org/x"}, [], {"AWS_SECRET": "x"}, "AWS_SECRET"),
        # Malformed or unreadable sources, refused before anything is mounted or started.
        ({"source": "s3://"}, [], {}, "source: s3://: no bucket named"),
        ({"source": "ftp://example.org/x"}, [], {}, "source: ftp://example.org/x: unknown scheme 'ftp'"),
        ({"source": "http://[127.0.0.1/x"}, [], {}, "source: http://[127.0.0.1/x: not a URL"),
        ({"source": "http://127.0.0.1:port/x"}, [], {}, "source: http://127.0.0.1:port/x: not a URL"),
        # Over the node's ceilings (the plugin's defaults: 1 GiB, 256 MiB, 64 threads).
        ({"source": "https://example.org/x", "cacheSize": "100G"}, [], {}, "cacheSize: 100.0 GiB is over this node"),
        ({"source": "https://example.org/x", "maxFileSize": "2G"}, [], {}, "maxFileSize: 2.0 GiB is over"),
        ({"source": "https://example.org/x"}, ["max_threads=2000"], {}, "max_threads: 2000 is over this node's"),
        # A path of the node: the plugin is given no --local-root, so none is allowed.
        ({"source": "/etc"}, [], {}, "source /etc: a node-local path outside the driver's --local-root"),
        ({"source": "file:///tmp/../etc"}, [], {}, "source /tmp/../etc: a node-local path outside"),
    ],
)
def test_a_volume_that_cannot_work_is_refused_naming_what(plugin: Plugin, attributes, flags, secrets, named) -> None:
    capability = pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(mount_flags=flags))
    request = pb.NodePublishVolumeRequest(
        volume_id="v", target_path=str(plugin.pods / "bad"), volume_capability=capability,
        volume_context={**attributes, "csi.storage.k8s.io/pod.name": "p"}, secrets=secrets,
    )  # fmt: skip
    code, details = refusal(lambda: plugin.node.NodePublishVolume(request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and named in details, details
    assert "pw" not in details
    assert not os.path.lexists(plugin.pods / "bad") and not plugin.daemons()
    assert "Traceback" not in plugin.log.read_text()


def test_targets_outside_kubelets_directory_are_refused(plugin: Plugin, mount, raw_volume, tmp_path) -> None:
    """Publish and unpublish act only under --kubelet-dir: not at another path, not through `..`, not through a
    link under it that leads out; and another shardfs mount of the node is never taken down by an unpublish."""
    elsewhere = mount(raw_volume[0])  # a shardfs mount of the node's own, outside kubelet's directory
    escape = plugin.pods / "escape"
    escape.symlink_to(tmp_path)
    try:
        for target in (tmp_path / "t", plugin.pods / ".." / "t", escape / "t", elsewhere.path):
            request = pb.NodePublishVolumeRequest(
                volume_id="v", target_path=str(target), volume_capability=MOUNT,
                volume_context={"source": "https://example.org/x"},
            )  # fmt: skip
            code, details = refusal(lambda r=request: plugin.node.NodePublishVolume(r))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "--kubelet-dir" in details, details
            code, details = refusal(lambda t=target: unpublish(plugin, t))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "--kubelet-dir" in details, details
        assert not (tmp_path / "t").exists() and os.path.ismount(elsewhere.path)
        assert sorted(os.listdir(elsewhere.path)) == sorted(os.listdir(raw_volume[1]))
    finally:
        escape.unlink()


def test_a_relative_target_is_refused_as_not_absolute(plugin: Plugin) -> None:
    """A target_path kubelet would never send, relative (to whatever the plugin's working directory is): refused
    in one line saying so, for publish and unpublish alike, and nothing made."""
    relative = os.path.relpath(plugin.pods / "relative", Path.cwd())
    request = pb.NodePublishVolumeRequest(
        volume_id="v", target_path=relative, volume_capability=MOUNT, volume_context={"source": "https://example.org/x"}
    )
    for call in (lambda: plugin.node.NodePublishVolume(request), lambda: unpublish(plugin, Path(relative))):
        code, details = refusal(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details == f"target_path {relative}: not an absolute path"
    assert not (plugin.pods / "relative").exists() and not plugin.daemons()


def test_block_access_is_refused(plugin: Plugin) -> None:
    capability = pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume())
    request = pb.NodePublishVolumeRequest(
        volume_id="v", target_path=str(plugin.pods / "block"), volume_capability=capability,
        volume_context={"source": "https://example.org/x"},
    )  # fmt: skip
    assert refusal(lambda: plugin.node.NodePublishVolume(request))[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_unpublish_of_what_is_not_published_is_ok(plugin: Plugin) -> None:
    unpublish(plugin, plugin.pods / "nothing-here")
    (plugin.pods / "empty").mkdir()
    unpublish(plugin, plugin.pods / "empty")  # a target made and never mounted (a publish that failed)
    assert not (plugin.pods / "empty").exists()


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_publish_serves_the_dataset_from_an_unprivileged_daemon(plugin: Plugin, server, raw_volume) -> None:
    _, twin, expected = raw_volume
    target = plugin.pods / "pod-a" / "volumes" / "data"
    target.parent.mkdir(parents=True)
    attributes = {"source": f"precomputed://{server.url}", "cacheSize": "16M", "timeout": "20", "logLevel": "INFO"}
    publish(plugin, target, attributes)
    assert re.search(rf"msg=\"?mounted \S+ at {re.escape(str(target))},", plugin.log.read_text())  # the daemon's
    mounted = mountinfo.exactly_at(str(target))
    assert mounted is not None and mounted.fstype == "fuse.shardfs"
    assert {"ro", "allow_other", "default_permissions"} <= set(mounted.options.split(",") + _vfs(target))
    [daemon] = plugin.daemons()
    status = _status(daemon.pid)
    uid = int(status["Uid"].split()[0])
    assert uid in DAEMON_UIDS and status["Uid"].split() == [str(uid)] * 4 and status["Gid"].split() == ["65534"] * 4
    assert f"user_id={uid}" in mounted.options.split(",")  # the mount is its daemon's
    assert status["Groups"].strip() == ""
    assert all(int(status[c], 16) == 0 for c in ("CapInh", "CapPrm", "CapEff", "CapAmb"))
    assert status["NoNewPrivs"] == "1"

    spec = {"driver": "neuroglancer_precomputed", "kvstore": f"file://{target}", "scale_index": 0}
    assert np.array_equal(ts.open(spec).result().read().result(), expected)
    cv = CloudVolume(f"file://{target}", mip=0, fill_missing=True, progress=False)
    assert np.array_equal(np.asarray(cv[cv.bounds]), expected)
    name = sorted(os.listdir(twin / "4_4_40"))[-1]
    read = as_user((12345, 12345), "sha256sum", target / "4_4_40" / name)  # a pod's uid, whatever it is
    assert read.returncode == 0, read.stderr
    assert read.stdout.split()[0] == hashlib.sha256((twin / "4_4_40" / name).read_bytes()).hexdigest()

    stats = subprocess.run([sys.executable, "-m", "shardfs", "stats", str(target)], capture_output=True, text=True)
    assert stats.returncode == 0 and "uptime" in stats.stdout.lower(), stats.stderr  # an operator's view of it
    publish(plugin, target, attributes)  # kubelet retrying: the same mount, the same daemon
    assert mountinfo.exactly_at(str(target)) == mounted and plugin.daemons() == [daemon]
    code, details = refusal(lambda: publish(plugin, target, {**attributes, "view": "n5"}))
    assert code == grpc.StatusCode.ALREADY_EXISTS and str(target) in details

    unpublish(plugin, target)
    assert not target.exists() and mountinfo.exactly_at(str(target)) is None
    daemon.wait(PATIENCE)
    unpublish(plugin, target)  # again: OK, nothing to do


def _vfs(target: Path) -> list[str]:
    """The mount's own flags (ro, nosuid...), from mountinfo's per-mount field."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")[0].split()
        if fields[4] == str(target):
            return fields[5].split(",")
    return []


def test_a_source_that_cannot_be_opened_is_refused_and_leaves_nothing(plugin: Plugin, server, raw_volume) -> None:
    """A source with nothing there (404s) is NOT_FOUND, as the CSI spec's table has it; one that is there and
    cannot be made sense of (a damaged info) is FAILED_PRECONDITION. Either way nothing is left."""
    target = plugin.pods / "missing"
    attributes = {"source": f"precomputed://{server.url}/no/such/dataset", "timeout": "5"}
    code, details = refusal(lambda: publish(plugin, target, attributes, volume_id="vol-missing"))
    assert code == grpc.StatusCode.NOT_FOUND and "vol-missing" in details and "nor 'info'" in details
    assert not target.exists() and mountinfo.exactly_at(str(target)) is None and not plugin.daemons()
    damaged = Path(tempfile.mkdtemp(prefix="shardfs-csi-damaged-", dir="/tmp"))
    try:
        shutil.copytree(raw_volume[0], damaged / "vol")
        (damaged / "vol" / "info").write_text("{not json")
        with RangeServer(damaged / "vol").running() as bad:
            code, details = refusal(lambda: publish(plugin, target, {"source": f"precomputed://{bad.url}"}, "vol-bad"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "info: not valid JSON" in details, details
        assert not target.exists() and mountinfo.exactly_at(str(target)) is None and not plugin.daemons()
    finally:
        shutil.rmtree(damaged)


def test_unpublish_of_a_hung_daemon_aborts_and_never_hangs(plugin: Plugin, server, raw_volume) -> None:
    """The daemon stopped (SIGSTOP) with a reader waiting on it: unpublish returns, the reader gets an error,
    nothing stays mounted, the daemon is gone."""
    _, twin, _ = raw_volume
    target = plugin.pods / "hung"
    publish(plugin, target, {"source": f"precomputed://{server.url}"}, volume_id="vol-hung")
    [daemon] = plugin.daemons()
    daemon.suspend()
    try:
        name = sorted(os.listdir(twin / "4_4_40"))[0]
        reader = subprocess.Popen(["cat", str(target / "4_4_40" / name)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)  # fmt: skip
        waited = wait_for(lambda: _waiting_on(target, reader.pid) or reader.poll() is not None, PATIENCE)
        ended = reader.poll()
        assert waited and ended is None, (
            f"the reader never waited on the daemon (pid {daemon.pid}, {daemon.status()}): it ended {ended}, saying"
            f" {reader.stderr.read() if ended is not None else b''!r}; mounted: {mountinfo.exactly_at(str(target))}"
        )
        done = threading.Event()
        thread = threading.Thread(target=lambda: (unpublish(plugin, target, "vol-hung"), done.set()), daemon=True)
        thread.start()
        assert done.wait(PATIENCE), "unpublish hung"
    finally:  # else the later tests' volumes would go to this stopped daemon, or find it serving
        with contextlib.suppress(psutil.Error):
            daemon.resume()
        if mountinfo.exactly_at(str(target)) is not None:
            unpublish(plugin, target, "vol-hung")
    assert reader.wait(PATIENCE) != 0
    assert mountinfo.exactly_at(str(target)) is None and not target.exists()
    assert daemon.wait(PATIENCE) is not None or not daemon.is_running()
    assert "aborted" in plugin.log.read_text()


def test_a_take_down_never_aborts_the_mount_given_its_number_next(tmp_path: Path, monkeypatch) -> None:
    """The kernel gives an ended connection's number to the next FUSE mount made anywhere (another pod's volume,
    another user's): one made just as a volume is taken down, under the same number, is not aborted by it."""
    node, made = Publisher(tmp_path / "run"), []
    taken, after = tmp_path / "taken", tmp_path / "after"
    after.mkdir()

    def unmount_then_mount_after(point: Path, lazy: bool = False) -> None:
        unmount(point, lazy=lazy)
        made.append(mount(after, MountOptions(fsname="after", subtype="probe")))

    monkeypatch.setattr(publisher, "unmount", unmount_then_mount_after)
    given_again = False
    try:
        for _ in range(5):  # another test's mount may take the number first
            taken.mkdir(exist_ok=True)
            fd = mount(taken, MountOptions(fsname="taken", subtype="probe"))
            number = connection_at(taken)
            node._end(str(taken), number)
            os.close(fd)
            given_again = connection_at(after) == number
            if given_again:
                os.set_blocking(made[-1], False)
                assert os.read(made[-1], 1 << 20), "the next mount's INIT is gone: it was aborted"  # ENODEV if so
                break
            unmount(after, lazy=True)
    finally:
        monkeypatch.undo()  # before node.close(), which unmounts its fusectl
        node.close()
        with contextlib.suppress(OSError):
            unmount(after, lazy=True)
        for fd in made:
            os.close(fd)
    assert given_again, "no next mount was given the number: nothing was checked"


def test_a_daemon_that_does_not_answer_is_given_no_more_volumes(server, raw_volume, tmp_path, monkeypatch) -> None:
    """A shared daemon stopped (SIGSTOP): the next publish waits READY_TIMEOUT and fails saying so, and the one
    after is served by a new daemon rather than handed to the stopped one, for ever, as the last one was."""
    _, twin, _ = raw_volume
    monkeypatch.setattr(supervisor, "READY_TIMEOUT", 5.0)
    node, targets = Publisher(tmp_path / "run"), [tmp_path / name for name in ("first", "second", "third")]
    volume = volume_of({"source": f"precomputed://{server.url}", "timeout": "20"}, [], {})
    node.publish("vol-1", str(targets[0]), volume)
    [stopped] = node.daemons
    stopped.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(PublishError, match="did not answer in 5 s"):
            node.publish("vol-2", str(targets[1]), volume)
        node.publish("vol-3", str(targets[2]), volume)
        assert node.published[str(targets[2])].daemon is not stopped
        name = sorted(os.listdir(twin / "4_4_40"))[0]
        assert (targets[2] / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
    finally:
        stopped.process.send_signal(signal.SIGCONT)
        for target in targets:
            node.unpublish("any", str(target))
        node.close()


def connection_at(point: Path) -> int | None:
    mounted = mountinfo.exactly_at(str(point))
    assert mounted is not None
    return int(mounted.device.split(":")[1])


def _waiting_on(target: Path, pid: int) -> bool:
    """Whether pid is blocked in a request to the FUSE connection at target (its daemon stopped)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() in ("request_wait_answer", "fuse_wait_answer") or (
            psutil.Process(pid).status() == psutil.STATUS_DISK_SLEEP
        )
    except (OSError, psutil.Error):
        return False


def test_the_publish_secret_is_nowhere_but_the_daemon(plugin: Plugin, raw_volume, tmp_path: Path) -> None:
    """An S3 source (path-style, on a loopback server that refuses any request not signed with the key id
    from the secret): read through the mount, then the secret looked for in the plugin's log, every
    process's argv and environment, and the mount table."""
    _, twin, _ = raw_volume
    bucket = tmp_path / "s3"
    (bucket / "bkt").mkdir(parents=True)
    os.symlink(raw_volume[0], bucket / "bkt" / "vol")
    key_id, secret = f"AKIA{uuid.uuid4().hex[:12].upper()}", f"secret-{uuid.uuid4().hex}"
    target = plugin.pods / "signed"
    with RangeServer(bucket).running() as s3:
        s3.admit = lambda auth: (auth or "").startswith(f"AWS4-HMAC-SHA256 Credential={key_id}/")
        attributes = {"source": "s3://bkt/vol", "endpoint": s3.url, "region": "us-east-1", "timeout": "20"}
        secrets = {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}
        publish(plugin, target, attributes, volume_id="vol-signed", secrets=secrets)
        name = sorted(os.listdir(twin / "4_4_40"))[0]
        assert (target / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        assert s3.authorizations and all(a and key_id in a for a in s3.authorizations)
        [daemon] = plugin.daemons()
        seen = [plugin.log.read_text(), Path("/proc/self/mountinfo").read_text(), Path("/proc/mounts").read_text()]
        for process in psutil.process_iter():
            try:
                seen.append(Path(f"/proc/{process.pid}/cmdline").read_bytes().decode(errors="replace"))
                seen.append(Path(f"/proc/{process.pid}/environ").read_bytes().decode(errors="replace"))
            except OSError:
                pass
        assert secret not in "\n".join(seen)
        assert not _readable_by_another_daemon_user(daemon.pid)
        unpublish(plugin, target, "vol-signed")
    assert secret not in plugin.log.read_text()


def _readable_by_another_daemon_user(pid: int) -> bool:
    """Whether another process of the daemon's own uid (what a daemon of another volume was, before each had a
    uid of its own) could read the daemon's environment: not while it is not dumpable."""
    uid = int(_status(pid)["Uid"].split()[0])
    read = as_user((uid, 65534), "cat", f"/proc/{pid}/environ")
    return read.returncode == 0


def figures(target: Path) -> dict[tuple[str, frozenset], float]:
    """`shardfs stats --prometheus TARGET`, as an operator asks a volume's daemon."""
    done = subprocess.run(
        [sys.executable, "-m", "shardfs", "stats", "--prometheus", str(target)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return scrape(done.stdout)


def test_one_daemon_serves_two_volumes_each_with_its_own_figures(plugin: Plugin, server, raw_volume) -> None:
    """Two volumes published as kubelet publishes them share one unprivileged daemon, which took the second
    one's descriptor over its hand-off socket; tensorstore reads one and cloud-volume the other through their
    targets, and each volume's stats show its own cache budget, its own bytes served and its own mountpoint; the
    daemon's log lines of each volume's requests start with that volume's target. Unpublishing one leaves the
    other served by the same daemon; unpublishing the last ends it."""
    _, twin, expected = raw_volume
    a, b = plugin.pods / "two-a", plugin.pods / "two-b"
    attributes = {"source": f"precomputed://{server.url}", "timeout": "20"}
    publish(plugin, a, {**attributes, "cacheSize": "16M"}, volume_id="vol-a")
    publish(plugin, b, {**attributes, "cacheSize": "8M", "logLevel": "DEBUG"}, volume_id="vol-b")  # a line a request
    [daemon] = plugin.daemons()
    assert int(_status(daemon.pid)["Uid"].split()[0]) in DAEMON_UIDS
    connections = {int(mountinfo.exactly_at(str(t)).device.split(":")[1]) for t in (a, b)}  # type: ignore[union-attr]
    assert _fuse_connections_held(daemon.pid) in (connections, {-1})  # -1: a kernel whose fdinfo does not say

    first = sorted(os.listdir(twin / "4_4_40"))[0]
    assert (b / "4_4_40" / first).read_bytes() == (twin / "4_4_40" / first).read_bytes()
    spec = {"driver": "neuroglancer_precomputed", "kvstore": f"file://{a}", "scale_index": 0}
    assert np.array_equal(ts.open(spec).result().read().result(), expected)
    for target in (a, b):  # the log level is the process's: the most verbose its volumes ask
        assert re.search(rf"op=read .*msg=\"?{re.escape(str(target))}: answered", plugin.log.read_text()), target
    served = "shardfs_served_bytes_total", frozenset()
    budget = "shardfs_cache_budget_bytes", frozenset()
    of_a, of_b = figures(a), figures(b)
    assert of_a[budget] == 16 << 20 and of_b[budget] == 8 << 20
    assert of_a[served] >= expected.nbytes and 0 < of_b[served] < expected.nbytes  # a's reads counted as a's alone
    assert [dict(labels)["mountpoint"] for name, labels in of_a if name == "shardfs_mount_info"] == [str(a)]

    cv = CloudVolume(f"file://{b}", mip=0, fill_missing=True, progress=False)
    assert np.array_equal(np.asarray(cv[cv.bounds]), expected)
    assert figures(b)[served] > of_b[served] and figures(a)[served] == of_a[served]

    unpublish(plugin, a, "vol-a")
    assert not a.exists() and plugin.daemons() == [daemon]
    name = sorted(os.listdir(twin / "4_4_40"))[1]
    assert (b / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
    lookups = ("shardfs_fuse_op_seconds_count", frozenset({("op", "lookup")}))
    before = figures(b).get(lookups, 0)
    assert not (b / "4_4_40" / "no-such-chunk").exists()  # a name the kernel never saw: asked of the daemon
    assert figures(b)[lookups] > before
    unpublish(plugin, b, "vol-b")
    assert not b.exists() and not plugin.daemons()


def _fuse_connections_held(pid: int) -> set[int]:
    """The FUSE connections whose /dev/fuse pid holds open (fdinfo names them on kernels from 6.18)."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse":
                found = re.search(r"^fuse_connection:\s*(\d+)$", Path(f"/proc/{pid}/fdinfo/{fd}").read_text(), re.M)
                held.add(int(found.group(1)) if found else -1)
    return held


def test_a_killed_daemon_is_replaced_under_16_readers_with_no_error(plugin: Plugin, raw_volume) -> None:
    """16 readers of cold chunks over a server answering in 200 ms, and the volume's daemon killed (SIGKILL)
    in their midst: the plugin's keeper held the connection and its record, a new daemon takes it up (no
    mount, no INIT; the kernel resends what the dead one had read), and every reader gets every byte as
    tensorstore wrote it, with no error, over the one connection throughout."""
    _, twin, _ = raw_volume
    names = sorted(os.listdir(twin / "4_4_40"))
    target = plugin.pods / "replaced"
    with RangeServer(raw_volume[0], latency=0.2).running() as slow:
        publish(plugin, target, {"source": f"precomputed://{slow.url}", "timeout": "60"}, volume_id="vol-replaced")
        mounted = mountinfo.exactly_at(str(target))
        assert mounted is not None
        [first] = plugin.daemons()
        assert int(mounted.device.split(":")[1]) in _fuse_connections_held(plugin.process.pid) | {-1}
        errors: list[str] = []
        read: list[str] = []

        def reader(mine: list[str]) -> None:
            for name in mine:
                try:
                    got = (target / "4_4_40" / name).read_bytes()
                except OSError as e:
                    errors.append(f"{name}: {e}")
                    continue
                if got != (twin / "4_4_40" / name).read_bytes():
                    errors.append(f"{name}: other bytes")
                read.append(name)

        threads = [threading.Thread(target=reader, args=(names[i::16],)) for i in range(csi_server.PUBLISHING)]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: len(read) >= 4, PATIENCE), "the readers never got going"
        first.kill()
        for thread in threads:
            thread.join(PATIENCE)
        assert not errors, errors[:5]
        assert sorted(read) == names and not any(t.is_alive() for t in threads)
        [second] = plugin.daemons()
        assert second.pid != first.pid
        assert mountinfo.exactly_at(str(target)) == mounted  # the same mount, the same connection
        assert figures(target)["shardfs_served_bytes_total", frozenset()] > 0  # stats reach the new daemon
        assert "a new one takes the connection up" in plugin.log.read_text()
        unpublish(plugin, target, "vol-replaced")
    assert mountinfo.exactly_at(str(target)) is None and not plugin.daemons()


def test_a_daemon_that_keeps_dying_is_let_go_and_its_readers_get_an_error(plugin: Plugin, server, raw_volume) -> None:
    """Replaced three times within a minute, the fourth end is final: the keeper's copy is dropped, so a reader
    gets an error at once rather than a wait; a second publish mounts afresh."""
    _, twin, _ = raw_volume
    target = plugin.pods / "dying"
    attributes = {"source": f"precomputed://{server.url}"}
    publish(plugin, target, attributes, volume_id="vol-dying")
    names = sorted(os.listdir(twin / "4_4_40"))
    for name in names[:3]:
        [daemon] = plugin.daemons()
        daemon.kill()
        daemon.wait(PATIENCE)
        # The read waits through the gap and is answered by the next daemon.
        assert (target / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
    [daemon] = plugin.daemons()
    daemon.kill()
    assert wait_for(lambda: "the mount is dead" in plugin.log.read_text(), PATIENCE)
    name = names[3]
    reader = subprocess.run(["cat", str(target / "4_4_40" / name)], capture_output=True, timeout=PATIENCE)
    assert reader.returncode != 0 and re.search(rb"not connected|connection abort", reader.stderr), reader.stderr
    publish(plugin, target, attributes, volume_id="vol-dying")  # kubelet's retry: cleared and mounted again
    assert (target / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
    unpublish(plugin, target, "vol-dying")
    assert mountinfo.exactly_at(str(target)) is None


def test_a_second_call_on_a_target_in_progress_is_aborted(plugin: Plugin, raw_volume) -> None:
    """While a publish waits on a source that does not answer, another call on that target is ABORTED (kubelet
    retries it); the first one then fails in words, leaving nothing."""
    target = plugin.pods / "slow"
    with RangeServer(raw_volume[0]).running() as slow:
        slow.hang = True
        attributes = {"source": f"precomputed://{slow.url}", "timeout": "2"}
        first: list[grpc.RpcError | None] = []
        thread = threading.Thread(target=lambda: first.append(_error_of(lambda: publish(plugin, target, attributes))))
        thread.start()
        assert wait_for(lambda: bool(plugin.daemons()), PATIENCE), "the first publish never started its daemon"
        code, details = refusal(lambda: publish(plugin, target, attributes))
        assert code == grpc.StatusCode.ABORTED and "in progress" in details
        code, _ = refusal(lambda: unpublish(plugin, target))
        assert code == grpc.StatusCode.ABORTED
        thread.join(PATIENCE)
    assert first and first[0] is not None and first[0].code() == grpc.StatusCode.FAILED_PRECONDITION
    assert mountinfo.exactly_at(str(target)) is None and not target.exists()


def _error_of(call: object) -> grpc.RpcError | None:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as e:
        return e
    return None


def test_a_daemon_keeps_nothing_under_a_volume_it_does_not_serve(server, raw_volume, tmp_path) -> None:
    """A compromised daemon (the threat its unprivileged, non-dumpable user is for) sends KEEP naming another
    tenant's target with a connection of its own, then that volume's daemon ends: the next daemon must be handed
    the victim's own connection, never the attacker's. Nor is a served target's KEEP allowed to swap the /dev/fuse
    the plugin mounted there for one of the daemon's choosing."""
    _, twin, _ = raw_volume
    node = Publisher(tmp_path / "run")
    victim = tmp_path / "victim"
    attacker_point, own = tmp_path / "attacker", tmp_path / "own"
    attacker_point.mkdir()
    volume = volume_of({"source": f"precomputed://{server.url}", "timeout": "20"}, [], {})
    node.publish("vol-victim", str(victim), volume)
    attackers = mount(attacker_point, MountOptions(fsname="attacker", subtype="probe"))
    record = os.memfd_create("record")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    evil = supervisor.Daemon(subprocess.Popen(["sleep", "600"]), ours, {}, node.supervisor._hold_record)
    evil.targets.add(str(own))
    try:
        victims = connection_at(victim)
        assert victims is not None and connection_at(attacker_point) != victims
        handoff.send(theirs, handoff.Keep(str(victim), [attackers, record]))
        handoff.send(theirs, handoff.Keep(str(own), [attackers, record]))  # served, but not its own /dev/fuse
        theirs.close()
        assert wait_for(lambda: not evil.alive, 30), "the plugin never read what the daemon sent"
        held = node.held.take(str(victim))
        try:
            assert [connection_of(fd) for fd in held[:1]] == [victims], "the attacker's connection is kept"
        finally:
            for fd in held:
                os.close(fd)
        assert node.held.take(str(own)) == []  # nothing was mounted there: nothing kept
        [daemon] = [d for d in node.daemons if d is not evil]
        daemon.process.kill()  # the victim's daemon ends: the next one takes up what the keeper holds
        name = sorted(os.listdir(twin / "4_4_40"))[5]
        assert wait_for(lambda: node.published[str(victim)].daemon is not daemon, PATIENCE)
        assert (victim / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        assert connection_at(victim) == victims
    finally:
        evil.process.kill()
        node.unpublish("vol-victim", str(victim))
        node.close()
        unmount(attacker_point, lazy=True)
        os.close(attackers)
        os.close(record)


def test_local_sources_only_under_the_drivers_local_roots(raw_volume, tmp_path, public_tmp) -> None:
    """With `--local-root DIR`, a volume may name a dataset under DIR, or DIR itself, and nothing else of the
    node: not a path outside, nor a link under DIR that leads outside. Served over gRPC as kubelet calls it."""
    source, twin, _ = raw_volume
    root, outside = public_tmp / "datasets", public_tmp / "private"
    root.mkdir()
    shutil.copytree(source, root / "vol")
    shutil.copytree(source, outside)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the daemon's user, nobody
    shutil.copytree(source, root / "closed" / "vol")
    (root / "closed").chmod(0o700)  # root's alone: the daemon cannot read it, and says so at once
    (root / "escape").symlink_to(outside)
    node = Publisher(tmp_path / "run")
    server = grpc.server(ThreadPoolExecutor(4))
    rpc.add_NodeServicer_to_server(NodeService(node, NODE_ID, [root], tmp_path), server)
    server.add_insecure_port(f"unix://{tmp_path / 'csi.sock'}")
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'csi.sock'}")
    stub = rpc.NodeStub(channel)
    target = tmp_path / "target"

    def publish_local(path: Path) -> None:
        stub.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id="local", target_path=str(target), volume_capability=MOUNT, volume_context={"source": str(path)},
        ), timeout=PATIENCE)  # fmt: skip

    try:
        for refused in (outside, root / "escape", root / ".." / "private"):
            code, details = refusal(lambda p=refused: publish_local(p))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "--local-root" in details, details
            assert not target.exists()
        code, details = refusal(lambda: publish_local(root / "closed" / "vol"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "Permission denied" in details, details
        publish_local(root / "vol")
        name = sorted(os.listdir(twin / "4_4_40"))[2]
        assert (target / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        stub.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="local", target_path=str(target)))
        assert not target.exists()
        publish_local(root)  # the directory of datasets itself (issue 43): shown as stored, the link not at all
        assert sorted(os.listdir(target)) == ["closed", "vol"]
        assert (target / "vol" / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        stub.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="local", target_path=str(target)))
        assert not target.exists()
    finally:
        channel.close()
        server.stop(None)
        with contextlib.suppress(PublishError):
            node.unpublish("local", str(target))
        node.close()


def test_publishes_stuck_on_their_source_never_hold_up_an_unpublish(plugin: Plugin, raw_volume) -> None:
    """16 publishes of a source that does not answer (each waits on it): a 17th is UNAVAILABLE at once, and an
    unpublish is answered while all 16 still wait; once the source answers, every one is published."""
    targets = [plugin.pods / f"stuck-{i}" for i in range(csi_server.PUBLISHING)]
    with RangeServer(raw_volume[0]).running() as stuck, ThreadPoolExecutor(len(targets)) as pool:
        stuck.hang = True
        attributes = {"source": f"precomputed://{stuck.url}", "timeout": "100"}
        waiting = [pool.submit(publish, plugin, t, attributes, f"vol-stuck-{i}") for i, t in enumerate(targets)]
        try:
            assert wait_for(lambda: stuck.in_flight >= len(targets), PATIENCE), "the publishes never reached it"
            code, details = refusal(lambda: publish(plugin, plugin.pods / "one-more", attributes, "vol-more"))
            assert code == grpc.StatusCode.UNAVAILABLE and "publishes are under way" in details
            unpublish(plugin, plugin.pods / "another-tenant", "vol-other")  # answered now, not after a publish
            assert not any(f.done() for f in waiting), [f.exception() for f in waiting if f.done()]
        finally:
            stuck.hang = False
            for future in waiting:
                future.result(PATIENCE)
            for i, target in enumerate(targets):
                unpublish(plugin, target, f"vol-stuck-{i}")
    assert not plugin.daemons()


def test_daemons_of_different_secrets_cannot_signal_or_relimit_each_other(plugin: Plugin, server, raw_volume) -> None:
    """Two tenants' volumes (different publish secrets) get two daemons, each a uid of its own from the plugin's
    range, the mount its daemon's (user_id=): a compromised daemon, as its uid, can neither signal, nor renice,
    nor prlimit the other (it could kill it four times a minute, and have the plugin give its volume up, when
    all shared uid 65534). A daemon replaced after a kill keeps its predecessor's uid, the mount's user."""
    _, twin, _ = raw_volume
    a, b = plugin.pods / "tenant-a", plugin.pods / "tenant-b"
    attributes = {"source": f"precomputed://{server.url}", "timeout": "20"}
    publish(plugin, a, attributes, "vol-tenant-a", secrets={"AWS_ACCESS_KEY_ID": "tenant-a"})
    publish(plugin, b, attributes, "vol-tenant-b", secrets={"AWS_ACCESS_KEY_ID": "tenant-b"})
    try:
        daemons = {int(_status(d.pid)["Uid"].split()[0]): d for d in plugin.daemons()}
        assert len(daemons) == 2 and set(daemons) <= set(DAEMON_UIDS), daemons
        for target in (a, b):
            options = mountinfo.exactly_at(str(target)).options.split(",")  # type: ignore[union-attr]
            assert any(f"user_id={uid}" in options for uid in daemons), options
        (uid_a, _), (uid_b, pid_b) = ((u, d.pid) for u, d in sorted(daemons.items()))
        for command in (["kill", "-0", str(pid_b)], ["renice", "-n", "19", "-p", str(pid_b)],
                        ["prlimit", "--nofile=16:16", "--pid", str(pid_b)]):  # fmt: skip
            done = as_user((uid_a, 65534), *command)
            assert done.returncode != 0 and "not permitted" in done.stderr, (command, done)
        assert as_user((uid_b, 65534), "kill", "-0", str(pid_b)).returncode == 0  # the check itself can succeed
        daemons[uid_b].kill()
        name = sorted(os.listdir(twin / "4_4_40"))[3]
        # the replacement serves once it has answered; then it has long made itself its uid
        assert (b / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        after = {int(_status(d.pid)["Uid"].split()[0]) for d in plugin.daemons()}
        assert after == {uid_a, uid_b}  # the replacement took the uid the mount was made for
        assert pid_b not in {d.pid for d in plugin.daemons()}
    finally:
        unpublish(plugin, a, "vol-tenant-a")
        # the plugin may still be handing b to its new daemon: ABORTED until then, and retried, as kubelet does
        assert wait_for(lambda: _error_of(lambda: unpublish(plugin, b, "vol-tenant-b")) is None, PATIENCE)


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(pair.decode(errors="replace").partition("=")[::2] for pair in pairs if pair)


def test_each_secret_has_its_own_daemon_inheriting_nothing_of_the_plugin(plugin: Plugin, server, raw_volume) -> None:
    """Two volumes with one publish secret share a daemon; a third whose secret differs in its secret key alone
    (a key id is no secret: another tenant may know it) has its own. A secret rotated since is the same volume:
    published again, by the same daemon. Each daemon's environment is what the plugin gives it, nothing of the
    plugin's own (whose credentials would reach every tenant)."""
    _, twin, _ = raw_volume
    attributes = {"source": f"precomputed://{server.url}", "timeout": "20"}
    mine = {"AWS_ACCESS_KEY_ID": "AKIASHARED", "AWS_SECRET_ACCESS_KEY": "mine"}
    volumes = {plugin.pods / "t-a": mine, plugin.pods / "t-b": mine,
               plugin.pods / "t-c": {**mine, "AWS_SECRET_ACCESS_KEY": "theirs"}}  # fmt: skip
    name = sorted(os.listdir(twin / "4_4_40"))[2]
    try:
        for target, secrets in volumes.items():
            publish(plugin, target, attributes, target.name, secrets=secrets)
        a, b, c = (stats_socket.ask(target)[0] for target in volumes)
        assert a == b != c and {a, c} == {d.pid for d in plugin.daemons()}
        publish(plugin, plugin.pods / "t-a", attributes, "t-a", secrets={**mine, "AWS_SECRET_ACCESS_KEY": "rotated"})
        assert stats_socket.ask(plugin.pods / "t-a")[0] == a
        for target in volumes:
            assert (target / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        plugins = _environ(plugin.process.pid)
        for pid in (a, c):
            given = _environ(pid)
            assert set(given) <= {"PATH", "LANG", "TMPDIR", "HOME"}, given
        assert set(plugins) - {"PATH", "LANG", "TMPDIR", "HOME"}  # the plugin had more to give away
    finally:
        for target in volumes:
            unpublish(plugin, target, target.name)


def test_unpublish_takes_down_every_mount_stacked_at_the_target(plugin: Plugin, server) -> None:
    """A shardfs mount made over a published volume's (a retry stacked them), its connection held and never
    served: unpublish takes both down, the one beneath too, and the target goes."""
    target = plugin.pods / "stacked"
    publish(plugin, target, {"source": f"precomputed://{server.url}", "timeout": "20"}, "vol-stacked")
    held = mount(target, MountOptions(fsname="stacked"))  # nothing may look inside it: INIT is never answered
    try:
        assert [point for point, _ in mountinfo.shardfs_mounts()].count(str(target)) == 2
        unpublish(plugin, target, "vol-stacked")
        assert str(target) not in [point for point, _ in mountinfo.shardfs_mounts()] and not target.exists()
    finally:
        os.close(held)
