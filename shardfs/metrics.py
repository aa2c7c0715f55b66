"""What a mount counts, for Prometheus (`--metrics`) and for `shardfs stats`.

Counting is always on, so `shardfs stats` answers on every mount: one observation costs about a
microsecond, small beside a FUSE round trip (`scripts/bench.py` measures the whole stack with it).
The cache's figures are read from the cache itself when scraped, so hits cost nothing extra here.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shardfs.cache import ByteCache

disable_created_metrics()  # a `_created` timestamp per series is noise in `shardfs stats`
REGISTRY = CollectorRegistry()

# From a warm getattr (~10 µs) to a cold decode of a big chunk on a slow disk (seconds).
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)

OPS = Histogram(
    "shardfs_fuse_op_seconds", "FUSE operations answered, by type", ["op"], buckets=LATENCY_BUCKETS, registry=REGISTRY
)
SERVED = Counter("shardfs_served_bytes", "Bytes returned to readers", registry=REGISTRY)
STORE_READS = Counter("shardfs_store_reads", "Byte-range reads of source files", registry=REGISTRY)
STORE_BYTES = Counter("shardfs_store_read_bytes", "Bytes read from source files", registry=REGISTRY)
ERRORS = Counter("shardfs_errors", "Operations answered with an error other than ENOENT", ["errno"], registry=REGISTRY)
START_TIME = Gauge("shardfs_start_time_seconds", "When the mount went live, in Unix time", registry=REGISTRY)
# Requests to a remote source (`head`, `get`, `list`) by outcome: ok, not_found, denied, changed, failed
# (failed: a server error or timeout that obstore's retries, with backoff, could not get past).
REMOTE_REQUESTS = Counter(
    "shardfs_remote_requests", "Requests to a remote source, by kind and outcome", ["request", "outcome"],
    registry=REGISTRY,
)  # fmt: skip
REMOTE_SECONDS = Histogram(
    "shardfs_remote_request_seconds", "Remote request latency, retries included", ["request"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=REGISTRY,
)  # fmt: skip
DISK_CACHE = Counter(
    "shardfs_disk_cache_lookups",
    "Remote byte ranges looked up in --cache-dir, by result",
    ["result"],
    registry=REGISTRY,
)
DECODE_ERRORS = Counter(
    "shardfs_decode_errors", "Stored data that contradicts its index or does not decode", registry=REGISTRY
)


class CacheCollector(Collector):
    """The byte cache's figures at scrape time. There is one cache per mount: every index, decoded chunk
    and looked-up node shares one byte budget."""

    def __init__(self, cache: ByteCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        c = self.cache
        yield CounterMetricFamily("shardfs_cache_hits", "Cache lookups answered from memory", value=c.hits)
        yield CounterMetricFamily("shardfs_cache_misses", "Cache lookups that had to read or decode", value=c.misses)
        yield CounterMetricFamily("shardfs_cache_evictions", "Entries dropped to stay in budget", value=c.evictions)
        yield GaugeMetricFamily("shardfs_cache_bytes", "Bytes held by the cache now", value=c.nbytes)
        yield GaugeMetricFamily("shardfs_cache_budget_bytes", "The cache's byte budget (--cache-size)", value=c.budget)
        yield GaugeMetricFamily("shardfs_cache_entries", "Entries held by the cache now", value=c.entries)


def watch_cache(cache: ByteCache) -> None:
    """Report this mount's cache; a daemon serves one mount, so one cache is registered."""
    REGISTRY.register(CacheCollector(cache))


def text() -> bytes:
    """Every figure in Prometheus' text format."""
    return generate_latest(REGISTRY)
