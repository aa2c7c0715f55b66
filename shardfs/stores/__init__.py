"""Where the bytes come from: a local directory, or an object store over HTTP, S3 or GCS, with the disk cache
and credentials a remote source needs. Everything above reads through the Store protocol in protocol.py."""
