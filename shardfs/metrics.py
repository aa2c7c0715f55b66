"""What a mount counts, for Prometheus (`--metrics`) and for `shardfs stats`.

Counting is always on, so `shardfs stats` answers on every mount: one observation costs about a
microsecond, small beside a FUSE round trip (`scripts/bench.py` measures the whole stack with it).
The cache's figures are read from the cache itself when scraped, so hits cost nothing extra here.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import defaultdict
from collections.abc import Hashable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from shardfs.cache import ByteCache

disable_created_metrics()  # a `_created` timestamp per series is noise in `shardfs stats`

# From a warm getattr (~10 µs) to a cold decode of a big chunk on a slow disk (seconds).
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)


class Tally:
    """Counts kept without a lock: each thread adds into a dict of its own, and a scrape sums them.
    prometheus_client's counters take a lock per increment (0.3 µs; 0.6 µs a histogram observation),
    and a cold file costs five of them: a tenth of shardfs's own work per file."""

    def __init__(self) -> None:
        self._mine = threading.local()
        self._every: list[dict[Hashable, float]] = []  # one per thread that ever counted: few, and small
        self._lock = threading.Lock()

    def add(self, key: Hashable, amount: float = 1) -> None:
        try:
            counts = self._mine.counts
        except AttributeError:
            counts = self._mine.counts = {}
            with self._lock:
                self._every.append(counts)
        counts[key] = counts.get(key, 0) + amount

    def mine(self, key: Hashable) -> float:
        """This thread's count of key (a request's own share: requests are answered one a thread)."""
        counts = getattr(self._mine, "counts", None)
        return counts.get(key, 0) if counts is not None else 0

    def totals(self) -> dict[Hashable, float]:
        out: dict[Hashable, float] = defaultdict(float)
        with self._lock:
            every = list(self._every)
        for counts in every:
            for key, value in list(counts.items()):  # a copy: its thread may be adding a key
                out[key] += value
        return out


class FastCounter:
    """A counter on the hot path (bytes served, store reads): prometheus_client's `inc`, counted in a tally."""

    def __init__(self, name: str, help: str, tally: Tally) -> None:
        self.name, self.help, self.tally = name, help, tally

    def inc(self, amount: float = 1) -> None:
        self.tally.add(self.name, amount)

    def mine(self) -> float:
        """What this thread has counted."""
        return self.tally.mine(self.name)

    def collect(self, totals: dict[Hashable, float]) -> Metric:
        return CounterMetricFamily(self.name, self.help, value=totals[self.name])


class FastHistogram:
    """Latency by FUSE operation, counted in a tally: `labels(op).observe(seconds)` as prometheus_client's."""

    def __init__(self, name: str, help: str, label: str, buckets: tuple[float, ...], tally: Tally) -> None:
        self.name, self.help, self.label, self.buckets, self.tally = name, help, label, buckets, tally
        self._observers: dict[str, _Observer] = {}  # by label value: made once, looked up on every request

    def labels(self, value: str) -> _Observer:
        observer = self._observers.get(value)
        if observer is None:  # two threads may make it at once: either one counts into the same tally
            observer = self._observers.setdefault(value, _Observer(self.tally, self.name, value, self.buckets))
        return observer

    def collect(self, totals: dict[Hashable, float]) -> Metric:
        family = HistogramMetricFamily(self.name, self.help, labels=[self.label])
        values = sorted({key[1] for key in totals if isinstance(key, tuple) and key[0] == self.name})
        for value in values:
            cumulative, buckets = 0.0, []
            for i, bound in enumerate((*self.buckets, math.inf)):
                cumulative += totals.get((self.name, value, i), 0)
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric([value], buckets, totals.get((self.name, value, "sum"), 0))
        return family


class _Observer:
    __slots__ = ("_count", "_sum", "_tally", "buckets")

    def __init__(self, tally: Tally, name: str, value: str, buckets: tuple[float, ...]) -> None:
        self._tally = tally
        self._count = [(name, value, i) for i in range(len(buckets) + 1)]
        self._sum = (name, value, "sum")
        self.buckets = buckets

    def observe(self, seconds: float) -> None:
        self._tally.add(self._count[bisect.bisect_left(self.buckets, seconds)])
        self._tally.add(self._sum, seconds)


