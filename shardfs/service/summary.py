"""`shardfs stats`' short answer: a few figures a person reads at a glance, from the Prometheus text."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from shardfs.errors import binary_size as size


def _read(text: str) -> tuple[dict[str, float], dict[str, float], dict[str, str], dict[str, float]]:
    """Each sample name summed over its labels, errors by errno, the mount's identity labels, and read-ahead's
    figures by outcome (its bytes as `bytes <outcome>`)."""
    total: dict[str, float] = defaultdict(float)
    errors: dict[str, float] = defaultdict(float)
    ahead: dict[str, float] = defaultdict(float)
    mount: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            total[sample.name] += sample.value
            if sample.name == "shardfs_errors_total":
                errors[sample.labels["errno"]] += sample.value
            elif sample.name == "shardfs_mount_info":
                mount = sample.labels
            elif sample.name == "shardfs_read_ahead_chunks_total":
                ahead[sample.labels["outcome"]] += sample.value
            elif sample.name == "shardfs_read_ahead_bytes_total":
                ahead[f"bytes {sample.labels['outcome']}"] += sample.value
    return total, errors, mount, ahead


def identity(text: str, now: float) -> tuple[str, str]:
    """The view a daemon serves and how long it has been up, for `shardfs list`."""
    total, _, mount, _ = _read(text)
    return mount.get("view", "?"), duration(max(now - total["shardfs_start_time_seconds"], 0))


def summary(text: str, now: float) -> str:
    """What is mounted, uptime, operations and their rate, bytes served, what the store was asked for them,
    read-ahead, cache hit rate and errors, one line each."""
    total, errors, mount, ahead = _read(text)
    up = max(now - total["shardfs_start_time_seconds"], 1e-9)
    ops = total["shardfs_fuse_op_seconds_count"]
    hits, misses = total["shardfs_cache_hits_total"], total["shardfs_cache_misses_total"]
    rate = f"{hits / (hits + misses):.1%}" if hits + misses else "-"
    by_errno = ", ".join(f"{name} {count:.0f}" for name, count in sorted(errors.items()) if count)
    oversized = total["shardfs_cache_oversized_bytes"]
    held = f"{size(total['shardfs_cache_bytes'] - oversized)} held of {size(total['shardfs_cache_budget_bytes'])}"
    beyond = f" (and one file larger than that budget: {size(oversized)})" if oversized else ""
    return (
        f"mount       {mount.get('source', '?')} at {mount.get('mountpoint', '?')}, view {mount.get('view', '?')}\n"
        f"uptime      {duration(up)}\n"
        f"operations  {ops:,.0f} ({ops / up:,.1f}/s)\n"
        f"served      {size(total['shardfs_served_bytes_total'])}\n"
        f"store       {_store(total)}\n"
        f"read-ahead  {_read_ahead(ahead)}\n"
        f"cache       {rate} hit rate ({hits:,.0f} of {hits + misses:,.0f} lookups); "
        f"{held}{beyond}\n"
        f"errors      {sum(errors.values()):,.0f}{f' ({by_errno})' if by_errno else ''}; "
        f"corrupt data: {total['shardfs_decode_errors_total']:,.0f}; "
        f"over --max-file-size: {total['shardfs_over_max_file_size_total']:,.0f}\n"
    )


def _store(total: dict[str, float]) -> str:
    """What reading the source cost: its reads a file read, its bytes a byte served (over a network, each read
    is a request)."""
    reads, files = total["shardfs_store_reads_total"], total["shardfs_files_read_total"]
    fetched, served = total["shardfs_store_read_bytes_total"], total["shardfs_served_bytes_total"]
    per_file = f" ({reads / files:,.2f} a file read)" if files else ""
    per_byte = f" ({fetched / served:,.2f} a byte)" if served else ""
    return f"{reads:,.0f} reads{per_file}, {size(fetched)} read for {size(served)} served{per_byte}"


def _read_ahead(ahead: dict[str, float]) -> str:
    """Files fetched ahead and read then, and the bytes fetched that no one read (yet)."""
    if not ahead["fetched"] and not ahead["failed"]:
        return "nothing fetched ahead"
    unused = ahead["bytes fetched"] - ahead["bytes used"]
    return (
        f"{ahead['fetched']:,.0f} files fetched ahead, {ahead['used']:,.0f} read then; {size(unused)} fetched"
        f" and not read; {ahead['failed']:,.0f} failed"
    )


def duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    return f"{days}d {h}h {m:02d}m" if days else f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"
