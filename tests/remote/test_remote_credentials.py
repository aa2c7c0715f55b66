"""Credentials found where each cloud's tools keep them, not only in the environment: an AWS profile in
~/.aws, gcloud's application-default credentials in ~/.config/gcloud and a key named only by
GOOGLE_APPLICATION_CREDENTIALS, each under a temporary HOME, sign the requests that reach a loopback bucket
which refuses anything else; temporary AWS credentials (moto's STS) are let go before they expire; with none
anywhere, requests go unsigned and the log says so, without asking an instance metadata service that is not
there, and either DMI field a cloud's firmware fills is enough to ask one."""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from shardfs.stores import credentials
from shardfs.stores.credentials import on_ec2, on_gce
from tests.support import peers
from tests.support.cli import shardfs
from tests.support.cloud import moto_server
from tests.support.http_server import RangeServer

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


BUCKET = "bkt"
KEY_ID, SECRET = "AKIASHARDFSLAB", "lab-secret-never-logged"
SCALE = "4_4_40"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(root served, unsharded twin): a sharded precomputed volume at BUCKET/vol."""
    root = tmp_path_factory.mktemp("creds")
    peers.write_tensorstore_volume(root / BUCKET / "vol", data_encoding="raw", unsharded_twin=root / "twin")
    return root, root / "twin"


@pytest.fixture
def server(bucket) -> Iterator[RangeServer]:
    with RangeServer(bucket[0]).running() as s:
        yield s


def read_a_chunk(path: Path, twin: Path) -> None:
    name = sorted(os.listdir(twin / SCALE))[0]
    assert (path / SCALE / name).read_bytes() == (twin / SCALE / name).read_bytes()


def test_aws_profile_in_home_signs_requests(bucket, home, server, mount, monkeypatch) -> None:
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = AKIANOTTHISONE\naws_secret_access_key = other\n"
        f"[lab]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n"
    )
    (home / ".aws" / "config").write_text("[profile lab]\nregion = eu-west-3\n")
    monkeypatch.setenv("AWS_PROFILE", "lab")
    # SigV4 with the profile's key, scoped to the profile's region; anything else is refused.
    server.admit = lambda auth: (
        (auth or "").startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/") and ("/eu-west-3/s3/aws4_request" in auth)
    )
    m = mount(f"s3://{BUCKET}/vol", "--endpoint", server.url, "--log-level", "INFO")
    read_a_chunk(m.path, bucket[1])
    log = m.log_text()
    assert "requests signed with AWS credentials from shared-credentials-file (profile lab)" in log, log
    assert SECRET not in log and "unsigned" not in log

    # --anonymous sends nothing signed, whatever is found.
    server.admit = lambda auth: auth is None
    read_a_chunk(mount(f"s3://{BUCKET}/vol", "--endpoint", server.url, "--anonymous").path, bucket[1])


def test_profile_and_requester_pays_as_options(bucket, home, server, mount) -> None:
    """--profile signs with that profile, as AWS_PROFILE would (no variable set); --requester-pays sends
    x-amz-request-payer on every request, as a Requester Pays bucket requires; gs:// refuses it in words."""
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = AKIANOTTHISONE\naws_secret_access_key = other\n"
        f"[lab]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n"
    )
    server.admit = lambda auth: (auth or "").startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")
    m = mount(f"s3://{BUCKET}/vol", "--endpoint", server.url, "--profile", "lab", "--requester-pays")
    read_a_chunk(m.path, bucket[1])
    assert server.headers and all(h.get("x-amz-request-payer") == "requester" for h in server.headers)
    done = shardfs("ls", f"gs://{BUCKET}/vol", "--endpoint", server.url, "--requester-pays", check=False)
    assert done.returncode == 2 and "--requester-pays is for s3://" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("config", "why"),
    [("", "could not be found"), ("sso_start_url = https://sso.invalid\nsso_region = eu-west-3\n", "SSO Token")],
)
def test_named_profile_that_gives_nothing_refuses_the_mount(home, server, monkeypatch, config, why) -> None:
    """A profile named but missing, or whose SSO login is not there: the reason, not a refusal the server
    never made, and no request sent without the credentials the user asked for."""
    (home / ".aws").mkdir()
    (home / ".aws" / "config").write_text(f"[profile elsewhere]\n{config}sso_account_id = 1\nsso_role_name = r\n")
    monkeypatch.setenv("AWS_PROFILE", "elsewhere" if config else "nowhere")
    r = shardfs("ls", f"s3://{BUCKET}/vol", "--endpoint", server.url, check=False)
    assert r.returncode == 2 and f"s3://{BUCKET}/vol" in r.stderr and "AWS credentials" in r.stderr, r.stderr
    assert why in r.stderr and "access denied" not in r.stderr, r.stderr
    assert not server.authorizations


STS_REFUSAL = (
    b'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>'
    b"<Code>AccessDenied</Code><Message>not allowed to assume r</Message></Error><RequestId>1</RequestId>"
    b"</ErrorResponse>"
)


