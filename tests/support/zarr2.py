"""zarr-python 2.18 (the 2022 sharding draft and the OME-Zarr 0.4 readers), run from its own environment,
.venv-zarr2, made by scripts/setup."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.support.daemons import REPO

VENV = REPO / ".venv-zarr2" / "bin" / "python"


ENV = {**os.environ, "ZARR_V3_EXPERIMENTAL_API": "1", "ZARR_V3_SHARDING": "1", "PYTHONWARNINGS": "ignore"}


def run(script: str, *args: Path) -> str:
    """The script run by zarr-python 2.18's interpreter with args; its stdout."""
    if not VENV.exists():
        pytest.fail(f"{VENV} is missing: run scripts/setup, which makes the zarr-python 2.18 environment")
    done = subprocess.run(
        [VENV, "-c", textwrap.dedent(script), *map(str, args)], env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
