"""deploy/kubernetes/ checked against the code, since no cluster or image can be run here: every manifest loads
(PyYAML), the driver name and socket paths agree across the CSIDriver, the DaemonSet and its sidecars, the
plugin's arguments parse as `shardfs csi` takes them, the example volumes' attributes, mountOptions and
secret keys are what the plugin accepts; the Containerfile installs the wheel with the csi extra. And the
committed gRPC modules are what scripts/csi_stubs makes from the .proto."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardfs.cli import parser
from shardfs.csi import DAEMON_UIDS, DRIVER, NOBODY
from shardfs.csi.server import socket_path
from shardfs.csi.volume import volume_of

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUBELET_PLUGINS = "/var/lib/kubelet/plugins"


def documents() -> list[dict[str, Any]]:
    found = [d for path in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(found) >= 8
    return found


def one(kind: str) -> dict[str, Any]:
    [found] = [d for d in documents() if d["kind"] == kind]
    return found


def test_every_manifest_names_a_kind_and_a_name() -> None:
    for d in documents():
        assert d["apiVersion"] and d["kind"] and d["metadata"]["name"], d


def test_the_csidriver_is_the_plugins() -> None:
    driver = one("CSIDriver")
    assert driver["metadata"]["name"] == DRIVER
    spec = driver["spec"]
    assert spec["attachRequired"] is False and spec["podInfoOnMount"] is True
    assert set(spec["volumeLifecycleModes"]) == {"Persistent", "Ephemeral"}


def test_the_daemonset_wires_plugin_sidecars_and_kubelet_together() -> None:
    ds = one("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    assert ds["spec"]["updateStrategy"]["type"] == "OnDelete"  # a rolling update would end every volume's daemon
    containers = {c["name"]: c for c in pod["containers"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    plugin = containers["shardfs"]
    assert plugin["securityContext"]["privileged"] is True

    # The arguments parse as `shardfs csi` takes them, with $(NODE_NAME) as kubelet fills it in.
    args = [a.replace("$(NODE_NAME)", "node-1") for a in plugin["args"]]
    parsed = parser()[0].parse_args(args)
    assert parsed.command == "csi" and parsed.node_id == "node-1" and parsed.driver_name == DRIVER
    assert parsed.daemon_user == (DAEMON_UIDS, NOBODY)  # a uid each
    assert any(e["name"] == "NODE_NAME" and e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
               for e in plugin["env"])  # fmt: skip

    # The socket: the plugin's endpoint, in the plugin directory every sidecar mounts, is where the
    # registrar tells kubelet to find it on the host.
    sock = socket_path(parsed.endpoint)
    host_dir = f"{KUBELET_PLUGINS}/{DRIVER}"

    def mounted_from(container: dict[str, Any], path: Path) -> str:
        [m] = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
        return volumes[m["name"]]["hostPath"]["path"] + "/" + str(path.relative_to(m["mountPath"]))

    assert mounted_from(plugin, sock) == f"{host_dir}/{sock.name}"
    registrar = containers["node-driver-registrar"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in registrar["args"])
    assert flags["csi-address"] == str(sock) and flags["kubelet-registration-path"] == f"{host_dir}/{sock.name}"
    assert mounted_from(registrar, Path(flags["csi-address"])) == f"{host_dir}/{sock.name}"
    assert volumes[_mount_named(registrar, "/registration")]["hostPath"]["path"] == "/var/lib/kubelet/plugins_registry"
    probe = containers["liveness-probe"]
    probe_flags = dict(a.removeprefix("--").split("=", 1) for a in probe["args"])
    assert probe_flags["csi-address"] == str(sock)
    port = [p for p in plugin["ports"] if p["name"] == plugin["livenessProbe"]["httpGet"]["port"]]
    assert port and str(port[0]["containerPort"]) == probe_flags["health-port"]

    # Targets are under kubelet's pods directory, and the mounts made there must reach the host.
    [pods] = [m for m in plugin["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pods"]
    assert pods["mountPropagation"] == "Bidirectional"
    assert Path(pods["mountPath"]).is_relative_to(parsed.kubelet_dir)  # where the plugin takes targets
    assert not parsed.node_identity and not parsed.local_root  # a pod reads neither the node's identity nor its files
    assert volumes[pods["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pods"
    assert volumes[_mount_named(plugin, "/dev/fuse")]["hostPath"]["type"] == "CharDevice"
    assert volumes[_mount_named(plugin, str(parsed.run_dir))]


def _mount_named(container: dict[str, Any], path: str) -> str:
    [m] = [m for m in container["volumeMounts"] if m["mountPath"] == path]
    return m["name"]


def _secrets() -> dict[tuple[str, str], dict[str, str]]:
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d["stringData"] for d in documents()
            if d["kind"] == "Secret"}  # fmt: skip


def _csi_volumes() -> list[tuple[dict[str, Any], list[str]]]:
    """Every CSI volume source in the examples, with the mountOptions it is published with."""
    found = []
    for d in documents():
        if d["kind"] == "PersistentVolume":
            found.append((d["spec"]["csi"], d["spec"].get("mountOptions", [])))
        if d["kind"] == "Pod":
            found += [(v["csi"], []) for v in d["spec"]["volumes"] if "csi" in v]
    return found


def test_the_example_volumes_are_what_the_plugin_accepts() -> None:
    volumes = _csi_volumes()
    assert len(volumes) == 2  # the PersistentVolume and the inline one
    for csi, mount_options in volumes:
        assert csi["driver"] == DRIVER and csi["readOnly"] is True
        ref = csi.get("nodePublishSecretRef")
        secrets = _secrets()[(ref["namespace"], ref["name"])] if ref else {}
        volume = volume_of(csi["volumeAttributes"], mount_options, secrets)
        assert volume.source == csi["volumeAttributes"]["source"]
        assert all(isinstance(v, str) for v in csi["volumeAttributes"].values())  # Kubernetes takes strings only


@pytest.mark.parametrize("key", ["view", "cacheSize", "anonymous"])
def test_a_misspelt_attribute_in_an_example_would_be_refused(key: str) -> None:
    """The check above can fail: an attribute name the plugin does not know is refused by name."""
    csi, options = next(c for c in _csi_volumes() if key in c[0]["volumeAttributes"])
    attributes = dict(csi["volumeAttributes"])
    attributes[key.lower() + "_"] = attributes.pop(key)
    with pytest.raises(ValueError, match=key.lower() + "_"):
        volume_of(attributes, options, {})


def test_the_claim_binds_the_volume_and_the_pod_uses_the_claim() -> None:
    pv, pvc = one("PersistentVolume"), one("PersistentVolumeClaim")
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pvc["spec"]["storageClassName"] == pv["spec"]["storageClassName"] == ""
    assert pvc["spec"]["accessModes"] == pv["spec"]["accessModes"] == ["ReadOnlyMany"]
    claims = [v["persistentVolumeClaim"]["claimName"] for d in documents() if d["kind"] == "Pod"
              for v in d["spec"]["volumes"] if "persistentVolumeClaim" in v]  # fmt: skip
    assert claims == [pvc["metadata"]["name"]]


def test_the_containerfile_installs_the_wheel_with_the_csi_extra() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert re.search(r"^FROM \S+python:3\.1[1-9]", text, re.M)
    assert re.search(r"pip install .*shardfs-\*\.whl\)?\[csi\]", text)
    entry = re.search(r"^ENTRYPOINT \[\"(\w+)\"\]", text, re.M)
    assert entry and entry.group(1) == "shardfs"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["csi"]
    assert {re.split(r"[<>=]", d)[0] for d in extra} == {"grpcio", "protobuf"}


def test_the_committed_grpc_modules_are_what_the_proto_makes(tmp_path: Path) -> None:
    subprocess.run([ROOT / "scripts" / "csi_stubs", tmp_path], check=True, cwd=ROOT)
    for name in ("csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py"):
        made = (tmp_path / "shardfs" / "csi" / name).read_text()
        assert made == (ROOT / "shardfs" / "csi" / name).read_text(), f"{name}: run scripts/csi_stubs"


def test_the_wheel_the_containerfile_installs_holds_the_plugin(tmp_path: Path) -> None:
    """Built as the Containerfile's comment says: the plugin, its generated modules, the daemon and the Slurm
    helper are in it, and its csi extra brings grpcio and protobuf."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, ROOT],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    [wheel] = tmp_path.glob("shardfs-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in z.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    for module in ("server", "volume", "csi_pb2", "csi_pb2_grpc"):
        assert f"shardfs/csi/{module}.py" in names
    for module in ("publisher", "supervisor", "held", "daemon", "handoff", "errors"):
        assert f"shardfs/host/{module}.py" in names
    assert {"shardfs/slurm.py", "shardfs/service/keeper.py"} <= names
    extra = [r for r in requires if 'extra == "csi"' in r]
    assert {re.split(r"[<>=; ]", r.removeprefix("Requires-Dist: "))[0] for r in extra} == {"grpcio", "protobuf"}
