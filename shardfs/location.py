"""What a SOURCE argument names: a local directory, or a prefix in an object store or on a web server.

Users paste sources from Neuroglancer, so its format prefixes (`precomputed://gs://…`, `zarr3://s3://…`)
are accepted and dropped: the format is detected from the files either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

FORMAT_PREFIXES = ("precomputed://", "zarr3://", "zarr://", "n5://")
REMOTE_SCHEMES = ("gs", "s3", "http", "https")


@dataclass(frozen=True, slots=True)
class Remote:
    """A dataset under a URL: for gs and s3 a bucket and a key prefix; for http(s) the base URL."""

    scheme: str
    bucket: str  # gs/s3: the bucket; http(s): host[:port]
    prefix: str  # no leading or trailing '/'

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

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
        return text
    scheme = scheme.lower()
    if scheme == "file":
        return urlsplit(text).path
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"{text}: unknown scheme {scheme!r}: use gs://, s3://, http://, https://, file:// or a path")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{text}: no {'host' if scheme.startswith('http') else 'bucket'} named")
    return Remote(scheme, bucket, prefix.split("?")[0].strip("/"))
