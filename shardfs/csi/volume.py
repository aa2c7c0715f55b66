"""What a CSI volume asks for, read from NodePublishVolume: its attributes (what `shardfs mount` takes), the
PersistentVolume's mountOptions and the publish secret. Everything is checked here, in the privileged plugin,
so that a mistake is refused in one line naming the attribute before anything is mounted.

The attributes are shown to anyone who can read the PersistentVolume or the pod, so a credential never goes
there: a source URL with a `user:password@` is refused, and the secret's keys are the only way in."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from shardfs.csi import CEILING_CACHE, CEILING_MAX_FILE, CEILING_THREADS
from shardfs.errors import SourceError, binary_size
from shardfs.fuse.mount import FuseMountError, MountOptions
from shardfs.fuse.serve import settings_of
from shardfs.logs import redact_userinfo
from shardfs.options import BY_ATTRIBUTE, PLUGINS_OWN, byte_size
from shardfs.service.daemon import fuse_options, parse_options
from shardfs.service.spec import MountSpec, Reading, Service
from shardfs.source import is_remote
from shardfs.stores.remote import Access

# Keys Kubernetes adds itself (podInfoOnMount's pod name, namespace, uid and service account, `ephemeral`):
# said, not asked, so never refused.
KUBERNETES_KEYS = "csi.storage.k8s.io/"
MOUNT_OPTIONS = Path("mountOptions")  # what a refusal of the options names, as settings_of names a mountpoint
# The publish secret's keys: set in the daemon's own environment, where the AWS and GCS credential chains
# look (see shardfs/stores/credentials.py), and nowhere else.
ACCESS = {f.name for f in fields(Access)}  # of a volume's settings, those that say how a remote source is reached
READING = {f.name for f in fields(Reading)} - {"access"}
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GOOGLE_SERVICE_ACCOUNT_KEY")


class BadVolume(ValueError):
    """A volume attribute, mount option or secret that cannot work; the message names it."""


@dataclass(frozen=True)
class Ceilings:
    """The most one volume may ask of a node (its daemons are shared with other tenants, or run outside the job's
    cgroup): set by the node's admin, never by a pod or a job (`shardfs csi --max-cache-size ...`, the Slurm
    Prolog's SHARDFS_MAX_CACHE_SIZE ...). A volume asking for more is refused, naming the ceiling. where: the
    setting a refusal names."""

    cache_size: int = field(default_factory=lambda: byte_size(CEILING_CACHE))
    max_file_size: int = field(default_factory=lambda: byte_size(CEILING_MAX_FILE))
    threads: int = CEILING_THREADS
    where: str = "the node's ceiling"

    def check(self, spec: MountSpec) -> None:
        """BadVolume naming the first of the volume's asks over its ceiling."""
        threads = settings_of(spec.options, MOUNT_OPTIONS).threads
        for name, asked, most in (
            ("volume attribute cacheSize", spec.reading.cache_size, self.cache_size),
            ("volume attribute maxFileSize", spec.reading.max_file_size, self.max_file_size),
            ("mountOptions max_threads", threads, self.threads),
        ):
            if asked > most:
                shown = str(asked) if "threads" in name else binary_size(asked)
                limit = str(most) if "threads" in name else binary_size(most)
                raise BadVolume(f"{name}: {shown} is over {self.where} of {limit}")


# The attributes a volume may have: its source, and the settings a volume may ask for (see shardfs/options.py).
ATTRIBUTES = ("source", *BY_ATTRIBUTE)


def volume_of(
    attributes: Mapping[str, str],
    mount_flags: Sequence[str],
    secrets: Mapping[str, str],
    others: bool = True,
    ceilings: Ceilings | None = None,
) -> MountSpec:
    """What the volume asks for; BadVolume naming the attribute, option or secret key that cannot work, or the
    ceiling it is over. The secret is checked here and kept beside the spec, never in it. others: whether users
    other than the daemon's may read it (a pod's, whoever it is; not a Slurm job's)."""
    unknown = sorted(k for k in attributes if k not in ATTRIBUTES and not k.startswith(KUBERNETES_KEYS))
    if unknown:
        raise BadVolume(f"volume attribute {unknown[0]}: unknown (known: {', '.join(ATTRIBUTES)})")
    if not attributes.get("source"):
        raise BadVolume("volume attribute source: missing (the dataset's URL or path)")
    try:
        is_remote(attributes["source"])  # a URL that names nothing shardfs reads is refused before any mount
    except SourceError as e:
        raise BadVolume(f"volume attribute source: {e}") from None
    for name, text in attributes.items():
        if name in ATTRIBUTES and redact_userinfo(text) != text:
            raise BadVolume(f"volume attribute {name}: holds a user:password@; put credentials in the publish secret")
    given: dict[str, Any] = {}
    for name, text in attributes.items():
        if setting := BY_ATTRIBUTE.get(name):
            try:
                given[setting.name] = setting.read(text)
            except argparse.ArgumentTypeError as e:
                raise BadVolume(f"volume attribute {name}: {e}") from None
    if bad := sorted(set(secrets) - set(SECRET_KEYS)):
        raise BadVolume(f"publish secret key {bad[0]}: unknown (known: {', '.join(SECRET_KEYS)})")
    access = Access(**{k: v for k, v in given.items() if k in ACCESS}, machine=False)  # the node's call, not its
    reading = Reading(**{k: v for k, v in given.items() if k in READING}, access=access)
    service = Service(log_level=given.get("log_level", "WARNING"))
    spec = MountSpec(attributes["source"], reading, mount_options(attributes["source"], mount_flags, others), service)
    (ceilings or Ceilings()).check(spec)
    return spec


def mount_options(source: str, mount_flags: Sequence[str], others: bool = True) -> dict[str, str | bool]:
    """The `-o` options a volume is mounted and served with: shardfs's defaults for immutable data, the
    PersistentVolume's mountOptions (FUSE and mount(8) options, as `shardfs mount -o` takes them), and, if
    others, `allow_other`: a pod's processes are not the daemon's user. Read-only whatever is asked."""
    extra = parse_options(mount_flags)
    if owned := [name for name in extra if name in PLUGINS_OWN]:
        raise BadVolume(f"mountOptions: {owned[0]} is the plugin's to set ({PLUGINS_OWN[owned[0]]})")
    if others:
        extra["allow_other"] = True
    options = fuse_options(redact_userinfo(source), extra, is_remote(source))
    try:
        settings_of(options, MOUNT_OPTIONS)
    except FuseMountError as e:
        raise BadVolume(str(e)) from None
    return options


def kernel_mount(spec: MountSpec, owner: tuple[int, int]) -> MountOptions:
    """What mount(2) is given for the volume, served by owner's daemon: the same options its session reads."""
    return replace(settings_of(spec.options, MOUNT_OPTIONS).mount, owner=owner)
