"""The lock-free tally behind the hot-path metrics: exact under threads, and exposed as prometheus_client
itself exposes the same observations."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from shardfs import metrics
from tests.support.cli import scrape


def test_counts_from_many_threads_add_up_exactly() -> None:
    mount = metrics.Metrics()
    before = scrape(mount.text().decode()).get(("shardfs_store_reads_total", frozenset()), 0)

    def count() -> None:
        for _ in range(20_000):
            mount.store_reads.inc()

    threads = [threading.Thread(target=count) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert scrape(mount.text().decode())["shardfs_store_reads_total", frozenset()] - before == 160_000


def test_two_mounts_of_one_process_count_apart() -> None:
    """Each mount's figures are its own: what one counts never shows in the other's exposition."""
    one, other = metrics.Metrics(), metrics.Metrics()
    one.served.inc(100)
    one.ops.labels("read").observe(0.001)
    one.errors.labels("EIO").inc()
    mine, theirs = scrape(one.text().decode()), scrape(other.text().decode())
    served = "shardfs_served_bytes_total", frozenset()
    assert mine[served] == 100 and theirs[served] == 0
    assert mine["shardfs_fuse_op_seconds_count", frozenset({("op", "read")})] == 1
    assert ("shardfs_fuse_op_seconds_count", frozenset({("op", "read")})) not in theirs
    assert ("shardfs_errors_total", frozenset({("errno", "EIO")})) not in theirs


def test_histogram_and_counter_read_as_prometheus_clients_own() -> None:
    """The same observations through prometheus_client's Histogram and Counter and through the tally give
    the same samples, bucket by bucket."""
    theirs = CollectorRegistry()
    their_ops = Histogram("t_seconds", "h", ["op"], buckets=metrics.LATENCY_BUCKETS, registry=theirs)
    their_bytes = Counter("t_bytes", "c", registry=theirs)
    tally = metrics.Tally()
    ours = metrics.FastHistogram("t_seconds", "h", "op", metrics.LATENCY_BUCKETS, tally)
    our_bytes = metrics.FastCounter("t_bytes", "c", tally)
    observations = [0, 1e-5, 1.5e-5, 2.5e-5, 3e-4, 0.05, 0.999, 1, 4, 5, 6, 1e9] * 3
    for i, seconds in enumerate(observations):
        op = ("getattr", "read")[i % 2]
        their_ops.labels(op).observe(seconds)
        ours.labels(op).observe(seconds)
        their_bytes.inc(i)
        our_bytes.inc(i)
    totals = tally.totals()
    our_text = "".join(generate_latest(_Fixed([family.collect(totals)])).decode() for family in (ours, our_bytes))
    their = {k: v for k, v in scrape(generate_latest(theirs).decode()).items() if not k[0].endswith("_created")}
    assert scrape(our_text) == their
    assert their["t_seconds_count", frozenset({("op", "read")})] == len(observations) / 2


class _Fixed(CollectorRegistry):
    """A registry that exposes the given families, as a scrape of the mount's registry would."""

    def __init__(self, families: list) -> None:
        super().__init__()
        self.families = families

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(self.families)
