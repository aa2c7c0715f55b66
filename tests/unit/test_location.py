"""What a SOURCE argument names: local paths, URLs, Neuroglancer's format prefixes, refusals."""

from __future__ import annotations

import pytest

from shardfs.stores.location import Remote, parse_source


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/data/x", "/data/x"),
        ("relative/dir", "relative/dir"),
        ("file:///data/x", "/data/x"),
        ("precomputed://file:///data/x", "/data/x"),
        ("gs://bucket/a/b/", Remote("gs", "bucket", "a/b")),
        ("precomputed://gs://bucket/fafb", Remote("gs", "bucket", "fafb")),
        ("zarr3://s3://bucket/x.zarr", Remote("s3", "bucket", "x.zarr")),
        ("zarr://s3://bucket", Remote("s3", "bucket", "")),
        ("n5://https://host:8080/p/q", Remote("https", "host:8080", "p/q")),
        ("https://storage.googleapis.com/bucket/ds", Remote("https", "storage.googleapis.com", "bucket/ds")),
        ("https://bucket.s3.amazonaws.com/ds", Remote("https", "bucket.s3.amazonaws.com", "ds")),
    ],
)
def test_sources(text: str, expected: object) -> None:
    assert parse_source(text) == expected


def test_urls_for_messages() -> None:
    remote = Remote("s3", "bucket", "a/b")
    assert remote.url == "s3://bucket/a/b"
    assert remote.url_of("info") == "s3://bucket/a/b/info"
    assert Remote("http", "h:1", "").url_of("") == "http://h:1"


@pytest.mark.parametrize(("text", "why"), [("ftp://host/x", "unknown scheme 'ftp'"), ("s3://", "no bucket")])
def test_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_source(text)
