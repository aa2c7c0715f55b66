"""What a long-lived mount needs besides FUSE: systemd readiness, signals, and its figures for operators.

- systemd: `READY=1` once the mount is live and `STOPPING=1` on the way out (sd_notify, via cysystemd).
- SIGHUP drops every cache, for a source rewritten in place; SIGUSR1 toggles DEBUG logging.
- `shardfs stats MOUNTPOINT` reads the figures from a socket in the daemon's runtime directory
  (shardfs/stats_socket.py): no file in the mount for `cp -r` to copy.
- `--metrics HOST:PORT` serves the same figures to Prometheus.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import prometheus_client
from cysystemd.daemon import Notification, notify

from shardfs import metrics
from shardfs.tree import Tree

log = logging.getLogger("shardfs")

SIGNALS = {signal.SIGHUP, signal.SIGUSR1}


class ServiceError(Exception):
    """A service part could not start; the message says why in one sentence."""


def tell_systemd(state: Notification) -> None:
    """sd_notify, when run by systemd as Type=notify; otherwise nothing."""
    if os.environ.get("NOTIFY_SOCKET"):
        error = notify(state, return_exceptions=True)
        if error is not None:
            log.warning("could not tell systemd %s: %s", state.name, error)


def block_signals() -> None:
    """Block SIGHUP and SIGUSR1 in the calling thread, and so in every thread started from it after: call it
    first thing in the daemon, before anything starts a thread (obstore's runtime, libfuse's workers), so
    that only handle_signals' thread ever takes them. A thread that did not block them would run their
    default action (SIGHUP and SIGUSR1 end the process) or libfuse's (SIGHUP ends the mount)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def handle_signals(tree: Tree) -> None:
    """Take SIGHUP and SIGUSR1 in one thread of ours: SIGHUP drops every cache, SIGUSR1 toggles DEBUG."""
    block_signals()  # idempotent; already done where the daemon began
    base_level = logging.getLogger().level

    def wait() -> None:
        while True:
            if signal.sigwait(SIGNALS) == signal.SIGHUP:
                tree.drop_caches()
                log.warning("SIGHUP: caches dropped", extra={"event": "caches_dropped"})
            else:
                root = logging.getLogger()
                level = base_level if root.level == logging.DEBUG else logging.DEBUG
                root.setLevel(level)
                log.warning("SIGUSR1: log level %s", logging.getLevelName(level), extra={"event": "log_level"})

    threading.Thread(target=wait, name="shardfs-signals", daemon=True).start()


def serve_metrics(address: tuple[str, int]) -> None:
    try:
        prometheus_client.start_http_server(address[1], address[0], registry=metrics.REGISTRY)
    except OSError as e:
        raise ServiceError(f"--metrics {address[0]}:{address[1]}: cannot listen ({e.strerror})") from e
    log.info("metrics at http://%s:%d/metrics", *address)
