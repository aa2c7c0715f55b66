"""`shardfs stats`' short answer: a few figures a person reads at a glance, from the Prometheus text."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from shardfs.errors import binary_size as size


def _read(text: str) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """Each sample name summed over its labels, errors by errno, and the mount's identity labels."""
    total: dict[str, float] = defaultdict(float)
    errors: dict[str, float] = defaultdict(float)
    mount: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            total[sample.name] += sample.value
            if sample.name == "shardfs_errors_total":
                errors[sample.labels["errno"]] += sample.value
            elif sample.name == "shardfs_mount_info":
                mount = sample.labels
    return total, errors, mount


def identity(text: str, now: float) -> tuple[str, str]:
    """The view a daemon serves and how long it has been up, for `shardfs list`."""
    total, _, mount = _read(text)
    return mount.get("view", "?"), duration(max(now - total["shardfs_start_time_seconds"], 0))


def summary(text: str, now: float) -> str:
    """What is mounted, uptime, operations and their rate, bytes served, cache hit rate and errors, one line each."""
    total, errors, mount = _read(text)
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
        f"cache       {rate} hit rate ({hits:,.0f} of {hits + misses:,.0f} lookups); "
        f"{held}{beyond}\n"
        f"errors      {sum(errors.values()):,.0f}{f' ({by_errno})' if by_errno else ''}; "
        f"corrupt data: {total['shardfs_decode_errors_total']:,.0f}; "
        f"over --max-file-size: {total['shardfs_over_max_file_size_total']:,.0f}\n"
    )


def duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    return f"{days}d {h}h {m:02d}m" if days else f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"
