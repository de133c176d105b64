"""Shared test helpers: composing configs in-process and running align's CLIs as subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Never touch the network from tests (LANDMINES 25), keep W&B local, keep thread counts CI-sized.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")


def run_cli(module: str, *args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m <module> args...` and return the completed process (text output)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def compose():
    from align.cli import compose as _compose

    return _compose
