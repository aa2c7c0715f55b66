"""shardfs: sharded scientific datasets, mounted as the per-chunk files their unsharded form would hold."""

__version__ = "0.1.0"
