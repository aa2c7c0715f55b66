"""The mutation check: one-line mutations of the places where a wrong byte or a wrong permission would hide,
each of which the named tests must kill. Every mutation is applied to a fresh copy of the tree (the working
tree is never edited), the tests run there through the kernel with `-x -q`, and each mutation is reported
KILLED or SURVIVED. The named tests are first run on an unmutated copy: a test that fails anyway kills
nothing. Exit 0 when every mutation is killed, 1 when one survives, 2 when the list or the baseline is broken.

Slow (a minute or two per mutation set), so not part of `scripts/test` or CI: run `scripts/mutate`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(".venv*", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info")


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository
    original: str  # occurs exactly once in file
    replacement: str
    tests: tuple[str, ...]  # pytest node ids that must kill it


CONTRACT = "tests/mount/test_mount_contract.py::"
ATTRIBUTES = CONTRACT + "test_every_file_has_its_twins_size_and_every_node_the_sources_mtime"
TIMEOUTS = CONTRACT + "test_names_attributes_and_absences_are_kept_by_the_kernel"
TWINS = "tests/mount/test_zarr.py::test_inner_chunks_are_the_unsharded_twins_files"
NAMES = "tests/mount/test_chunk_names.py::test_names_are_the_twins_and_no_other_spelling_is_a_file["
BLOCKS = "tests/mount/test_view_blocks.py::"
SPARE = (
    "tests/mount/test_fuse_protocol.py::"
    "test_a_read_interrupted_while_it_waits_on_the_server_is_answered_at_once_and_a_spare_stands_in"
)
MEANWHILE = (
    "tests/remote/test_read_ahead.py::"
    "test_a_file_read_while_its_fetch_ahead_is_under_way_is_counted_used_once_the_fetch_ends"
)
RESTART = "tests/service/test_restart.py::test_a_replaced_daemon_loses_no_request[systemd-kill]"
VERSIONS = "tests/remote/test_remote_versions.py::test_an_object_replaced_under_the_mount_is_eio"
OPTIONS = "tests/mount/test_mount_options.py::"
PROTOCOL = "tests/mount/test_fuse_protocol.py::"
ZEROS = OPTIONS + "test_a_default_mount_shows_the_sources_owners_and_read_bits_and_zero_values_are_values"
FLAGS = OPTIONS + "test_mount_flags_reach_the_kernel"
FORGETS = PROTOCOL + "test_forget_counts_down_every_lookup_the_kernel_made"
TIMED = PROTOCOL + "test_each_timeout_reaches_the_kernel_as_given_to_the_nanosecond"
EDGES = "tests/remote/test_remote_edges.py::"
ODD = "tests/hostile/test_odd_values.py::"
N5 = "tests/mount/test_view_n5.py::"
COLLECTION = "tests/mount/test_collection.py::test_a_data_directory_shows_every_dataset_as_its_own_mount_does"
INFO = "tests/mount/test_collection.py::test_info_and_check_walk_the_datasets_a_directory_holds"
IDS = "tests/unit/test_record.py::test_no_id_is_issued_again_by_a_second_or_third_daemon"
CUT = "tests/unit/test_record.py::test_a_record_cut_at_any_point_of_any_write_reads_as_before_or_after"
NUMBERED = ("tests/unit/test_record.py::test_a_directory_of_datasets_numbers_its_sharded_directories_for_the_mounts"
            "_life_and_the_next_daemons")  # fmt: skip
HELD = "tests/service/test_restart.py::test_a_chunk_held_below_a_directory_of_datasets_reads_after_its_daemon_is_"
FUSE_H = PROTOCOL + "test_init_flags_and_opcodes_are_the_bits_and_numbers_of_linux_fuse_h"
LINKED = "tests/service/test_keeper.py::test_a_mount_named_through_links_restarts_into_itself_by_any_of_its_names"
CSI = "tests/deploy/test_csi.py::"
TENANTS = CSI + "test_each_secret_has_its_own_daemon_inheriting_nothing_of_the_plugin"
WALK = "tests/remote/test_remote_bounds.py::"
WINDOWS = "tests/unit/test_logs.py::test_every_window_restarts_the_budget_at_its_end_and_not_a_tick_before"
OME_ROOT = "tests/mount/test_views.py::test_an_ome_zarr_image_at_the_root_of_the_mount_is_one"
CURSOR = "tests/unit/test_dir_cursor.py::"

MUTATIONS = [
    Mutation("SIGHUP keeps shard files open", "shardfs/tree.py", "self.store.forget()", "pass",
             ("tests/hostile/test_bounds.py::test_a_shard_replaced_by_rename_serves_one_version_then_the_new_after_sighup",)),
    Mutation("st_blksize 128 KiB", "shardfs/fuse/filesystem.py", "BLOCK_SIZE = 1 << 20", "BLOCK_SIZE = 1 << 17",
             (ATTRIBUTES, "tests/mount/test_precomputed_e2e.py::test_plain_tools_copy_the_unsharded_tree")),
    Mutation("virtual nodes' mtime 0", "shardfs/fs/bridge.py", "self._times = (*divmod(mtime_ns, 1_000_000_000),)",
             "self._times = (0, 0)",
             (ATTRIBUTES,)),
    Mutation("st_size one too many", "shardfs/fs/bridge.py", "fields = (size, (size + 511) // 512,",
             "fields = (size + 1, (size + 511) // 512,",
             (ATTRIBUTES,)),
    Mutation("no default_permissions", "shardfs/service/daemon.py", '"default_permissions": True,', "",
             (CONTRACT + "test_the_kernel_holds_the_default_options",
              "tests/hostile/test_isolation.py::test_private_parts_of_a_source_stay_private")),
    # With no_open the kernel keeps pages whatever kernel_cache says (it is a fallback for kernels without
    # no_open), so the mutation that removes it is equivalent here; the one that turns no_open off is not.
    Mutation("no_open never used", "shardfs/fuse/session.py", "        if self.no_open:", "        if False:",
             (CONTRACT + "test_the_kernel_opens_files_without_asking",)),
    Mutation("no attr_timeout", "shardfs/service/daemon.py", '"attr_timeout": str(ONE_DAY),', "", (TIMEOUTS,)),
    Mutation("no entry_timeout", "shardfs/service/daemon.py", '"entry_timeout": str(ONE_DAY),', "", (TIMEOUTS,)),
    Mutation("no negative_timeout", "shardfs/service/daemon.py", '"negative_timeout": str(ONE_DAY),', "", (TIMEOUTS,)),
    Mutation("--metrics on every address", "shardfs/options.py", 'DEFAULT_METRICS_HOST = "127.0.0.1"',
             'DEFAULT_METRICS_HOST = "0.0.0.0"', (CONTRACT + "test_metrics_listen_on_loopback_by_default",)),
    Mutation("default log directory 0755", "shardfs/service/daemon.py", 'f"shardfs-{os.getuid()}", 0o700)',
             'f"shardfs-{os.getuid()}", 0o755)', (CONTRACT + "test_the_default_log_directory_is_the_users_alone",)),
    Mutation("detached daemon exits 1 after a clean unmount", "shardfs/service/daemon.py",
             "carrier, taken_up) else 0", "carrier, taken_up) else 1",
             (CONTRACT + "test_the_detached_daemon_exits_0_after_a_clean_unmount_on_sigterm",)),
    Mutation("gzip chunks of raw voxels fetched at lookup", "shardfs/formats/precomputed.py",
             'raw = voxel_bytes if grid.encoding == "raw" else 0', "raw = 0",
             ("tests/remote/test_remote_http.py::test_gzip_chunks_of_raw_voxels_are_stated_without_their_data",)),
    Mutation("no 2x decode bound on volume chunks", "shardfs/formats/precomputed.py",
             "limit = min(2 * math.prod(naming.chunk) * voxel_bytes + 65536, self.cache.max_value)",
             "limit = self.cache.max_value",
             ("tests/hostile/test_bounds.py::test_a_volume_chunk_decodes_to_at_most_twice_its_raw_size",)),
    Mutation("no 16 MiB minishard index bound", "shardfs/shards/neuroglancer.py",
             "MINISHARD_INDEX_LIMIT = 16 << 20", "MINISHARD_INDEX_LIMIT = 1 << 40",
             ("tests/hostile/test_bounds.py::test_a_minishard_index_decodes_to_at_most_16_mib",)),
    Mutation("big-endian zarr index read as little", "shardfs/formats/zarr_codecs.py",
             'names[-1] == "crc32c", endian == "big")', 'names[-1] == "crc32c", False)',
             (f"{TWINS}[index_big_endian_crc32c_at_start]", f"{TWINS}[index_big_endian_at_end]")),
    Mutation("zarr index without crc32c read as with", "shardfs/formats/zarr_codecs.py",
             'names[-1] == "crc32c", endian == "big")', 'True, endian == "big")',
             (f"{TWINS}[index_without_crc32c_at_start]", f"{TWINS}[index_big_endian_at_end]")),
    Mutation("zarr chunks past the edge listed", "shardfs/shards/zarr_kv.py",
             "return pos[(pos < np.asarray(self.grid, dtype=np.int64)).all(axis=1)]", "return pos",
             ("tests/mount/test_zarr.py::test_inner_chunks_past_the_array_edge_are_absent",)),
    Mutation("precomputed listing keeps another shard's keys", "shardfs/shards/neuroglancer_kv.py",
             "if self.spec.shard_and_minishard(key) == (opened.shard, minishard):", "if True:",
             ("tests/mount/test_precomputed_e2e.py::test_a_shard_holding_another_shards_keys_lists_only_its_own",
              "tests/cli/test_kv_listing.py::test_a_shard_holding_another_shards_keys_lists_only_its_own")),
    Mutation("mesh fragments may overrun into the shard index", "shardfs/formats/precomputed_dirs.py",
             "if length is None or length > chunk.start - self.kv.spec.shard_index_size:", "if length is None:",
             ("tests/hostile/test_bounds.py::test_mesh_fragments_never_reach_into_the_shard_index",)),
    Mutation("gzip chunks served still gzipped", "shardfs/formats/precomputed_dirs.py",
             'if kv.spec.data_encoding == "raw":', "if True:",
             ("tests/hostile/test_bounds.py::test_a_file_past_max_file_size_is_eio_naming_the_limit",)),
    Mutation("minishard starts not offset by the shard index", "shardfs/shards/neuroglancer.py",
             "+ np.uint64(shard_index_size)", "+ np.uint64(0)",
             ("tests/hostile/test_bad_input.py::test_missing_shard_means_absent_chunks",)),
    Mutation("whole-shard codec not undone", "shardfs/shards/zarr_kv.py",
             "return decode_blob(stored, level.post, self.limits[depth], request, self.cache)", "return stored",
             (f"{TWINS}[whole_shard_gzip]", f"{TWINS}[whole_shard_crc32c]")),
    Mutation("views show the 2022 draft", "shardfs/views/__init__.py", 'not in ("zarr", "precomputed"):',
             'not in ("zarr", "precomputed", "zarr draft"):',
             ("tests/mount/test_zarr_draft.py::test_views_refuse_the_draft_in_one_line[n5]",)),
    Mutation("stale mount cleared silently", "shardfs/service/daemon.py",
             'log.warning("clearing the stale mount at %s"',
             'log.info("clearing the stale mount at %s"',
             ("tests/service/test_daemon.py::test_stale_mount_is_cleared",)),
    Mutation("no unmounted log event", "shardfs/service/daemon.py",
             'log.info("unmounted %s", mountpoint, extra={"event": "unmounted"})', "pass",
             ("tests/service/test_daemon.py::test_signals_unmount_cleanly",)),
    Mutation("links followed on the way to a directory", "shardfs/stores/local.py",
             "_DIR_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC", "_DIR_FLAGS = os.O_DIRECTORY | os.O_CLOEXEC",
             ("tests/hostile/test_isolation.py::test_links_are_not_followed_anywhere",)),
    Mutation("owners not narrowed by the directories above", "shardfs/stores/protocol.py",
             "return Owner(self.uid, self.gid, mode)", "return self",
             ("tests/hostile/test_isolation.py::test_a_source_under_a_closed_directory_is_closed",)),
    Mutation("a short read served short", "shardfs/stores/local.py", "if len(data) != stop - start:", "if False:",
             ("tests/hostile/test_bounds.py::test_a_shard_truncated_under_the_mount_is_eio_never_short",)),
    Mutation("volume names by table one cell off", "shardfs/formats/precomputed_names.py",
             "self.morton.encode(_along(d, p))", "self.morton.encode(_along(d, p + 1))",
             (ATTRIBUTES,)),
    Mutation("latency buckets off by one at their bounds", "shardfs/metrics.py",
             "bisect.bisect_left(self.buckets", "bisect.bisect_right(self.buckets",
             ("tests/unit/test_metrics.py::test_histogram_and_counter_read_as_prometheus_clients_own",)),
    Mutation("a multi-member gzip chunk cut to its first member", "shardfs/codecs.py",
             "if not member.eof or member.unused_data or", "if not member.eof or",
             ("tests/unit/test_index_maths.py::test_gzip_decode",)),
    # The remote store (issue 20): each GET tied to the version its index came from, answers bounded.
    Mutation("If-Match never sent", "shardfs/stores/remote.py",
             'return {} if version[1].startswith("W/") else {"if_match": version[1]}', "return {}",
             (f"{VERSIONS}[etag]",)),
    Mutation("If-Unmodified-Since never sent", "shardfs/stores/remote.py",
             'return {"if_unmodified_since": datetime.fromisoformat(version[2])}', "return {}",
             (f"{VERSIONS}[last-modified]",)),
    Mutation("an answer's size not compared", "shardfs/stores/remote.py", 'if meta["size"] != file.size:', "if False:",
             (f"{VERSIONS}[size-only]",)),
    Mutation("an answer's ETag not compared", "shardfs/stores/remote.py",
             'if file.version[0] == "etag" and meta.get("e_tag") != file.version[1]:', "if False:",
             (f"{VERSIONS}[etag-ignored]",)),
    Mutation("an answer's Last-Modified not compared", "shardfs/stores/remote.py",
             'if file.version[0] == "modified" and _modified(meta) != file.version[2]:', "if False:",
             (f"{VERSIONS}[last-modified-ignored]",)),
    Mutation("a deleted object reported as absent", "shardfs/stores/remote.py",
             'raise StoreChanged(url, "deleted since it was opened") from None', "raise",
             ("tests/remote/test_remote_versions.py::test_an_object_deleted_under_the_mount_is_eio_never_enoent",)),
    Mutation("an unversioned source kept on disk", "shardfs/stores/remote.py",
             'return self.disk if file.version[0] != "size" else None', "return self.disk",
             ("tests/remote/test_remote_versions.py::test_a_source_without_versions_is_never_kept_on_disk",)),
    Mutation("names no object can have sent", "shardfs/stores/remote.py",
             "return _NOT_IN_A_KEY.search(path) is None", "return True",
             ("tests/remote/test_remote_http.py::test_names_no_object_can_have_are_enoent_and_never_sent",)),
    Mutation("each attempt a quarter of --timeout", "shardfs/stores/remote.py",
             '"timeout": timedelta(seconds=t / 2),', '"timeout": timedelta(seconds=t / 4),',
             ("tests/remote/test_remote_http.py::test_timeout_gives_each_attempt_half",)),
    Mutation("a long answer read to its end", "shardfs/stores/remote.py",
             "        if n > asked:\n            break\n", "",
             ("tests/remote/test_remote_http.py::test_a_wrong_answer_is_eio_naming_its_cause_and_costs_no_more_than_asked"
              "[longer]",)),
    Mutation("remote pieces of 4 MiB", "shardfs/stores/remote.py",
             "    piece_size = 8 << 20", "    piece_size = 4 << 20",
             ("tests/remote/test_remote_http.py::test_a_large_value_is_read_in_pieces_of_piece_size",)),
    # The disk cache (issues 18 and 20): nothing in it trusted, its key and its order kept.
    # Read-ahead's fetch under way (issue 42): a read of one of its keys waits for it, and counts as used.
    Mutation("a read of a key being fetched ahead fetches it again", "shardfs/cache.py",
             "self._making[key] = threading.Lock()\n                self._making[key].acquire()",
             "self._making[key] = threading.Lock()",
             ("tests/unit/test_cache.py::test_a_read_of_a_key_being_fetched_with_others_waits_for_that_fetch",)),
    Mutation("a read while its fetch is under way not counted", "shardfs/fs/readahead.py",
             "                self._fetched[(number, key)] = READ_MEANWHILE\n", "                pass\n",
             (MEANWHILE,)),
    Mutation("a read meanwhile counted though its fetch failed", "shardfs/fs/readahead.py",
             "[n for key, n in fetched.items() if key in meanwhile]", "[fetched.get(key, 0) for key in meanwhile]",
             (MEANWHILE,)),
    Mutation("disk cache key without the version", "shardfs/stores/disk_cache.py",
             "repr((url, version, start, stop))", "repr((url, start, stop))",
             ("tests/remote/test_disk_cache.py::test_a_rewritten_object_is_read_anew",)),
    Mutation("disk cache evicts the newest", "shardfs/stores/disk_cache.py", "in sorted(entries):",
             "in sorted(entries, reverse=True):",
             ("tests/remote/test_disk_cache.py::test_eviction_drops_the_least_recently_used",)),
    Mutation("disk cache entry checksum not checked", "shardfs/stores/disk_cache.py",
             "!= (MAGIC, key, length, crc32c(data)):", "!= (MAGIC, key, length, HEADER.unpack(header)[3]):",
             ("tests/remote/test_disk_cache.py::test_a_changed_entry_is_fetched_again_never_served",)),
    Mutation("disk cache entry opened blocking", "shardfs/stores/disk_cache.py",
             "os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |", "os.O_RDONLY | os.O_NOFOLLOW |",
             ("tests/remote/test_disk_cache.py::test_an_entry_swapped_for_a_link_or_fifo_is_never_followed[fifo]",)),
    Mutation("disk cache directory others can write", "shardfs/stores/disk_cache.py", "elif st.st_mode & 0o022:",
             "elif False:",
             ("tests/remote/test_disk_cache.py::test_a_directory_others_could_write_is_refused[root-0777]",)),
    Mutation("listings without a budget", "shardfs/shards/listing.py",
             "LISTING_BUDGET = 64 << 20", "LISTING_BUDGET = 1 << 62",
             ("tests/remote/test_remote_bounds.py::test_a_256_gib_shard_index_over_http_lists_within_the_budget",)),
    # The service (issue 18): other users cannot flood it, and unmount touches only shardfs.
    Mutation("figures built for every caller", "shardfs/service/lifecycle.py", "            if wait > 0:\n",
             "            if False:\n",
             ("tests/service/test_service.py::test_a_flood_of_stats_requests_costs_the_daemon_little",)),
    Mutation("idle metrics connections kept", "shardfs/service/lifecycle.py", "    timeout = IDLE_TIMEOUT\n", "",
             ("tests/service/test_service.py::test_idle_metrics_connections_time_out_and_are_bounded",)),
    Mutation("metrics connections unbounded", "shardfs/service/lifecycle.py",
             "if not self._slots.acquire(blocking=False):", "if not self._slots.acquire(blocking=False) and False:",
             ("tests/service/test_service.py::test_idle_metrics_connections_time_out_and_are_bounded",)),
    Mutation("unmount of any filesystem", "shardfs/service/daemon.py",
             "if not any_type and found is not None", "if False",
             ("tests/cli/test_cli.py::test_unmount_touches_only_shardfs_unless_told",)),
    Mutation("signals left to obstore's threads", "shardfs/service/daemon.py",
             "    os.setsid()\n    lifecycle.block_signals()", "    os.setsid()",
             ("tests/service/test_service.py::test_sighup_and_sigusr1_keep_a_remote_mount",)),
    Mutation("a range asked of a path one byte on", "shardfs/stores/protocol.py",
             "return min(self.offset, size), min(self.offset + self.length, size)",
             "return min(self.offset + 1, size), min(self.offset + self.length + 1, size)",
             ("tests/mount/test_precomputed_e2e.py::test_plain_tools_copy_the_unsharded_tree",)),
    Mutation("a suffix asked of a path one byte early", "shardfs/stores/protocol.py",
             "return max(size - self.length, 0), size", "return max(size - self.length - 1, 0), size - 1",
             (f"{TWINS}[index_big_endian_at_end]",)),
    Mutation("split shard's .data read at the .shard's offsets", "shardfs/stores/protocol.py",
             "self.tail.read(max(start, cut) - cut,", "self.tail.read(max(start, cut),",
             ("tests/mount/test_split_shards.py::test_volume_read_back_by_the_peers",)),
    Mutation("EC2 named by sys_vendor only", "shardfs/stores/credentials.py",
             '{_read(dmi / "sys_vendor"), _read(dmi / "bios_vendor")}', '{_read(dmi / "sys_vendor")}',
             ("tests/remote/test_remote_credentials.py::test_each_dmi_field_alone_names_the_cloud",)),
    Mutation("GCE named by product_name only", "shardfs/stores/credentials.py",
             '.startswith("Google") or _read(dmi / "sys_vendor") == "Google"', '.startswith("Google")',
             ("tests/remote/test_remote_credentials.py::test_each_dmi_field_alone_names_the_cloud",)),
    Mutation("AWS credentials kept for hours", "shardfs/stores/credentials.py", "AWS_KEPT = timedelta(minutes=5)",
             "AWS_KEPT = timedelta(hours=5)",
             ("tests/remote/test_remote_credentials.py::test_temporary_aws_credentials_are_let_go_before_they_expire",)),
    Mutation("GOOGLE_APPLICATION_CREDENTIALS skipped", "shardfs/stores/credentials.py",
             'if found is None and os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):', "if False:",
             ("tests/remote/test_remote_credentials.py::test_a_service_account_key_signs_requests",)),
    Mutation("--cache-size minimum 32K", "shardfs/options.py", "MIN_CACHE = 64 << 10", "MIN_CACHE = 32 << 10",
             ("tests/cli/test_cli.py::test_the_smallest_cache_size_is_64k",)),
    Mutation("--cache-size minimum 128K", "shardfs/options.py", "MIN_CACHE = 64 << 10", "MIN_CACHE = 128 << 10",
             ("tests/cli/test_cli.py::test_the_smallest_cache_size_is_64k",)),
    Mutation("st_blocks in 4 KiB units", "shardfs/fs/bridge.py", "fields = (size, (size + 511) // 512,",
             "fields = (size, (size + 4095) // 4096,",
             (CONTRACT + "test_listings_give_each_entrys_type_and_blocks_cover_each_file",)),
    Mutation("overlay files listed as directories", "shardfs/tree.py",
             "yield name, child not in self.files", "yield name, True",
             (CONTRACT + "test_listings_give_each_entrys_type_and_blocks_cover_each_file",)),
    Mutation("metadata files named over HTTP listed as directories", "shardfs/stores/unlisted.py",
             "self._children[parent][name] = False", "self._children[parent][name] = True",
             ("tests/remote/test_remote_http.py::test_ome_zarr_hierarchy_over_http_is_walked_from_its_metadata",)),
    Mutation("source files listed as directories", "shardfs/tree.py", "                yield name, is_dir",
             "                yield name, True",
             (CONTRACT + "test_listings_give_each_entrys_type_and_blocks_cover_each_file",)),
    Mutation("chunk files listed as directories", "shardfs/formats/precomputed_dirs.py",
             "return ((name, False) for name in self.names())", "return ((name, True) for name in self.names())",
             (CONTRACT + "test_listings_give_each_entrys_type_and_blocks_cover_each_file",)),
    Mutation("the file over budget kept while the next is made", "shardfs/cache.py",
             "            self.drop_overflow()", "            pass",
             ("tests/hostile/test_bounds.py::test_the_file_over_budget_is_let_go_before_the_next_is_made",)),
    Mutation("every looked-up chunk node kept in the cache", "shardfs/tree.py",
             'return getattr(node, "nbytes", 0) > 0', "return True",
             ("tests/mount/test_memory.py::test_listing_and_reading_125000_chunks_stays_within_the_cache_size_and_40_mib",)),
    Mutation("the cache's entries counted without their keys", "shardfs/cache.py",
             "return key_cost(key) + sys.getsizeof(value) + getattr", "return sys.getsizeof(value) + getattr",
             ("tests/unit/test_cache.py::test_the_budget_bounds_what_many_small_entries_really_cost",)),
    Mutation("volume names parsed with leading zeros and plus signs", "shardfs/formats/precomputed_names.py",
             '_INT = r"(0|-?[1-9][0-9]*)"', '_INT = r"([-+]?[0-9]+)"', (NAMES + "parsed]",)),
    Mutation("a clipped edge parsed unclipped too", "shardfs/formats/precomputed_names.py",
             "hi != o + min(p * c + c, s)",
             "hi not in (o + min(p * c + c, s), o + p * c + c)", (NAMES + "parsed]",)),
    Mutation("a misaligned volume name parsed", "shardfs/formats/precomputed_names.py", "if misaligned or not 0",
             "if not 0", (NAMES + "parsed]",)),
    Mutation("grid one cell short", "shardfs/shards/grid.py",
             "return tuple(-(-s // c) for s, c in zip(shape, chunks, strict=True))",
             "return tuple(s // c for s, c in zip(shape, chunks, strict=True))",
             ("tests/mount/test_chunk_names.py::test_the_last_cell_along_each_axis_is_there_and_the_next_is_not",
              BLOCKS + "test_the_grid_ends_where_the_array_does")),
    Mutation("a mesh manifest under any extension", "shardfs/formats/precomputed_dirs.py",
             'if key is None or (dot and ext != "index"):', "if key is None:",
             ("tests/mount/test_chunk_names.py::test_mesh_names_are_the_writers_and_no_other_extension",)),
    Mutation("N5 block header in C order", "shardfs/views/n5.py", "*inside[::-1])", "*inside)",
             (BLOCKS + "test_n5_blocks_read_by_tensorstore_and_zarr2_n5store",
              BLOCKS + "test_n5_headers_name_each_blocks_clipped_shape_fastest_first")),
    Mutation("N5 body read one byte on past the header", "shardfs/views/chunks.py",
             "return self.body.read(offset - n, length, request)",
             "return self.body.read(offset - n + 1, length, request)",
             (BLOCKS + "test_zero_copy_n5_blocks_are_the_header_and_the_stored_chunk",)),
    Mutation("N5 body one byte short of a read that starts in the header", "shardfs/views/chunks.py",
             "max(0, offset + length - n), request)", "max(0, offset + length - n - 1), request)",
             (BLOCKS + "test_zero_copy_n5_blocks_are_the_header_and_the_stored_chunk",)),
    Mutation("N5 zarr edge block along the first axis served unclipped", "shardfs/views/n5.py",
             "inside == self.array.chunks", "inside[1:] == self.array.chunks[1:]",
             (BLOCKS + "test_n5_blocks_read_by_tensorstore_and_zarr2_n5store",)),
    Mutation("zarr2 precomputed edge chunk along z served unpadded", "shardfs/views/zarr2.py",
             "edge_shape(array, pos) == array.chunks", "edge_shape(array, pos)[1:] == array.chunks[1:]",
             (BLOCKS + "test_zarr2_chunks_read_by_tensorstore",)),
    Mutation("N5 block one past the grid", "shardfs/views/n5.py",
             "if any(p >= g for p, g in zip(at, self.grid, strict=False)):",
             "if any(p > g for p, g in zip(at, self.grid, strict=False)):",
             (BLOCKS + "test_the_grid_ends_where_the_array_does",)),
    Mutation("remote mounts with a local mount's session threads", "shardfs/service/daemon.py",
             'options["max_threads"] = str(REMOTE_THREADS)', "pass",
             ("tests/remote/test_remote_concurrency.py::test_sixteen_remote_reads_are_in_flight_at_once",)),
    Mutation("remote mounts given local FUSE options", "shardfs/cli.py", "fuse_options(spec.name, extra, remote)",
             "fuse_options(spec.name, extra)",
             ("tests/remote/test_remote_concurrency.py::test_sixteen_remote_reads_are_in_flight_at_once",)),
    # Issue 21 (the own FUSE session and its cold path): each new place a wrong byte or a lost bound could hide.
    Mutation("a chunk's node id names the next chunk", "shardfs/fs/nodes.py",
             "PACKED | number << self._shift | key", "PACKED | number << self._shift | key + 1",
             ("tests/mount/test_fuse_session.py::test_ls_l_of_131072_chunks_grows_the_daemon_by_directories_not_files",)),
    Mutation("allow_root serves every user", "shardfs/fuse/session.py",
             "if self.owner is not None and uid not in (0, self.owner)", "if False",
             ("tests/mount/test_mounting.py::test_allow_root_serves_root_and_refuses_every_other_user",)),
    Mutation("a cut from the minishard batch one byte late", "shardfs/shards/neuroglancer_kv.py",
             "batch[start - first : stop - first]", "batch[start - first + 1 : stop - first + 1]",
             ("tests/remote/test_remote_cold.py::test_minishard_indexes_side_by_side_cost_one_get",)),
    # Listings (issue 27): a walk ends at its bounds, and a listing is made once for every offset.
    Mutation("remote walks without a deadline", "shardfs/stores/remote.py",
             "await asyncio.wait_for(anext(stream), max(self.started + self.seconds - time.monotonic(), 0))",
             "await anext(stream)",
             ("tests/remote/test_remote_bounds.py::test_df_over_a_listing_of_endless_empty_pages_stops",)),
    Mutation("a listing made again for every offset", "shardfs/fs/bridge.py",
             'return self.tree.cache.get_or_make(("listing", path), make)', "return make()",
             ("tests/unit/test_dir_cursor.py::test_resuming_lists_the_directory_once",)),
    Mutation("remote listings one read at a time", "shardfs/stores/remote.py",
             "    reads_at_once = READS_AT_ONCE", "    reads_at_once = 1",
             ("tests/remote/test_remote_cold.py::test_a_listing_keeps_many_index_reads_in_flight",)),
    Mutation("an unreadable zarr shard hides its directories", "shardfs/shards/zarr_kv.py",
             "return present is None or prefix in present.prefixes",
             "return present is not None and prefix in present.prefixes",
             ("tests/remote/test_remote_cold.py::test_a_shard_the_server_refuses_leaves_its_directories_found_and_its"
              "_chunks_failing",)),
    Mutation("a stopped daemon hangs stats", "shardfs/service/stats_socket.py",
             "        conn.settimeout(ASK_TIMEOUT)", "        conn.settimeout(None)",
             ("tests/service/test_service.py::test_a_stopped_daemon_blocks_neither_stats_nor_list",)),
    # A restart: the requests the killed daemon read are never answered (its readers wait out the test's
    # patience), or the kernel's table ids mean nothing to the next daemon (the half-read listing: ESTALE).
    Mutation("no resend after a restart", "shardfs/fuse/session.py",
             "        if terms.resend:\n            self._resend()", "        if False:\n            self._resend()",
             (RESTART,)),
    Mutation("the node table not restored", "shardfs/fs/nodes.py",
             "            for nodeid, path in record.table().items():", "            for nodeid, path in {}.items():",
             (RESTART,)),
    # The session as a bridge: a held chunk's id leads to its key, never through its name.
    Mutation("a held chunk found through its name", "shardfs/fs/bridge.py",
             "node = self.tree.node(place, request)\n        if",
             "node = self.tree.lookup(self.path_of(place), request)\n        if",
             ("tests/mount/test_fuse_session.py::test_a_held_chunk_is_read_from_its_node_id_with_no_name_made_or_parsed",)),
    Mutation("a LOOKUP in a provider's directory misses its provider", "shardfs/tree.py",
             "Located(path, self._numbers.get(parent.path, parent.number))", "Located(path, parent.number)",
             ("tests/mount/test_fuse_session.py::test_a_lookup_goes_from_its_parents_node_with_no_walk_up_the_path",)),
    Mutation("a hand-over unmounts", "shardfs/fuse/serve.py", "        self.handed_over = True\n",
             "        self.handed_over = True\n        self._take_away()\n",
             ("tests/service/test_restart.py::test_a_replaced_daemon_loses_no_request[keeper-hand over]",)),
    # Issue 27: options checked before mount(2), names and log lines bounded per user, fusermount3's escapes.
    Mutation("timeouts unchecked before mount", "shardfs/fuse/serve.py", "if not 0 <= found < TIMEOUT_LIMIT:",
             "if found < 0:",
             (OPTIONS + "test_a_timeout_the_kernel_cannot_take_is_refused_before_anything_is_mounted"
              "[attr_timeout=nan]",)),
    Mutation("a failure after mount(2) leaves the mount", "shardfs/fuse/serve.py",
             "        except BaseException:\n            take_away()",
             "        except BaseException:\n            pass",
             (OPTIONS + "test_a_failure_after_mount_takes_the_mount_away",)),
    Mutation("names over 255 bytes tried on the source", "shardfs/fuse/session.py",
             "entry = None if name > NAME_MAX else", "entry = None if False else",
             (OPTIONS + "test_names_too_long_for_linux_are_absent_and_one_users_errors_leave_the_others_logged",)),
    Mutation("one log budget for every user", "shardfs/logs.py", "key = (record.levelno, _event(record), uid, mount)",
             "key = (record.levelno, _event(record), None, mount)",
             (OPTIONS + "test_names_too_long_for_linux_are_absent_and_one_users_errors_leave_the_others_logged",)),
    Mutation("fsname unescaped for fusermount3", "shardfs/fuse/mount.py",
             'return value.replace("\\\\", "\\\\\\\\").replace(",", "\\\\,")', "return value",
             (OPTIONS + "test_a_source_path_ending_in_a_backslash_mounts_as_shardfs_through_fusermount3",)),
    # Issue 33, class 1: options against a second user and against their zero values.
    Mutation("allow_root's owner taken as root", "shardfs/fuse/serve.py", "owner = os.getuid() if allow_root else None",
             "owner = 0 if allow_root else None",
             (OPTIONS + "test_allow_root_on_a_users_mount_serves_that_user_and_root_and_no_one_else",)),
    Mutation("uid=0 taken as unset", "shardfs/fs/bridge.py",
             "uid = owner.uid if shown.uid is None else shown.uid", "uid = shown.uid or owner.uid", (ZEROS,)),
    Mutation("umask=0 taken as unset", "shardfs/fs/bridge.py", "if shown.umask is not None:", "if shown.umask:",
             (ZEROS,)),
    Mutation("write bits carried through", "shardfs/stores/protocol.py",
             "bits = 0o555 if stat.S_ISDIR(st.st_mode) else 0o444",
             "bits = 0o777 if stat.S_ISDIR(st.st_mode) else 0o666",
             (ZEROS,)),
    # INTERRUPT of a request that waits on the network (issue 42): answered at once, a spare thread in its place.
    Mutation("an interrupted wait answered only once the server has", "shardfs/fuse/session.py",
             "        if not request.interrupt():\n            return", "        if True:\n            return",
             (SPARE, "tests/remote/test_remote_interrupt.py::"
              "test_a_killed_readers_request_is_answered_at_once_and_a_spare_thread_serves_meanwhile")),
    Mutation("no spare for a thread that waits", "shardfs/fuse/session.py",
             "spare = request.waiting and", "spare = False and", (SPARE,)),
    Mutation("spares without bound", "shardfs/fuse/session.py",
             "len(self._spared) < self.threads", "True", (SPARE,)),
    Mutation("spares never end", "shardfs/fuse/session.py", "                self._retiring += 1\n", "", (SPARE,)),
    Mutation("a late answer of the server served", "shardfs/stores/remote.py",
             "    if not answered:\n        raise _interrupted()", "", (SPARE,)),
    Mutation("attr_timeout given as entry_timeout", "shardfs/fuse/session.py",
             "self._entry_valid = (*_split(timeouts.entry), *_split(timeouts.attr))",
             "self._entry_valid = (*_split(timeouts.entry), *_split(timeouts.entry))", (TIMED,)),
    Mutation("fractions of timeouts as microseconds", "shardfs/fuse/session.py",
             "return whole, int((seconds - whole) * 1e9)", "return whole, int((seconds - whole) * 1e6)", (TIMED,)),
    # Issue 33, class 2: mount flags.
    Mutation("noexec clears the flag", "shardfs/fuse/mount.py", '"noexec": (MS_NOEXEC, True),',
             '"noexec": (MS_NOEXEC, False),', (FLAGS + "[noexec,noatime-mount(2)]",)),
    Mutation("a later contrary flag ignored", "shardfs/fuse/mount.py", "flags = flags | flag if on else flags & ~flag",
             "flags = flags | flag if on else flags", (FLAGS + "[noexec,noatime,exec,atime-mount(2)]",)),
    Mutation("root's mounts without nosuid", "shardfs/fuse/mount.py", "flags = MS_NOSUID | MS_NODEV |",
             "flags = MS_NODEV |", (FLAGS + "[default-mount(2)]",)),
    # Issue 33, class 3: the protocol at its boundaries.
    Mutation("init_out of 64 bytes for 7.22", "shardfs/fuse/session.py", "reply if minor >= 23 else",
             "reply if minor >= 22 else", (PROTOCOL + "test_init_answers_each_minor_in_the_layout_it_reads[22-24]",)),
    Mutation("init_out of 24 bytes for 7.23", "shardfs/fuse/session.py", "reply if minor >= 23 else",
             "reply if minor >= 24 else", (PROTOCOL + "test_init_answers_each_minor_in_the_layout_it_reads[23-64]",)),
    Mutation("7.12 refused", "shardfs/fuse/wire.py", "MIN_MINOR = 12", "MIN_MINOR = 13",
             (PROTOCOL + "test_init_answers_each_minor_in_the_layout_it_reads[12-24]",)),
    Mutation("7.11 taken", "shardfs/fuse/wire.py", "MIN_MINOR = 12", "MIN_MINOR = 11",
             (PROTOCOL + "test_init_of_a_kernel_older_than_7_12_is_refused",)),
    Mutation("a FORGET counts one lookup", "shardfs/fs/nodes.py", "left = self._counts.get(nodeid, 0) - times",
             "left = self._counts.get(nodeid, 0) - 1", (FORGETS,)),
    Mutation("a BATCH_FORGET forgets its first node only", "shardfs/fuse/session.py", "for i in range(number):",
             "for i in range(min(number, 1)):", (FORGETS,)),
    Mutation("STATFS shows the files free", "shardfs/fuse/session.py", "pack(blocks, 0, 0, files, 0,",
             "pack(blocks, 0, 0, files, files,",
             (PROTOCOL + "test_df_i_and_stat_f_show_the_sources_files_and_the_mounts_units",)),
    Mutation("any character device taken for /dev/fuse", "shardfs/fuse/mount.py",
             "if not stat.S_ISCHR(st.st_mode) or st.st_rdev != FUSE_DEVICE:", "if not stat.S_ISCHR(st.st_mode):",
             (PROTOCOL + "test_dev_fd_n_of_another_character_device_is_refused_in_one_line[/dev/null]",)),
    # Issue 42: a host keeps each connection for the next daemon of a CSI volume or a Slurm job's dataset.
    Mutation("a held connection taken for ended", "shardfs/host/held.py", "if held and _ended(held[0]):",
             "if held:", ("tests/deploy/test_slurm.py::test_a_jobs_daemon_killed_is_replaced_and_the_job_reads_on",)),
    # Issue 33, class 4: remote edges.
    Mutation("401 taken for a failure", "shardfs/stores/remote.py",
             "except (PermissionDeniedError, UnauthenticatedError) as e:", "except PermissionDeniedError as e:",
             (EDGES + "test_a_refusal_is_eacces_whether_unauthenticated_or_forbidden[401]",)),
    Mutation("URL passwords redacted up to their first @", "shardfs/logs.py", r'[^/\s?#]+@")', r'[^/\s?#@]+@")',
             (EDGES + "test_a_password_of_url_special_characters_shows_nowhere[as typed]",)),
    # (Dropping the empty minishard's early return is equivalent: a read of no bytes sends no request.)
    Mutation("a small shard index read entry by entry", "shardfs/shards/neuroglancer_kv.py",
             "SHARD_INDEX_READ = 64 << 10", "SHARD_INDEX_READ = 64",
             (EDGES + "test_a_key_whose_minishard_is_empty_costs_the_shard_index_alone",)),
    Mutation("shards listed in the store's order", "shardfs/shards/neuroglancer_kv.py",
             "for found in sorted(found for found in named if found is not None):",
             "for found in (found for found in named if found is not None):",
             (EDGES + "test_a_remote_listing_over_many_shards_is_in_the_local_order_and_stable",
              "tests/cli/test_kv_listing.py::test_keys_list_shard_by_shard_in_the_order_of_their_numbers_from_any_store")),
    Mutation("a listed name gives nothing back", "shardfs/shards/neuroglancer_kv.py",
             "budget.refund(LISTING_READ * listed)", "budget.refund(0)",
             (EDGES + "test_a_listing_spends_its_budget_and_each_name_gives_some_back[1]",)),
    Mutation("a minishard gives back one name's worth", "shardfs/shards/neuroglancer_kv.py",
             "budget.refund(LISTING_READ * listed)", "budget.refund(LISTING_READ * min(listed, 1))",
             (EDGES + "test_a_listing_spends_its_budget_and_each_name_gives_some_back[2]",)),
    Mutation("stats and list look at the mount", "shardfs/service/stats_socket.py",
             "socket_path(directory, Path(found.point), real=True)", "socket_path(directory, mountpoint)",
             ("tests/service/test_service.py::test_a_stopped_daemon_blocks_neither_stats_nor_list[root asked for]",)),
    # Issue 33, class 5: odd values through the views, and df.
    Mutation("N5 fill compared by value", "shardfs/views/n5.py",
             "self.filled = any(np.asarray(array.fill_value, array.dtype).tobytes())",
             "self.filled = array.fill_value != 0",
             (ODD + "test_non_finite_and_negative_zero_fills_through_n5",)),
    Mutation("zarr2 non-finite fills written as numbers", "shardfs/views/zarr2.py",
             "if isinstance(value, float) and not math.isfinite(value):", "if False:",
             (ODD + "test_non_finite_and_negative_zero_fills_through_zarr2",)),
    Mutation("df follows links", "shardfs/stores/local.py",
             "st = os.stat(name, dir_fd=at, follow_symlinks=False)", "st = os.stat(name, dir_fd=at)",
             (ODD + "test_df_counts_only_the_sources_regular_files",)),
    Mutation("df counts FIFOs, sockets and devices", "shardfs/stores/local.py",
             "                    if stat.S_ISREG(st.st_mode):\n                        yield st.st_size",
             "                    if True:\n                        yield st.st_size",
             (ODD + "test_df_counts_only_the_sources_regular_files",)),
    # Issue 41: the N5 view as N5 viewers read it.
    Mutation("N5 level's pixelResolution its own size, so viewers count the downsampling twice",
             "shardfs/views/n5.py", "[number(s) for s in base or size]", "[number(s) for s in size]",
             (N5 + "test_a_precomputed_pyramid_opens_as_one_multiscale[uint8-raw]",
              N5 + "test_an_ome_zarr_image_opens_as_one_multiscale")),
    Mutation("N5 pixelResolution of one unit over mixed units", "shardfs/views/n5.py",
             "if unit}) <= 1:", "if unit}) <= 2:",
             (N5 + "test_mixed_units_give_no_single_unit_and_levels_keep_their_size",)),
    Mutation("a dataset in a directory names its files from the directory's root", "shardfs/stores/beneath.py",
             "path=file.path[len(self.directory) + 1 :]", "path=file.path", (COLLECTION,)),
    Mutation("datasets in a directory share cache keys", "shardfs/cache.py",
             'get_or_make(("dataset", self.scope, key)', 'get_or_make(("dataset", key)', (COLLECTION,)),
    Mutation("the innermost dataset decides", "shardfs/collection.py",
             "(not itself), DEPTH) + 1):", "(not itself), DEPTH) + 1)[::-1]:",
             (COLLECTION, "tests/mount/test_collection.py::test_a_view_applies_to_each_dataset[n5]")),
    Mutation("a directory's metadata names asked one after the other", "shardfs/source.py",
             "partial(store.is_file, marker) if pool is None else pool.submit(store.is_file, marker).result",
             "partial(store.is_file, marker)",
             ("tests/mount/test_collection.py::test_the_metadata_names_of_a_directory_are_asked_for_at_once",)),
    Mutation("a prefix named like a metadata file taken for one", "shardfs/source.py",
             "pool.submit(store.is_file, marker).result", "pool.submit(store.type_of, marker).result",
             ("tests/mount/test_collection.py::test_a_bucket_directory_is_judged_by_one_head_a_metadata_name",)),
    Mutation("a dataset that cannot be opened taken for no dataset", "shardfs/collection.py",
             "                    what = e\n", "                    what = None\n", (INFO,)),
    Mutation("an OME-Zarr image named a zarr v3 group", "shardfs/formats/zarr.py",
             'if node_type == "group" and isinstance(ome, dict):', "if False:", (INFO,)),
    # Issue 43, items 1 and 2: chunks below a directory of datasets have packed ids, their directories' numbers
    # journalled for the next daemon; its open datasets bounded by what they hold.
    Mutation("chunks below a directory of datasets get table ids", "shardfs/collection.py",
             "return Located(path, None) if number is None else (number, place[1])", "return Located(path, None)",
             (NUMBERED, "tests/mount/test_collection.py::test_chunks_below_a_directory_of_datasets_cost_the_daemon_"
              "nothing_a_file")),
    Mutation("a directory's number not journalled", "shardfs/collection.py",
             "self._journal(directory)  # before any id names it", "pass", (NUMBERED, HELD + "replaced[keeper]")),
    Mutation("open datasets bounded by their count alone", "shardfs/collection.py",
             "(tree, min(max(held, OPEN_BYTES // OPEN), OPEN_BYTES))", "(tree, OPEN_BYTES // OPEN)",
             ("tests/mount/test_collection.py::test_the_datasets_kept_open_are_bounded_by_the_bytes_they_hold",)),
    # Issue 44, class 1: the restart record (a record cut at any point of a write reads as before or after; no
    # id is issued twice across daemons) and resend (counted only where the kernel marks it; its bit fuse.h's).
    Mutation("a rewritten journal forgets the highest id", "shardfs/fuse/record.py",
             "parts = [ENTRY.pack(self.highest, DROPPED)]", "parts = []", (IDS,)),
    Mutation("the highest id not read back", "shardfs/fuse/record.py",
             "            self.highest = max(self.highest, nodeid)\n            if", "            if", (IDS,)),
    Mutation("a journal's span written before its entry", "shardfs/fuse/record.py",
             "        os.pwrite(self.fd, entry, self._end)\n        self._end += len(entry)\n"
             "        os.pwrite(self.fd, SPAN.pack(self._start, self._end), SPAN_AT)",
             "        os.pwrite(self.fd, SPAN.pack(self._start, self._end + len(entry)), SPAN_AT)\n"
             "        os.pwrite(self.fd, entry, self._end)\n        self._end += len(entry)", (CUT,)),
    Mutation("a rewritten journal's span written before its bytes", "shardfs/fuse/record.py",
             "        os.pwrite(self.fd, data, start)\n        self._start, self._end = start, start + len(data)\n"
             "        os.pwrite(self.fd, SPAN.pack(self._start, self._end), SPAN_AT)",
             "        self._start, self._end = start, start + len(data)\n"
             "        os.pwrite(self.fd, SPAN.pack(self._start, self._end), SPAN_AT)\n"
             "        os.pwrite(self.fd, data, start)", (CUT,)),
    Mutation("the terms' length written before the terms", "shardfs/fuse/record.py",
             "os.pwrite(self.fd, data, at)\n"
             '        os.pwrite(self.fd, struct.pack("=I", len(data)), length_at)',
             'os.pwrite(self.fd, struct.pack("=I", len(data)), length_at)\n'
             "        os.pwrite(self.fd, data, at)",
             (CUT,)),
    Mutation("every request counted as resent", "shardfs/fuse/session.py", "if unique & wire.UNIQUE_RESEND:",
             "if unique:", (PROTOCOL + "test_only_requests_the_kernel_marks_resent_are_counted_resent",)),
    Mutation("FUSE_HAS_RESEND at bit 38", "shardfs/fuse/wire.py", "HAS_RESEND = 1 << (39 - 32)",
             "HAS_RESEND = 1 << (38 - 32)", (FUSE_H,)),
    Mutation("FUSE_PARALLEL_DIROPS at bit 19", "shardfs/fuse/wire.py", "PARALLEL_DIROPS = 1 << 18",
             "PARALLEL_DIROPS = 1 << 19", (FUSE_H,)),
    Mutation("FUSE_NO_OPEN_SUPPORT at bit 16", "shardfs/fuse/wire.py", "NO_OPEN_SUPPORT = 1 << 17",
             "NO_OPEN_SUPPORT = 1 << 16", (FUSE_H,)),
    # Issue 44, class 2: the keeper names a mount by its real path, however it was named.
    Mutation("a keeper entry named by the mountpoint as given", "shardfs/service/handover.py",
             "KeeperCarrier(link, str(mount_name(mountpoint)), serves)", "KeeperCarrier(link, str(mountpoint), serves)",
             (LINKED,)),
    Mutation("a linked mountpoint named by its link", "shardfs/service/handover.py",
             "path = Path(os.path.normpath(path.parent / os.readlink(path)))", "return path",
             (LINKED,)),
    Mutation("a mountpoint's linked parent left unresolved", "shardfs/service/handover.py",
             "path = Path(os.path.realpath(path.parent)) / path.name", "path = Path(os.path.abspath(path))",
             (LINKED,)),
    # Issue 44, class 3: CSI isolation and validation.
    Mutation("a daemon shared by secrets with the same keys", "shardfs/host/supervisor.py",
             "d.secrets == secrets)", "d.secrets.keys() == secrets.keys())",
             (TENANTS,)),
    Mutation("a daemon shared by secrets with the same key id", "shardfs/host/supervisor.py",
             "d.secrets == secrets)", 'd.secrets.get("AWS_ACCESS_KEY_ID") == secrets.get("AWS_ACCESS_KEY_ID"))',
             (TENANTS,)),
    Mutation("a daemon's environment inherits the plugin's", "shardfs/host/supervisor.py",
             "self.env = {**DAEMON_ENV,", "self.env = {**os.environ, **DAEMON_ENV,",
             (TENANTS,)),
    Mutation("a relative target_path accepted", "shardfs/csi/server.py", "if not os.path.isabs(target_path):",
             "if False:", (CSI + "test_a_relative_target_is_refused_as_not_absolute",)),
    Mutation("a take-down stops after one stacked mount", "shardfs/host/publisher.py", "for _ in range(16):",
             "for _ in range(1):", (CSI + "test_unpublish_takes_down_every_mount_stacked_at_the_target",)),
    Mutation("a boolean attribute takes any word for false", "shardfs/options.py",
             "    if text.lower() not in TRUE_FALSE:", '    return text.lower() == "true"\n    if False:',
             (CSI + "test_a_volume_that_cannot_work_is_refused_naming_what",)),
    Mutation("a rotated secret taken for another volume", "shardfs/host/publisher.py",
             "known.spec != spec:", "known.spec != spec or known.secrets != secrets:",
             (TENANTS,)),
    # Issue 44, class 4: a job's Epilog ends its own mounts, not those of a job whose id it prefixes.
    Mutation("an Epilog ends the mounts of every job its id prefixes", "shardfs/slurm.py",
             'point.startswith(f"{args.job_dir}/")', "point.startswith(str(args.job_dir))",
             ("tests/deploy/test_slurm.py::test_job_7s_epilog_leaves_the_mount_of_job_70_on_the_same_node",)),
    # Issue 44, class 5: bounds at their edges.
    Mutation("a listing's bytes of names counted in names", "shardfs/fuse/listing.py", "self.nbytes += len(name)",
             "self.nbytes += 1", (CURSOR + "test_each_listing_bound_holds_at_its_value_and_cuts_one_past_it",)),
    Mutation("a walk's bytes of names counted in objects", "shardfs/stores/remote.py",
             'self.nbytes += sum(len(meta["path"]) for meta in page)', "self.nbytes += len(page)",
             (WALK + "test_a_walk_gathers_names_up_to_its_bytes_not_its_objects",)),
    Mutation("a walk's deadline one --timeout", "shardfs/stores/remote.py", "LISTING_TIMEOUTS = 4",
             "LISTING_TIMEOUTS = 1",
             (WALK + "test_a_walk_lasts_four_timeouts_to_the_page",)),
    Mutation("a walk's deadline five --timeout", "shardfs/stores/remote.py", "LISTING_TIMEOUTS = 4",
             "LISTING_TIMEOUTS = 5",
             (WALK + "test_a_walk_lasts_four_timeouts_to_the_page",)),
    Mutation("a 255-byte name refused", "shardfs/fuse/session.py", "name > NAME_MAX", "name >= NAME_MAX",
             (PROTOCOL + "test_names_of_254_and_255_bytes_are_looked_up_and_256_is_absent_unasked",)),
    Mutation("a 256-byte name looked up", "shardfs/fuse/session.py", "name > NAME_MAX", "name > NAME_MAX + 1",
             (PROTOCOL + "test_names_of_254_and_255_bytes_are_looked_up_and_256_is_absent_unasked",)),
    Mutation("a timeout of 2^64 s accepted", "shardfs/fuse/serve.py", "if not 0 <= found < TIMEOUT_LIMIT:",
             "if not 0 <= found <= TIMEOUT_LIMIT:",
             (PROTOCOL + "test_the_largest_timeout_is_the_last_below_2_to_the_64",)),
    Mutation("a listing's memory counted as its length", "shardfs/fuse/listing.py",
             "return sys.getsizeof(self.dirents) + sys.getsizeof(self.starts)",
             "return len(self.dirents) + len(self.starts)", (CURSOR + "test_a_listing_costs_the_memory_it_holds",)),
    Mutation("a log window restarts without its count", "shardfs/logs.py", "w.start, w.count = now, 0", "w.start = now",
             (WINDOWS,)),
    Mutation("a log window restarts once and never again", "shardfs/logs.py", "w.start, w.count = now, 0",
             "w.count = 0", (WINDOWS,)),
    Mutation("a log window one tick long", "shardfs/logs.py", "if now - w.start >= self.window:",
             "if now - w.start > self.window:",
             (WINDOWS,)),
    # Issue 44, class 6: view metadata.
    Mutation("an OME-Zarr image at the root not found", "shardfs/views/zarr2.py",
             'above = [""] + [path[:i]', "above = [path[:i]", (OME_ROOT,)),
    Mutation("an OME-Zarr 0.5 image not found as one", "shardfs/views/zarr2.py",
             'OME_KEYS = ("ome", "multiscales",', 'OME_KEYS = ("multiscales",',
             (OME_ROOT,)),
    # Issue 44, class 7: files never executable, minishard batches of full rows only, a listing's order kept.
    Mutation("remote files shown executable", "shardfs/fs/bridge.py",
             "mode = owner.mode if file_type == stat.S_IFDIR else owner.mode & 0o444", "mode = owner.mode",
             ("tests/remote/test_remote_http.py::test_precomputed_over_http_reads_as_unsharded",)),
    Mutation("a minishard batch counts empty rows", "shardfs/shards/neuroglancer.py",
             "used = non_empty(rows)\n    if len(used) < 2", "used = rows\n    if len(used) < 2",
             ("tests/remote/test_remote_cold.py::test_minishard_indexes_side_by_side_among_empty_minishards_cost_one_get",)),
    Mutation("a listing's reads yielded newest first while more are asked", "shardfs/shards/listing.py",
             "popleft().result()\n            budget", "pop().result()\n            budget",
             ("tests/cli/test_kv_listing.py::test_reads_in_flight_come_back_in_the_order_asked_while_more_are_still_asked",)),
]  # fmt: skip


def copy_tree(where: Path) -> Path:
    """A copy of the repository's files, with an interpreter of its own: a venv whose only path entries are the
    copy, then the project's installed packages. Daemons started `python -I` (the CSI and Slurm hosts'), which
    ignore PYTHONPATH, then run the copy's shardfs too, not the editable install's."""
    tree = where / "tree"
    shutil.copytree(REPO, tree, ignore=SKIP)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tree / ".venv"], check=True)
    paths = subprocess.run([python(tree), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    installed = sysconfig.get_paths()["purelib"]  # the project's venv; its .pth files (the editable) are not read
    Path(paths, "shardfs-mutated.pth").write_text(f"{tree}\n{installed}\n")
    (tree / ".venv-zarr2").symlink_to(REPO / ".venv-zarr2")
    return tree


def python(tree: Path) -> Path:
    return tree / ".venv" / "bin" / "python"


def apply(tree: Path, mutation: Mutation) -> None:
    path = tree / mutation.file
    text = path.read_text()
    if text.count(mutation.original) != 1:
        sys.exit(
            f"mutate: {mutation.file}: {mutation.original!r} occurs {text.count(mutation.original)} times, not once"
        )
    path.write_text(text.replace(mutation.original, mutation.replacement))


def pytest(tree: Path, tests: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    """The tests, run in tree with tree's shardfs first on the path (the daemon inherits it)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    command = [python(tree), "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *tests]
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)


