"""The CSI Identity and Node services over a unix socket, as kubelet, node-driver-registrar and livenessprobe
call them. There is no controller: volumes are static PersistentVolumes and inline ephemeral volumes. A call
this plugin does not declare (staging, stats, expansion, every Controller call) is answered UNIMPLEMENTED by
grpcio itself. Requests are never logged: a publish carries the volume's secret."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

import grpc
from google.protobuf.wrappers_pb2 import BoolValue

from shardfs import __version__
from shardfs.csi import csi_pb2 as pb
from shardfs.csi import csi_pb2_grpc as rpc
from shardfs.csi.volume import BadVolume, Ceilings, volume_of
from shardfs.host.errors import PublishError
from shardfs.host.publisher import Publisher
from shardfs.logs import log_to_terminal
from shardfs.stores.location import parse_source

log = logging.getLogger("shardfs.csi")

WORKERS = 32  # calls served at once: publishes of different volumes overlap while their daemons start
# Publishes under way at once, at most: each may wait on its source for up to node.READY_TIMEOUT, and the other
# workers stay free for unpublishes and probes. One more is UNAVAILABLE at once (kubelet retries it).
PUBLISHING = 16
KUBELET_DIR = Path("/var/lib/kubelet")  # where kubelet puts every target path
STOP_GRACE = 10.0  # seconds calls in progress may take to finish when the plugin is told to stop


def _refuse(context: grpc.ServicerContext, code: str, message: str) -> NoReturn:
    log.warning("%s: %s", code, message, extra={"event": "refused"})
    context.abort(grpc.StatusCode[code], message)
    raise AssertionError("unreachable: abort raises")


class Identity(rpc.IdentityServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    def GetPluginInfo(
        self, request: pb.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetPluginInfoResponse:
        return pb.GetPluginInfoResponse(name=self.name, vendor_version=__version__)

    def GetPluginCapabilities(
        self, request: pb.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.GetPluginCapabilitiesResponse:
        return pb.GetPluginCapabilitiesResponse()  # no controller service, no topology

    def Probe(self, request: pb.ProbeRequest, context: grpc.ServicerContext) -> pb.ProbeResponse:
        return pb.ProbeResponse(ready=BoolValue(value=True))


class NodeService(rpc.NodeServicer):
    """The node's calls. A publish waits only on its own source: no more than PUBLISHING are under way at once,
    so that sources that never answer cannot hold every worker from an unpublish."""

    def __init__(
        self, node: Publisher, node_id: str, local_roots: Sequence[Path] = (), kubelet_dir: Path = KUBELET_DIR,
        ceilings: Ceilings | None = None,
    ) -> None:  # fmt: skip
        """local_roots: the node's directories a volume may name as its source (`--local-root`); none by default,
        since a pod's author could otherwise read any dataset on the node that its daemon's user can. kubelet_dir:
        where every target path lies (`--kubelet-dir`): a call naming another path mounts or unmounts nothing."""
        self.node, self.node_id = node, node_id
        self.local_roots = [Path(os.path.realpath(root)) for root in local_roots]
        self.kubelet_dir = Path(os.path.realpath(kubelet_dir))
        self.ceilings = ceilings or Ceilings()
        self.publishing = threading.BoundedSemaphore(PUBLISHING)

    def NodeGetInfo(self, request: pb.NodeGetInfoRequest, context: grpc.ServicerContext) -> pb.NodeGetInfoResponse:
        return pb.NodeGetInfoResponse(node_id=self.node_id)

    def NodeGetCapabilities(
        self, request: pb.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.NodeGetCapabilitiesResponse:
        return pb.NodeGetCapabilitiesResponse()  # no staging, no volume stats

    def NodePublishVolume(
        self, request: pb.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodePublishVolumeResponse:
        self._required(context, request.volume_id, request.target_path)
        if not request.HasField("volume_capability"):
            _refuse(context, "INVALID_ARGUMENT", "volume_capability: missing")
        capability = request.volume_capability
        if capability.HasField("block"):
            _refuse(context, "INVALID_ARGUMENT", "volume_capability: block access; shardfs volumes are filesystems")
        try:
            volume = volume_of(
                request.volume_context, capability.mount.mount_flags, request.secrets, ceilings=self.ceilings
            )  # fmt: skip
        except BadVolume as e:
            _refuse(context, "INVALID_ARGUMENT", f"volume {request.volume_id}: {e}")
        local = parse_source(volume.source)
        if isinstance(local, str) and not any(
            Path(os.path.realpath(local)).is_relative_to(root) for root in self.local_roots
        ):  # fmt: skip
            roots = ", ".join(map(str, self.local_roots)) or "none"
            _refuse(context, "INVALID_ARGUMENT", f"volume {request.volume_id}: source {local}: a node-local path"
                    f" outside the driver's --local-root directories ({roots})")  # fmt: skip
        if not self.publishing.acquire(blocking=False):
            _refuse(context, "UNAVAILABLE", f"volume {request.volume_id}: {PUBLISHING} publishes are under way")
        try:
            self.node.publish(request.volume_id, request.target_path, volume, request.secrets)
        except PublishError as e:
            _refuse(context, e.code, str(e))
        finally:
            self.publishing.release()
        return pb.NodePublishVolumeResponse()

    def NodeUnpublishVolume(
        self, request: pb.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnpublishVolumeResponse:
        self._required(context, request.volume_id, request.target_path)
        try:
            self.node.unpublish(request.volume_id, request.target_path)
        except PublishError as e:
            _refuse(context, e.code, str(e))
        return pb.NodeUnpublishVolumeResponse()

    def _required(self, context: grpc.ServicerContext, volume_id: str, target_path: str) -> None:
        """Both named, and the target a path under kubelet's directory, with no `..` and no link in its parents
        leading elsewhere (the target itself, which may be a mount, is not looked at)."""
        if not volume_id:
            _refuse(context, "INVALID_ARGUMENT", "volume_id: missing")
        if not target_path:
            _refuse(context, "INVALID_ARGUMENT", "target_path: missing")
        if not os.path.isabs(target_path):
            _refuse(context, "INVALID_ARGUMENT", f"target_path {target_path}: not an absolute path")
        parent = Path(os.path.realpath(os.path.dirname(os.path.normpath(target_path))))
        if ".." in Path(target_path).parts or not parent.is_relative_to(self.kubelet_dir):
            _refuse(context, "INVALID_ARGUMENT", f"target_path {target_path}: not under {self.kubelet_dir} (kubelet's"
                    " directory, --kubelet-dir)")  # fmt: skip


def socket_path(endpoint: str) -> Path:
    """The path of `unix:///csi/csi.sock` (or `unix:/csi/csi.sock`, or a bare path), as the sidecars take it."""
    path = endpoint.removeprefix("unix://") if endpoint.startswith("unix://") else endpoint.removeprefix("unix:")
    if not os.path.isabs(path):
        raise SystemExit(f"shardfs csi: --endpoint {endpoint}: not unix:///PATH")
    return Path(path)


def run(endpoint: str, driver: str, service: NodeService) -> int:
    """Serve the Identity service as driver and service at endpoint until SIGTERM or SIGINT. The daemons stay:
    their mounts outlive a plugin that is only stopped."""
    log_to_terminal("INFO")
    path = socket_path(endpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a socket left by the plugin's last life
    node, node_id = service.node, service.node_id
    connections = node.fusectl  # made before any call: two first publishes must not race
    server = grpc.server(ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="shardfs-csi"))
    rpc.add_IdentityServicer_to_server(Identity(driver), server)
    rpc.add_NodeServicer_to_server(service, server)
    old_umask = os.umask(0o077)  # the socket is root's alone: kubelet and the sidecars run as root
    try:
        server.add_insecure_port(f"unix://{path}")
        server.start()
    finally:
        os.umask(old_umask)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    log.info("%s serving node %s at %s; connections in %s", driver, node_id, path, connections,
             extra={"event": "serving"})  # fmt: skip
    while not stopped.wait(1.0):  # a timed wait: the signal handler runs between two
        pass
    server.stop(STOP_GRACE).wait()
    node.close()
    return 0
