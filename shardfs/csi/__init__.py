"""`shardfs csi`: a Kubernetes CSI v1 node plugin that publishes shardfs volumes into pods (see README,
"Kubernetes"). Its command line is here, free of gRPC, so that `shardfs --help` works without grpcio."""

from __future__ import annotations

import argparse
from pathlib import Path

from shardfs.host.publisher import Publisher
from shardfs.host.supervisor import NOBODY, Users
from shardfs.options import byte_size

DRIVER = "csi.shardfs.io"  # the CSIDriver's name: deploy/kubernetes/ names it too
# Daemons' uids by default: one each, so that none can signal, renice or re-limit another volume's. Below 2^31
# (tools that read a uid as signed), above systemd's container and foreign-image ranges, unused by any distribution.
DAEMON_UIDS = range(0x7FFF0000, 0x7FFFFFFF)
CEILING_CACHE, CEILING_MAX_FILE, CEILING_THREADS = "1G", "256M", 64  # what one volume may ask at most, by default


def user_group(text: str) -> tuple[range, int]:
    """'UID:GID' or 'FIRST-LAST:GID' (numbers: the plugin's image may know no such names), none of them root: the
    uids daemons take (one shared, or one each from the range) and their group."""
    uids, _, gid = text.partition(":")
    first, _, last = uids.partition("-")
    last = last or first
    if not (first.isdigit() and last.isdigit() and gid.isdigit()) or 0 in (int(first), int(gid)):
        raise argparse.ArgumentTypeError(f"{text!r} is not UID:GID or FIRST-LAST:GID of users other than root")
    if not int(first) <= int(last) < 0xFFFFFFFF:
        raise argparse.ArgumentTypeError(f"{text!r}: the range {uids} is empty or reaches (uid_t) -1")
    return range(int(first), int(last) + 1), int(gid)


def add_ceilings(p: argparse.ArgumentParser) -> None:
    """The admin's ceilings on what one volume (or Slurm job's dataset) may ask: see csi.volume.Ceilings."""
    for flag, kind, default, metavar, what in (
        ("--ceiling-cache-size", byte_size, CEILING_CACHE, "SIZE", "cacheSize (cache_size)"),
        ("--ceiling-max-file-size", byte_size, CEILING_MAX_FILE, "SIZE", "maxFileSize (max_file_size)"),
        ("--ceiling-threads", int, CEILING_THREADS, "N", "session threads (max_threads)"),
    ):
        p.add_argument(flag, type=kind, default=default, metavar=metavar, help=f"the most a volume's {what} may be")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--endpoint", required=True, metavar="unix:///PATH",
        help="the unix socket kubelet and the sidecars call (as the CSI_ENDPOINT they are given)",
    )  # fmt: skip
    p.add_argument("--node-id", required=True, metavar="NAME", help="this node's name, as NodeGetInfo answers it")
    p.add_argument("--driver-name", default=DRIVER, metavar="NAME", help="the CSIDriver's name")
    p.add_argument(
        "--daemon-user", type=user_group, default=f"{DAEMON_UIDS.start}-{DAEMON_UIDS.stop - 1}:{NOBODY}",
        metavar="FIRST-LAST:GID",
        help="the unprivileged users volumes' daemons run as: a uid each from FIRST-LAST, so that no daemon can"
        " signal or re-limit another's (or UID:GID, one uid they all share), in group GID",
    )  # fmt: skip
    p.add_argument(
        "--node-identity", action="store_true",
        help="read a volume that has no publish secret with the node's own cloud identity (EC2 instance role, GCE"
        " service account); without it such volumes are read unsigned, so that no pod reads what only the node may",
    )  # fmt: skip
    p.add_argument(
        "--local-root", type=Path, action="append", default=[], metavar="DIR",
        help="a directory of the node whose datasets volumes may name as their source (repeatable); none by default:"
        " volumes are then remote",
    )  # fmt: skip
    p.add_argument(
        "--kubelet-dir", type=Path, default=Path("/var/lib/kubelet"), metavar="DIR",
        help="kubelet's directory: every target path must lie under it, or the call is refused",
    )  # fmt: skip
    add_ceilings(p)
    p.add_argument(
        "--run-dir", type=Path, default=Path("/run/shardfs-csi"), metavar="DIR",
        help="the plugin's own directory (a fusectl mount, where /sys/fs/fuse/connections has none)",
    )  # fmt: skip


CEILING_FLAGS = "this node's ceiling (shardfs csi --ceiling-*)"


def run(args: argparse.Namespace) -> int:
    try:
        from shardfs.csi.server import NodeService
        from shardfs.csi.server import run as serve
        from shardfs.csi.volume import Ceilings
    except ImportError as e:
        raise SystemExit(f"shardfs csi: {e}; install shardfs[csi] (grpcio)") from None
    ceilings = Ceilings(args.ceiling_cache_size, args.ceiling_max_file_size, args.ceiling_threads, CEILING_FLAGS)
    uids, gid = args.daemon_user
    node = Publisher(args.run_dir, Users(uids, gid, machine=args.node_identity))
    return serve(
        args.endpoint, args.driver_name, NodeService(node, args.node_id, args.local_root, args.kubelet_dir, ceilings)
    )