def imports_from(tree: Path) -> Path:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([python(tree), "-c", "import shardfs; print(shardfs.__file__)"], cwd=tree, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return Path(done.stdout.strip())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", dest="only", action="append", default=[],
                   help="only the mutations whose name contains this text (repeatable: any of them)")  # fmt: skip
    args = p.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or any(text in m.name for text in args.only)]
    scratch = Path(tempfile.mkdtemp(prefix="shardfs-mutate-"))
    scratch.chmod(0o755)  # tests run parts as an unprivileged user, who must reach the copy
    try:
        tree = copy_tree(scratch / "baseline")
        if not imports_from(tree).is_relative_to(tree):
            print(f"mutate: the copy's tests would not import the copy's shardfs ({imports_from(tree)})")
            return 2
        tests = sorted({t for m in chosen for t in m.tests})
        baseline = pytest(tree, tests)
        if baseline.returncode != 0:
            print(baseline.stdout[-3000:], baseline.stderr[-2000:], sep="\n")
            print("mutate: the named tests fail on the unmutated tree; fix them first")
            return 2
        print(f"baseline: {len(tests)} tests pass on the unmutated tree")
        survivors = []
        for i, mutation in enumerate(chosen):
            tree = copy_tree(scratch / str(i))
            apply(tree, mutation)
            started = time.monotonic()
            done = pytest(tree, list(mutation.tests), "-x")
            # pytest exits 1 when a test failed; 0 is a survivor, and anything else (no such test) kills nothing
            verdict = {0: "SURVIVED", 1: "KILLED"}.get(done.returncode, f"ERROR (pytest exit {done.returncode})")
            if verdict != "KILLED":
                survivors.append(mutation.name)
            where = f"{mutation.file}: {mutation.original.strip()!r} -> {mutation.replacement.strip()!r}"
            print(f"{verdict:9} {mutation.name} ({time.monotonic() - started:.0f} s)\n          {where}")
            failed = next((ln for ln in done.stdout.splitlines() if ln.startswith("FAILED ")), "")
            print(f"          by {failed[len('FAILED ') :]}" if failed else "", end="\n" if failed else "", flush=True)
            shutil.rmtree(tree, ignore_errors=True)
        print(f"{len(chosen)} mutations: {len(chosen) - len(survivors)} killed, {len(survivors)} survived")
        for name in survivors:
            print(f"  survived: {name}")
        return 1 if survivors else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
