"""What a SOURCE argument names: a local directory, or a prefix in an object store or on a web server.

Users paste sources from Neuroglancer, so its format prefixes (`precomputed://gs://…`, `zarr3://s3://…`)
are accepted and dropped: the format is detected from the files either way.

A web server's URL may carry `user:password@`: the credential is sent as an Authorization header (which the
HTTP client drops on a redirect to another host), and every form of the URL that is shown (`/proc/mounts`,
the log, messages) has `***@` in its place.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from shardfs.logs import redact_userinfo

FORMAT_PREFIXES = ("precomputed://", "zarr3://", "zarr://", "n5://")
REMOTE_SCHEMES = ("gs", "s3", "http", "https")
# `s3:/bucket/x`, `https:host/x`: a remote scheme with a slash or two missing, else read as a relative path.
NO_SLASHES = re.compile(rf"({'|'.join(REMOTE_SCHEMES)}):", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Remote:
    """A dataset under a URL: for gs and s3 a bucket and a key prefix; for http(s) the base URL."""

    scheme: str
    bucket: str  # gs/s3: the bucket; http(s): host[:port]
    prefix: str  # no leading or trailing '/'
    userinfo: str = field(default="", repr=False)  # http(s): `user:password`, percent-encoded as in the URL

    @property
    def url(self) -> str:
        """The URL as it is shown: a credential in it is `***`."""
        return f"{self.scheme}://{'***@' if self.userinfo else ''}{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def address(self) -> str:
        """The URL requests are sent to, without the credential (see authorization)."""
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def authorization(self) -> str | None:
        """The Basic Authorization header of the URL's `user:password`; obstore's client ignores a URL's."""
        if not self.userinfo:
            return None
        user, _, password = self.userinfo.partition(":")
        return "Basic " + base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()

    def url_of(self, path: str) -> str:
        """The URL of a path beneath the dataset, for messages."""
        return f"{self.url}/{path}" if path else self.url


def parse_source(text: str) -> str | Remote:
    """A local path (plain, or `file://`), or the Remote a URL names. ValueError for a scheme shardfs
    cannot read, in words that name it."""
    for prefix in FORMAT_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    scheme, sep, rest = text.partition("://")
    if not sep:
        if slip := NO_SLASHES.match(text):
            meant = redact_userinfo(f"{slip.group(1)}://{text[slip.end() :].lstrip('/')}")
            raise ValueError(f"{text}: looks like a URL without '://': write {meant}, or ./{text} for a local path")
        return text
    scheme = scheme.lower()
    if scheme == "file":
        return urlsplit(text).path
    shown = redact_userinfo(text)
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"{shown}: unknown scheme {scheme!r}: use gs://, s3://, http://, https://, file:// or a path")
    authority, _, prefix = rest.partition("/")
    userinfo, _, bucket = authority.rpartition("@")
    if userinfo and not scheme.startswith("http"):
        raise ValueError(f"{shown}: credentials in a {scheme}:// URL are not read; they are found as the cloud's are")
    if not bucket:
        raise ValueError(f"{shown}: no {'host' if scheme.startswith('http') else 'bucket'} named")
    if scheme.startswith("http"):
        try:  # a host urllib cannot read ('[::1', a port that is no number) is refused here, not at the first GET
            split = urlsplit(f"{scheme}://{bucket}")
            split.port  # noqa: B018 (reading it checks it)
        except ValueError as e:
            raise ValueError(f"{shown}: not a URL ({e})") from None
        if not split.hostname:
            raise ValueError(f"{shown}: no host named")
    return Remote(scheme, bucket, prefix.split("?")[0].strip("/"), userinfo)