def test_a_role_the_sts_refuses_refuses_the_mount(home, server, monkeypatch) -> None:
    """A profile that assumes a role STS will not grant: STS's reason (botocore raises ClientError, not
    one of its own errors), with no request to the bucket."""
    sts = Metadata(answer=(403, STS_REFUSAL))
    (home / ".aws").mkdir()
    (home / ".aws" / "config").write_text(
        "[profile elsewhere]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = base\nregion = eu-west-3\n"
    )
    (home / ".aws" / "credentials").write_text("[base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_PROFILE", "elsewhere")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.url)
    r = shardfs("ls", f"s3://{BUCKET}/vol", "--endpoint", server.url, check=False)
    assert r.returncode == 2 and "AWS credentials" in r.stderr and "not allowed to assume r" in r.stderr, r.stderr
    assert sts.asked >= 1 and not server.authorizations


def test_temporary_aws_credentials_are_let_go_before_they_expire(home, monkeypatch) -> None:
    """A role assumed for STS's shortest term (15 minutes, moto's STS on loopback): obstore is told to keep
    what it was given for less than that, so it asks boto3 again (which refreshes 10 minutes before the end)
    before a request could be signed with a credential past its end."""
    with moto_server() as sts:
        (home / ".aws").mkdir()
        (home / ".aws" / "config").write_text(
            "[profile reader]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = base\n"
            "duration_seconds = 900\nregion = eu-west-3\n"
        )
        (home / ".aws" / "credentials").write_text("[base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = s\n")
        monkeypatch.setenv("AWS_PROFILE", "reader")
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts)
        asked = datetime.now(UTC)
        provider = credentials.aws(f"s3://{BUCKET}/vol")
        assert provider is not None and provider.credentials.method == "assume-role"
        given = provider()
    frozen = provider.credentials.get_frozen_credentials()
    assert given["token"] == frozen.token and given["access_key_id"].startswith("ASIA"), given["access_key_id"]
    # botocore hands a credential out until 10 minutes before its end (here 15 minutes after it was asked for),
    # so obstore may keep one for less than those 10 minutes, and never past the end.
    assert given["expires_at"] < asked + timedelta(minutes=10), given["expires_at"] - asked


def b64(data: bytes) -> bytes:
    return base64.urlsafe_b64decode(data + b"=" * (-len(data) % 4))


@pytest.mark.parametrize("where", ["gcloud", "variable"])
def test_a_service_account_key_signs_requests(bucket, home, server, mount, monkeypatch, where) -> None:
    """A service account key where gcloud writes application-default credentials, or anywhere else named only
    by GOOGLE_APPLICATION_CREDENTIALS: either signs every request, and the log names where it came from."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    email = "reader@lab.iam.gserviceaccount.com"
    if where == "gcloud":
        adc = home / ".config" / "gcloud" / "application_default_credentials.json"
        said = f"application-default credentials ({adc})"
    else:
        adc = home / "keys" / "reader.json"
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
        said = f"$GOOGLE_APPLICATION_CREDENTIALS ({adc})"
    adc.parent.mkdir(parents=True)
    adc.write_text(
        json.dumps({
            "type": "service_account", "project_id": "lab", "private_key_id": "k1", "private_key": pem.decode(),
            "client_email": email, "client_id": "1", "token_uri": f"{server.url}/token",
        })
    )  # fmt: skip

    def admit(auth: str | None) -> bool:
        """A bearer JWT (object_store signs its own, no token endpoint) by the service account's key, naming it."""
        if not (auth or "").startswith("Bearer "):
            return False
        try:
            head, claims, signature = auth.removeprefix("Bearer ").encode().split(b".")
            key.public_key().verify(b64(signature), head + b"." + claims, padding.PKCS1v15(), hashes.SHA256())
        except Exception:
            return False
        return json.loads(b64(claims))["iss"] == email

    server.admit = admit
    m = mount(f"gs://{BUCKET}/vol", "--endpoint", server.url, "--log-level", "INFO")
    read_a_chunk(m.path, bucket[1])
    assert f"requests signed with GCS credentials from {said}" in m.log_text()


class Metadata:
    """A loopback stand-in for an instance metadata service (or STS) that answers nothing useful, counting
    asks."""

    def __init__(self, answer: tuple[int, bytes] = (404, b"")) -> None:
        """answer: the status and body every request gets (STS's refusal, for the assume-role test)."""
        self.asked = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                outer.asked += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(answer[0])
                self.send_header("Content-Length", str(len(answer[1])))
                self.end_headers()
                self.wfile.write(answer[1])

            do_GET = do_PUT = do_POST = _any

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.skipif(on_ec2() or on_gce(), reason="on a cloud VM the metadata service is rightly asked")
def test_no_credentials_anywhere_goes_unsigned_without_asking_a_metadata_service(
    bucket, home, server, mount, monkeypatch
) -> None:
    metadata = Metadata()
    # Where botocore and object_store would ask, were the metadata services not skipped off their clouds.
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", metadata.url)
    monkeypatch.setenv("GCE_METADATA_HOST", metadata.url.removeprefix("http://"))
    monkeypatch.setenv("GCE_METADATA_IP", metadata.url.removeprefix("http://"))
    server.admit = lambda auth: auth is None
    try:
        for url in (f"s3://{BUCKET}/vol", f"gs://{BUCKET}/vol"):
            m = mount(url, "--endpoint", server.url, "--log-level", "INFO")
            read_a_chunk(m.path, bucket[1])
            assert f"{url}: no credentials found; requests are sent unsigned" in m.log_text()
    finally:
        metadata.server.shutdown()
        metadata.server.server_close()
    assert metadata.asked == 0


