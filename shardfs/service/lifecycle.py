"""What a long-lived mount needs besides FUSE: systemd readiness, signals, and its figures for operators.

- systemd: `READY=1` once the mount is live and `STOPPING=1` on the way out (sd_notify, via cysystemd).
- SIGHUP drops every cache, for a source rewritten in place; SIGUSR1 toggles DEBUG logging.
- `shardfs stats MOUNTPOINT` reads the figures from a socket in the daemon's runtime directory
  (shardfs/service/stats_socket.py): no file in the mount for `cp -r` to copy.
- `--metrics HOST:PORT` serves the same figures to Prometheus.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cysystemd.daemon import Notification, notify
from prometheus_client import CONTENT_TYPE_LATEST

from shardfs.errors import ServiceError
from shardfs.tree import Tree

log = logging.getLogger("shardfs")

SIGNALS = {signal.SIGHUP, signal.SIGUSR1}
ANSWER_INTERVAL = 0.01  # seconds between two builds of the figures (each ~0.3 ms of the GIL): at most 3% of it
METRICS_CONNECTIONS = 8  # --metrics connections served at once; more are closed at once
IDLE_TIMEOUT = 5.0  # seconds a --metrics connection may wait on its client


def tell_systemd(state: Notification) -> None:
    """sd_notify, when run by systemd as Type=notify; otherwise nothing."""
    if os.environ.get("NOTIFY_SOCKET"):
        answer = notify(state, return_exceptions=True)  # sd_notify's count of messages sent, or the exception
        if isinstance(answer, BaseException):
            log.warning("could not tell systemd %s: %s", state.name, answer, extra={"event": "sd_notify"})


def block_signals() -> None:
    """Block SIGHUP and SIGUSR1 in the calling thread, and so in every thread started from it after: call it
    first thing in the daemon, before anything starts a thread (obstore's runtime, the FUSE session), so
    that only handle_signals' thread ever takes them. A thread that did not block them would run their
    default action: end the process."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


# The trees this process serves, for SIGHUP: signals are the process's, whatever number of mounts it serves.
_served: weakref.WeakSet[Tree] = weakref.WeakSet()
_handling = threading.Lock()
_listening = threading.Event()  # set once the signal thread is started


def handle_signals(tree: Tree) -> Callable[[], None]:
    """Take SIGHUP and SIGUSR1 in one thread of the process, started with its first mount: SIGHUP drops every
    cache of every mount served, SIGUSR1 toggles DEBUG. Returns what leaves tree out again, once unmounted."""
    block_signals()  # idempotent; already done where the daemon began
    with _handling:
        _served.add(tree)
        first = not _listening.is_set()
        _listening.set()
    if first:
        base_level = logging.getLogger().level

        def wait() -> None:
            while True:
                if signal.sigwait(SIGNALS) == signal.SIGHUP:
                    for served in list(_served):
                        served.drop_caches()
                    log.warning("SIGHUP: caches dropped", extra={"event": "caches_dropped"})
                else:
                    root = logging.getLogger()
                    level = base_level if root.level == logging.DEBUG else logging.DEBUG
                    root.setLevel(level)
                    log.warning("SIGUSR1: log level %s", logging.getLevelName(level), extra={"event": "log_level"})

        threading.Thread(target=wait, name="shardfs-signals", daemon=True).start()
    return lambda: _served.discard(tree)


class Paced:
    """figures(), built at most once per ANSWER_INTERVAL whoever asks: any local user can connect to the
    stats socket or the metrics port, and a flood of them must wait, not take the GIL from the readers."""

    def __init__(self, figures: Callable[[], bytes], interval: float = ANSWER_INTERVAL) -> None:
        self.figures, self.interval = figures, interval
        self._lock = threading.Lock()
        self._next = 0.0

    def __call__(self) -> bytes:
        with self._lock:
            wait = self._next - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._next = time.monotonic() + self.interval
            return self.figures()


class _MetricsServer(ThreadingHTTPServer):
    """A thread per connection, but at most METRICS_CONNECTIONS of them: one more is closed unanswered."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], figures: Callable[[], bytes]) -> None:
        self.figures = figures
        self._slots = threading.BoundedSemaphore(METRICS_CONNECTIONS)
        super().__init__(address, _MetricsHandler)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _MetricsHandler(BaseHTTPRequestHandler):
    """GET answers the figures; a client silent for IDLE_TIMEOUT is dropped (HTTP/1.0: one request each)."""

    timeout = IDLE_TIMEOUT
    server: _MetricsServer

    def do_GET(self) -> None:
        body = self.server.figures()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # scrapes are not news; a flood of them must not flood the log


def serve_metrics(address: tuple[str, int], figures: Callable[[], bytes]) -> None:
    """Prometheus' text format over HTTP at address, from a thread of its own."""
    try:
        server = _MetricsServer(address, figures)
    except OSError as e:
        raise ServiceError(f"--metrics {address[0]}:{address[1]}: cannot listen ({e.strerror})") from e
    threading.Thread(target=server.serve_forever, name="shardfs-metrics", daemon=True).start()
    log.info("metrics at http://%s:%d/metrics", *address)
