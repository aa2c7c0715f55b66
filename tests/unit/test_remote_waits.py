"""A remote call for a request that may be interrupted runs in one of the waiters' threads (stores/remote._waited),
kept for the next call. Those threads are the process's: a process that forks (the CLI forks its daemon) must
not leave the child queueing its calls for the parent's threads, which the child does not have."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from shardfs.request import Request
from shardfs.stores import remote


def test_a_forked_process_calls_on_waiters_of_its_own() -> None:
    assert remote._waited(lambda: 1, Request(1)) == 1  # a waiter's thread made, and kept idle
    pid = os.fork()
    if pid == 0:  # the child: its call either runs, or queues for a thread that is not there
        os._exit(remote._waited(lambda: 7, Request(2)))
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid, "the child's call waited 10 s for a waiter's thread it does not have"
    assert os.waitstatus_to_exitcode(done[1]) == 7


def test_a_call_queued_behind_busy_waiters_is_interrupted_there_and_never_made(monkeypatch) -> None:
    """Past WAITERS calls at once (those given up on that a hung server keeps), a call queues: its request still
    stops waiting when interrupted, and the call is dropped, not made once a waiter is free."""
    waiters = ThreadPoolExecutor(1)
    monkeypatch.setattr(remote, "_waiters", waiters)
    hung = threading.Event()
    waiters.submit(hung.wait)  # the one waiter, kept by a hung call
    asked: list[int] = []
    request = Request(3)
    outcome: list[BaseException] = []
    waiting = threading.Thread(target=lambda: _outcome_of(lambda: remote._waited(lambda: asked.append(1), request),
                                                          outcome))  # fmt: skip
    waiting.start()
    while not waiters._work_queue.qsize():  # the call queued
        time.sleep(0.001)
    request.interrupt()
    waiting.join(10)
    assert not waiting.is_alive() and isinstance(outcome[0], InterruptedError)
    hung.set()
    waiters.shutdown(wait=True)
    assert asked == []


def _outcome_of(call, outcome: list[BaseException]) -> None:
    try:
        call()
    except BaseException as e:
        outcome.append(e)
