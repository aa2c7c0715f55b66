"""Which credentials sign requests to s3:// and gs:// sources: each cloud's standard discovery, found once
per process when its client is made, with the source named in the log and never a secret.

AWS: boto3's own chain (environment, AWS_PROFILE and ~/.aws/credentials and ~/.aws/config with SSO,
assume-role and credential_process, web identity, container credentials), then the EC2 instance role.
GCS: object_store's own chain (GOOGLE_SERVICE_ACCOUNT*, GOOGLE_APPLICATION_CREDENTIALS, the gcloud
application-default credentials file), then the GCE metadata server.

An instance metadata service is asked only on a machine whose firmware (DMI) names that cloud: elsewhere
169.254.169.254 usually answers nothing, and every mount would wait for a timeout (botocore's is 1 s an
attempt, IMDSv2 then v1) before learning that there are no credentials. Reading the DMI files costs
microseconds. When nothing is found, requests go unsigned (public buckets), as the caller logs.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from shardfs.errors import SourceError

if TYPE_CHECKING:
    from obstore.auth.boto3 import Boto3CredentialProvider

log = logging.getLogger("shardfs")

DMI = Path("/sys/class/dmi/id")
XEN_UUID = Path("/sys/hypervisor/uuid")
# What object_store reads, in the order it prefers them (a service account over application credentials).
GCS_SERVICE_ACCOUNT = ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY")
ADC_FILE = Path(".config/gcloud/application_default_credentials.json")  # under $HOME, as gcloud writes it
# botocore refreshes temporary credentials at least 10 minutes before they expire; obstore keeps what it was
# given for this long, so it never holds credentials past their end.
AWS_KEPT = timedelta(minutes=5)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def on_ec2(dmi: Path = DMI, xen_uuid: Path = XEN_UUID) -> bool:
    """Whether this machine is an EC2 instance: Nitro instances name "Amazon EC2" as their system or BIOS
    vendor, Xen ones have a hypervisor UUID starting "ec2"."""
    vendors = {_read(dmi / "sys_vendor"), _read(dmi / "bios_vendor")}
    return "Amazon EC2" in vendors or _read(xen_uuid).lower().startswith("ec2")


def on_gce(dmi: Path = DMI) -> bool:
    """Whether this machine is a Google Compute Engine VM (product "Google Compute Engine", vendor
    "Google"), the check google-auth also makes."""
    return _read(dmi / "product_name").startswith("Google") or _read(dmi / "sys_vendor") == "Google"


def aws(url: str, profile: str | None = None, machine: bool = True) -> Boto3CredentialProvider | None:
    """boto3's credentials for url (from the named profile, if given: --profile, as AWS_PROFILE), or None when
    there are none. machine: whether the machine's own identity (the EC2 instance role) may be used: not for a
    CSI volume or a Slurm job unless the admin says so, or any pod or job would read what the node can.
    Imported here: only an s3:// source not mounted --anonymous pays for importing boto3 (about 0.1 s), and
    only in the process that reads it."""
    import boto3
    import botocore.exceptions
    import botocore.session
    from obstore.auth.boto3 import Boto3CredentialProvider

    # botocore logs a failed refresh as a warning with its traceback; the reason reaches shardfs's own line.
    logging.getLogger("botocore.credentials").setLevel(logging.ERROR)
    session = botocore.session.Session(profile=profile)
    try:
        if not (machine and on_ec2()):
            session.get_component("credential_provider").remove("iam-role")
        provider = Boto3CredentialProvider(boto3.Session(botocore_session=session), ttl=AWS_KEPT)
        # Deferred sources (SSO, assume-role) fetch now: a failure refuses the mount in words, rather than
        # surfacing from obstore's first request as a refusal the server never made.
        provider.credentials.get_frozen_credentials()
    except ValueError:  # boto3's chain came up empty
        return None
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:  # no profile, STS refused...
        raise SourceError(f"{url}: AWS credentials: {e}") from None
    method = provider.credentials.method
    profile = session.get_config_variable("profile")
    named = f" (profile {profile})" if profile and method != "env" else ""
    log.info("%s: requests signed with AWS credentials from %s%s", url, method, named, extra={"event": "signed"})
    return provider


def gcs(url: str, machine: bool = True) -> bool:
    """Whether object_store will find GCS credentials for url, saying which; it reads them itself. machine: as
    for aws (the GCE metadata server's service account)."""
    found = next((f"${name}" for name in GCS_SERVICE_ACCOUNT if os.environ.get(name)), None)
    if found is None and os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        found = f"$GOOGLE_APPLICATION_CREDENTIALS ({os.environ['GOOGLE_APPLICATION_CREDENTIALS']})"
    home = os.environ.get("HOME")
    if found is None and home and (Path(home) / ADC_FILE).is_file():
        found = f"application-default credentials ({Path(home) / ADC_FILE})"
    if found is None and machine and on_gce():
        found = "the GCE metadata server"
    if found is not None:
        log.info("%s: requests signed with GCS credentials from %s", url, found, extra={"event": "signed"})
    return found is not None