def test_cloud_residency_from_dmi(tmp_path: Path) -> None:
    """The cheap check made before trusting a metadata service: what each cloud's firmware says."""
    nitro, xen, gce, laptop = (tmp_path / n for n in ("nitro", "xen", "gce", "laptop"))
    for d, files in {
        nitro: {"sys_vendor": "Amazon EC2\n", "product_name": "m6i.large\n"},
        xen: {"sys_vendor": "Xen\n", "product_name": "HVM domU\n"},
        gce: {"sys_vendor": "Google\n", "product_name": "Google Compute Engine\n"},
        laptop: {"sys_vendor": "LENOVO\n", "product_name": "20XW\n"},
    }.items():
        d.mkdir()
        for name, text in files.items():
            (d / name).write_text(text)
    (tmp_path / "uuid").write_text("ec2e1916-9099-7caf-fd21-012345abcdef\n")
    assert on_ec2(nitro, tmp_path / "none") and on_ec2(xen, tmp_path / "uuid")
    assert not on_ec2(gce, tmp_path / "none") and not on_ec2(laptop, tmp_path / "none")
    assert on_gce(gce) and not on_gce(nitro) and not on_gce(laptop) and not on_gce(tmp_path / "none")


def dmi(where: Path, **fields: str) -> Path:
    where.mkdir()
    for name, text in fields.items():
        (where / name).write_text(text + "\n")
    return where


@pytest.mark.parametrize(
    ("fields", "cloud"),
    [
        ({"sys_vendor": "Amazon EC2", "bios_vendor": "American Megatrends"}, "ec2"),
        ({"sys_vendor": "Amazon", "bios_vendor": "Amazon EC2"}, "ec2"),  # some Nitro types name EC2 in the BIOS only
        ({"bios_vendor": "Amazon EC2"}, "ec2"),
        ({"sys_vendor": "Amazon EC2"}, "ec2"),
        ({"product_name": "Google Compute Engine", "sys_vendor": "SeaBIOS"}, "gce"),
        ({"product_name": "n2-standard-4", "sys_vendor": "Google"}, "gce"),
        ({"product_name": "Google Compute Engine"}, "gce"),
        ({"sys_vendor": "Google"}, "gce"),
        ({"sys_vendor": "Google Inc.", "bios_vendor": "Amazon"}, None),
        ({"product_name": "Amazon EC2", "bios_vendor": "Google"}, None),
    ],
)
def test_each_dmi_field_alone_names_the_cloud(tmp_path: Path, fields: dict[str, str], cloud: str | None) -> None:
    """Either of the two fields each cloud's firmware may fill is enough, and a field names a cloud only
    where that cloud writes it."""
    where = dmi(tmp_path / "dmi", **fields)
    assert (on_ec2(where, tmp_path / "no-uuid"), on_gce(where)) == (cloud == "ec2", cloud == "gce")


class InstanceRole:
    """A loopback EC2 instance metadata service (IMDSv2) that hands out a role's credentials, counting asks."""

    def __init__(self) -> None:
        self.asked = 0
        outer = self
        expires = (datetime.now(UTC) + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
        role = json.dumps({
            "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": "ASIANODEROLE", "SecretAccessKey": "node-secret",
            "Token": "node-token", "Expiration": expires,
        }).encode()  # fmt: skip
        answers = {
            "/latest/api/token": b"imds-token",
            "/latest/meta-data/iam/security-credentials/": b"node-role",
            "/latest/meta-data/iam/security-credentials/node-role": role,
        }

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                outer.asked += 1
                body = answers.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            do_GET = do_PUT = _any

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_machines_identity_signs_only_where_allowed(home, monkeypatch) -> None:
    """On a cloud VM, the instance's role is found by `shardfs mount` (the machine's own user) but not for a CSI
    volume or a Slurm job (machine=False) unless the admin allows it: a pod or a job would read any bucket the
    node can. The metadata service is a loopback one handing out a role, asked only where allowed."""
    role = InstanceRole()
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", role.url)
    monkeypatch.setattr(credentials, "on_ec2", lambda: True)
    monkeypatch.setattr(credentials, "on_gce", lambda: True)
    try:
        assert credentials.aws(f"s3://{BUCKET}/vol", machine=False) is None
        assert role.asked == 0
        assert not credentials.gcs(f"gs://{BUCKET}/vol", machine=False)
        provider = credentials.aws(f"s3://{BUCKET}/vol")
        assert provider is not None and provider.credentials.method == "iam-role"
        assert provider()["access_key_id"] == "ASIANODEROLE" and role.asked > 0
        assert credentials.gcs(f"gs://{BUCKET}/vol")  # the GCE metadata server, which object_store asks itself
    finally:
        role.server.shutdown()
        role.server.server_close()
