"""The CLI as a user runs it, in a subprocess, and what it says: its command line, its one-line errors, a
mount's handle and log, and Prometheus text as figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

SHARDFS = [sys.executable, "-m", "shardfs"]


def shardfs(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDFS, *map(str, args)], capture_output=True, text=True, timeout=60, check=check)


def one_line_error(done: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    """Exit status, a single line on stderr holding each of words, and no traceback."""
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def scrape(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text (`shardfs stats --prometheus`, `--metrics`) as {(name, labels): value}."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class Mount:
    def __init__(self, path: Path, log: Path) -> None:
        self.path, self.log = path, log

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""
