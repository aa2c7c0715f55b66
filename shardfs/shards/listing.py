"""A listing's bound on index reads, and the reads it keeps in flight: no shard, however large its index
claims to be, stalls `ls` unboundedly, and the reads run a few at a time in the store's pool while the
names come out in one order."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

T = TypeVar("T")

LISTING_BLOCK = 1 << 20  # bytes of shard index read at a time while listing
LISTING_BUDGET = 64 << 20  # index bytes a listing may read without listing a name (see ListingBudget)
LISTING_READ = 4 << 10  # the least a minishard index read costs it, and what a name listed gives back


class BudgetSpent(Exception):
    """A listing has read all the index it may: the rest of the directory is not listed."""

    def __init__(self, shard: str) -> None:
        super().__init__(shard)
        self.shard = shard


@dataclass
class ListingBudget:
    """The index one listing may read without listing a name, so that no shard (a remote one claiming a
    256 GiB shard index, which no hole-skipping can shorten) stalls `ls` unboundedly: every shard index byte
    read counts, and every minishard index read at least LISTING_READ (a request's worth); each name listed
    gives LISTING_READ back, up to the whole budget. A real directory lists long before it runs out, however
    large; one that holds too little for what it makes us read stops, after a bounded number of requests."""

    left: int = LISTING_BUDGET

    def spend(self, nbytes: int, shard: str) -> None:
        """BudgetSpent, before the read, if nbytes is more than is left."""
        if nbytes > self.left:
            raise BudgetSpent(shard)
        self.left -= nbytes

    def refund(self, nbytes: int) -> None:
        self.left = min(self.left + nbytes, LISTING_BUDGET)


class Read(NamedTuple):
    """One step of reading a shard's indexes for a listing: cost, the index bytes it reads (spent from the
    listing's budget before it is taken); call, the read, if it is one to run (None: the caller reads)."""

    cost: int
    call: Callable[[], object] | None
    shard: str


def in_order(pool: Executor | None, at_once: int, reads: Iterator[Read], budget: ListingBudget) -> Iterator[T]:
    """The calls of reads run in pool, up to at_once at a time, their results yielded in the order of reads
    (in this thread, one by one, without a pool). Each read's cost is taken from budget before its call is
    submitted, once the results before it have been yielded if it does not fit (their names give back): a
    listing stops where one reading one index at a time would (BudgetSpent)."""
    pending: deque[Future[T]] = deque()
    try:
        for read in reads:
            while pending and (len(pending) >= at_once or read.cost > budget.left):
                yield pending.popleft().result()
            budget.spend(read.cost, read.shard)
            if read.call is None:
                continue
            if pool is None:
                yield read.call()  # type: ignore[misc]
            else:
                pending.append(pool.submit(read.call))  # type: ignore[arg-type]
        while pending:
            yield pending.popleft().result()
    finally:  # a listing ended early: what is being read finishes, the rest is not read (the pool is shared)
        for future in pending:
            future.cancel()
