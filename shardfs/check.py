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
from dataclasses import dataclass, field

from shardfs.errors import CorruptChunk
from shardfs.formats.plan import Array
from shardfs.formats.precomputed import ChunkDir
from shardfs.formats.zarr import ZarrArray
from shardfs.shards.neuroglancer import ShardedKV
from shardfs.source import Source
from shardfs.tree import Provider
from shardfs.views.chunks import decoded

SHOWN = 3  # problems spelled out per shard; the rest are counted, since one bad minishard may hold thousands


@dataclass
class Problems:
    """What is wrong with one shard: the first few in words, and how many in all."""

    first: list[str] = field(default_factory=list)
    count: int = 0

    def add(self, what: str) -> None:
        self.count += 1
        if len(self.first) < SHOWN:
            self.first.append(what)

    def __str__(self) -> str:
        more = self.count - len(self.first)
        return "; ".join(self.first) + (f" (and {more} more)" if more else "")


ShardCheck = Callable[[str], tuple[int, Problems]]  # shard path -> (sound chunks, problems)


def check(source: Source, progress: bool, deep: bool = False) -> int:
    """Check every shard of every sharded directory and print what was found; 1 if any shard is corrupt
    (or, deep, any chunk does not decode). The progress bar goes to stderr, and only when asked (on a
    terminal), so piped output stays clean."""
    from tqdm import tqdm  # here: every command imports this module, and tqdm's import costs each 0.06 s

    work = []
    for directory, provider in sorted(source.providers.items()):
        found = shards_of(provider)
        if found is not None:  # not sharded: nothing to check
            work.append((directory, provider.kind, *found))
    shard_total = chunk_total = corrupt_total = 0
    with tqdm(total=sum(len(w[2]) for w in work), unit="shard", disable=not progress, file=sys.stderr) as bar:
        for directory, kind, paths, check_shard in work:
            bar.set_description(directory or ".", refresh=False)
            chunks, corrupt = 0, []
            for path in paths:
                try:
                    found, problems = check_shard(path)
                except OSError as e:  # unreadable, or not a regular file where a shard should be
                    found, problems = 0, Problems()
                    problems.add(f"cannot be read: {e.strerror or e}")
                chunks += found
                if problems.count:
                    corrupt.append(f"  {path}: {problems}")
                bar.update()
            shard_total += len(paths)
            chunk_total += chunks
            corrupt_total += len(corrupt)
            line = f"{directory or '.'}/: {kind}: {plural(len(paths), 'shard file')}, {plural(chunks, 'chunk')}"
            for text in (f"{line}, {len(corrupt)} corrupt", *corrupt):
                tqdm.write(text, file=sys.stdout)  # clears the bar first, so the two never mix on a terminal
    undecoded = decode_all(source, progress, chunk_total) if deep else 0
    refused = [kind.removeprefix("refused: ") for kind in source.kinds if kind.startswith("refused: ")]
    for why in refused:
        print(f"not checked: {why}")
    for kind in source.kinds:
        if kind.startswith("warning: "):
            print(kind)
    print(
        f"{'CORRUPT' if corrupt_total else 'OK'}: {plural(len(work), 'sharded directory', 'sharded directories')},"
        f" {plural(shard_total, 'shard file')}, {plural(chunk_total, 'chunk')}, {corrupt_total} corrupt"
        + (f", {undecoded} chunk(s) that do not decode" if deep else "")
        + (f", {len(refused)} not checked (served as stored)" if refused else "")
    )
    return 1 if corrupt_total or undecoded else 0


def decode_all(source: Source, progress: bool, total: int) -> int:
    """Read and decode every chunk of every sharded directory; print each that fails (its path and why),
    and return how many did."""
    from tqdm import tqdm

    failed = 0
    with tqdm(total=total, unit="chunk", disable=not progress, file=sys.stderr) as bar:
        for directory, provider in sorted(source.providers.items()):
            if shards_of(provider) is None:
                continue
            bar.set_description(f"decoding {directory or '.'}", refresh=False)
            array = source.arrays.get(directory)
            chunks = _array_chunks(array) if array is not None else _files(source, directory)
            for where, read in chunks:
                try:
                    read()
                except (CorruptChunk, OSError, ValueError) as e:
                    failed += 1
                    why = reason(e) if isinstance(e, CorruptChunk) else str(e)
                    tqdm.write(f"  {directory or '.'}/{where}: does not decode: {why}", file=sys.stdout)
                bar.update()
    return failed


def _array_chunks(array: Array) -> Iterator[tuple[str, Callable[[], object]]]:
    for pos in array.stored(()):
        stored = array.chunk(pos)
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


def shards_of(provider: Provider) -> tuple[list[str], ShardCheck] | None:
    """A sharded directory's shard files (listed first, so the bar has a total; sorted, so reports compare)
    and how to check one; None for a provider that is not sharded."""
    if isinstance(provider, ChunkDir):
        kv = provider.kv
        shards = {path: shard for shard, path in kv.shards()}
        return sorted(shards), lambda path: check_precomputed(kv, shards[path])
    if isinstance(provider, ZarrArray):
        paths = sorted(provider._shard_files(()))
        if not provider.keys.ndim:  # a 0-d array's one shard path is named whether or not it is there
            paths = [p for p in paths if provider.store.kind(p) == "file"]
        return paths, lambda path: check_zarr(provider, path)
    return None


def check_precomputed(kv: ShardedKV, shard: int) -> tuple[int, Problems]:
    """Every non-empty minishard index is decoded; each key must hash to where it is stored (else no read
    finds it) and its bytes must lie inside the file (else its read is EIO). A pair of `.index` + `.data`
    that cannot be read as one file is a problem of its own."""
    chunks, problems = 0, Problems()
    try:
        file = kv.open(shard)
        for minishard, index in kv.minishards(shard):
            if isinstance(index, CorruptChunk):
                problems.add(reason(index))
                continue
            for key, (start, stop) in index.items():
                if (home := kv.spec.shard_and_minishard(key)) != (shard, minishard):
                    problems.add(
                        f"chunk {key} is in minishard {minishard}, but its hash puts it in minishard {home[1]} of shard"
                        f" {home[0]}"
                    )
                elif not start <= stop <= file.size:
                    problems.add(f"chunk {key} data range [{start}, {stop}) lies outside the file")
                else:
                    chunks += 1
    except CorruptChunk as e:  # the shard index itself, or a pair
        problems.add(reason(e))
    return chunks, problems


def check_zarr(array: ZarrArray, path: str) -> tuple[int, Problems]:
    """The listing's own walk, told to verify every entry: any bad index level makes the shard unreadable."""
    problems = Problems()
    try:
        return len(array.stored(array.store.open(path), verify=True)), problems
    except CorruptChunk as e:
        problems.add(reason(e))
        return 0, problems


def reason(e: CorruptChunk) -> str:
    """What is wrong, in the words the mount would log, without the shard's name (the line gives it)."""
    return e.why if e.key == "?" else f"{e.key}: {e.why}"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
