"""`shardfs check SOURCE`: read every shard index of a source before it is exposed.

A mount meets corruption one read at a time, as EIO and a log line; an operator wants to know
beforehand, with the shard named. So every index a read could need is read here, through the same
code a mount uses: shard and minishard indexes (gzip ones decoded), zarr indexes at every nesting
level with their crc32c, whole-shard codecs undone. Every chunk's byte range is checked against its
file; chunk data is not read (precomputed has no checksum over it). One shard's indexes are held at
a time, and the shared cache bounds what is kept.

`--deep` then reads every chunk as a reader would and decodes it: an array's chunks to their values (gzip,
zstd, blosc, jpeg, compressed_segmentation, ...), every other chunk file (meshes, skeletons, annotations)
whole, through the same tree a mount serves. It costs a read of the whole dataset.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator

from shardfs.errors import CorruptChunk
from shardfs.formats.plan import Array, Category
from shardfs.request import OWN
from shardfs.shards.kv import ShardedKV, ShardFile, ShardReport
from shardfs.source import Source
from shardfs.views.chunks import decoded


def check(source: Source, progress: bool, deep: bool = False) -> int:
    """Check every shard of every sharded directory and print what was found; 1 if any shard is corrupt
    (or, deep, any chunk does not decode). The progress bar goes to stderr, and only when asked (on a
    terminal), so piped output stays clean."""
    from tqdm import tqdm  # here: every command imports this module, and tqdm's import costs each 0.06 s

    work = []
    for directory, provider in sorted(source.providers.items()):
        if provider.kv is not None:  # not sharded: nothing to check
            work.append((directory, provider.kind, provider.kv, shards_of(provider.kv)))
    shard_total = chunk_total = corrupt_total = 0
    with tqdm(total=sum(len(w[3]) for w in work), unit="shard", disable=not progress, file=sys.stderr) as bar:
        for directory, kind, kv, shards in work:
            bar.set_description(directory or ".", refresh=False)
            chunks, corrupt = 0, []
            for shard in shards:
                try:
                    report = kv.verify(shard)
                except OSError as e:  # unreadable, or not a regular file where a shard should be
                    report = ShardReport()
                    report.add(f"cannot be read: {e.strerror or e}")
                chunks += report.chunks
                if report.count:
                    corrupt.append(f"  {shard.path}: {report}")
                bar.update()
            shard_total += len(shards)
            chunk_total += chunks
            corrupt_total += len(corrupt)
            line = f"{directory or '.'}/: {kind}: {plural(len(shards), 'shard file')}, {plural(chunks, 'chunk')}"
            for text in (f"{line}, {len(corrupt)} corrupt", *corrupt):
                tqdm.write(text, file=sys.stdout)  # clears the bar first, so the two never mix on a terminal
    undecoded = decode_all(source, progress, chunk_total) if deep else 0
    refused = [found.text for found in source.report if found.category is Category.REFUSED]
    for why in refused:
        print(f"not checked: {why}")
    for found in source.report:
        if found.category is Category.WARNING:
            print(found)
    print(
        f"{'CORRUPT' if corrupt_total else 'OK'}: {plural(len(work), 'sharded directory', 'sharded directories')},"
        f" {plural(shard_total, 'shard file')}, {plural(chunk_total, 'chunk')}, {corrupt_total} corrupt"
        + (f", {undecoded} chunk(s) that do not decode" if deep else "")
        + (f", {len(refused)} not checked (served as stored)" if refused else "")
    )
    return 1 if corrupt_total or undecoded else 0


def check_each(source: Source, opened: Callable[[str], Source], progress: bool, deep: bool = False) -> int:
    """`check` of a source that is a directory of datasets: each dataset it holds (Collection.datasets), opened
    by opened from its path in it, checked as a source of its own, under a line naming it; 1 if any is corrupt."""
    status = checked = 0
    for dataset, what in source.collection.datasets():  # type: ignore[union-attr]
        if not isinstance(what, str):
            continue  # no dataset opens there: its files are served as stored (`info` says why)
        print(f"{dataset}/")
        status = max(status, check(opened(dataset), progress, deep))
        checked += 1
    print(f"{'CORRUPT' if status else 'OK'}: {plural(checked, 'dataset')} checked")
    return status


def decode_all(source: Source, progress: bool, total: int) -> int:
    """Read and decode every chunk of every sharded directory; print each that fails (its path and why),
    and return how many did."""
    from tqdm import tqdm

    failed = 0
    with tqdm(total=total, unit="chunk", disable=not progress, file=sys.stderr) as bar:
        for directory, provider in sorted(source.providers.items()):
            if provider.kv is None:
                continue
            bar.set_description(f"decoding {directory or '.'}", refresh=False)
            array = source.arrays.get(directory)
            chunks = _array_chunks(array) if array is not None else _files(source, directory)
            for where, read in chunks:
                try:
                    read()
                except (CorruptChunk, OSError, ValueError) as e:
                    failed += 1
                    why = e.reason if isinstance(e, CorruptChunk) else str(e)
                    tqdm.write(f"  {directory or '.'}/{where}: does not decode: {why}", file=sys.stdout)
                bar.update()
    return failed


def _array_chunks(array: Array) -> Iterator[tuple[str, Callable[[], object]]]:
    for pos in array.stored(()):
        stored = array.chunk(pos, OWN)
        if stored is not None:
            yield f"chunk {list(pos)}", functools.partial(decoded, array, pos, stored)


def _files(source: Source, directory: str) -> Iterator[tuple[str, Callable[[], object]]]:
    """Every file below a sharded directory, read whole as a reader of the mount would."""
    pending = [directory]
    while pending:
        at = pending.pop()
        for name, is_dir in source.tree.listdir(at):
            path = f"{at}/{name}" if at else name
            if is_dir:
                pending.append(path)
            else:
                node = source.tree.lookup(path)
                yield path[len(directory) :].lstrip("/"), functools.partial(node.read, 0, node.size())


def shards_of(kv: ShardedKV) -> list[ShardFile]:
    """A sharded directory's shard files, listed first, so the bar has a total; sorted, so reports compare."""
    return sorted(kv.shards(), key=lambda shard: shard.path)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