class Metrics:
    """One mount's figures, in a registry of its own: a process serving several mounts (the CSI daemon) counts
    each apart, and each mount's exposition (its stats socket, `--metrics`) has the same series, under the
    same names, as a daemon serving that mount alone would show."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        tally = self.tally = Tally()
        self.ops = FastHistogram("shardfs_fuse_op_seconds", "FUSE operations answered, by type", "op",
                                 LATENCY_BUCKETS, tally)  # fmt: skip
        self.served = FastCounter("shardfs_served_bytes", "Bytes returned to readers", tally)
        self.store_reads = FastCounter("shardfs_store_reads", "Byte-range reads of source files", tally)
        self.store_bytes = FastCounter("shardfs_store_read_bytes", "Bytes read from source files", tally)
        self.files_read = FastCounter(
            "shardfs_files_read", "Files whose first bytes a reader read (store reads a file: reads over this)", tally
        )
        self.registry.register(TallyCollector(self))
        registry = self.registry
        self.errors = Counter(
            "shardfs_errors", "Operations answered with an error other than ENOENT", ["errno"], registry=registry
        )
        self.mount = Info(
            "shardfs_mount", "What this daemon serves: its source, mountpoint and view", registry=registry
        )
        self.start_time = Gauge(
            "shardfs_start_time_seconds", "When the mount went live, in Unix time", registry=registry
        )
        # Requests to a remote source (`head`, `get`, `list`) by outcome: ok, not_found, denied, changed, failed,
        # refused (failed: a server error or timeout that obstore's retries, with backoff, could not get past).
        self.remote_requests = Counter(
            "shardfs_remote_requests", "Requests to a remote source, by kind and outcome", ["request", "outcome"],
            registry=registry,
        )  # fmt: skip
        self.remote_seconds = Histogram(
            "shardfs_remote_request_seconds", "Remote request latency, retries included", ["request"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=registry,
        )  # fmt: skip
        self.disk_cache = Counter(
            "shardfs_disk_cache_lookups", "Remote byte ranges looked up in --cache-dir, by result", ["result"],
            registry=registry,
        )  # fmt: skip
        self.decode_errors = Counter(
            "shardfs_decode_errors", "Stored data that contradicts its index or does not decode", registry=registry
        )
        self.over_max_file_size = Counter(
            "shardfs_over_max_file_size", "Reads refused because the file is larger than --max-file-size",
            registry=registry,
        )  # fmt: skip
        self.read_ahead = Counter(
            "shardfs_read_ahead_chunks",
            "Chunks fetched ahead of the kernel's requests (fetched), of those read then (used), and fetches failed",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self.read_ahead_bytes = Counter(
            "shardfs_read_ahead_bytes", "Bytes fetched ahead of the kernel's requests (fetched), and of those read then"
            " (used): the difference was fetched for nothing", ["outcome"], registry=registry,
        )  # fmt: skip
        self.resent = Counter(
            "shardfs_fuse_resent_requests",
            "Requests the kernel sent again after a restart (read by the daemon before and never answered)",
            registry=registry,
        )

    def watch_cache(self, cache: ByteCache) -> None:
        """Report the mount's cache (one a mount: every index, decoded chunk and node shares its budget)."""
        self.registry.register(CacheCollector(cache))

    def text(self) -> bytes:
        """Every figure in Prometheus' text format."""
        return generate_latest(self.registry)


class TallyCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        totals = m.tally.totals()
        for metric in (m.ops, m.served, m.store_reads, m.store_bytes, m.files_read):
            yield metric.collect(totals)


class CacheCollector(Collector):
    """The byte cache's figures at scrape time."""

    def __init__(self, cache: ByteCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        c = self.cache
        yield CounterMetricFamily("shardfs_cache_hits", "Cache lookups answered from memory", value=c.hits)
        yield CounterMetricFamily("shardfs_cache_misses", "Cache lookups that had to read or decode", value=c.misses)
        yield CounterMetricFamily("shardfs_cache_evictions", "Entries dropped to stay in budget", value=c.evictions)
        yield GaugeMetricFamily("shardfs_cache_bytes", "Bytes held by the cache now", value=c.nbytes)
        yield GaugeMetricFamily("shardfs_cache_budget_bytes", "The cache's byte budget (--cache-size)", value=c.budget)
        yield GaugeMetricFamily(
            "shardfs_cache_oversized_bytes", "Of the bytes held, those of the one file larger than the budget",
            value=c.oversized,
        )  # fmt: skip
        yield GaugeMetricFamily("shardfs_cache_entries", "Entries held by the cache now", value=c.entries)
